"""Starts one of the shop apps on 127.0.0.1 (a free port) and prints "listening on URL".
usage: serve.py asgi|flask|django   (PGHOST, PGPORT, PGUSER, PGDATABASE, PROVIDER_URL, APP_NAME,
IDEMPO_SHOP_POOL)"""
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(kind):
    if kind == 'asgi':
        import asyncio
        import uvicorn
        from asgi_app import app
        sock = socket.socket()
        sock.bind(('127.0.0.1', 0))
        print(f'listening on http://127.0.0.1:{sock.getsockname()[1]}', flush=True)
        # the lifespan runs the app's startup handlers (the pool's open, IDEMPO_SHOP_POOL)
        server = uvicorn.Server(uvicorn.Config(app, log_level='warning', lifespan='on' if os.environ.get('IDEMPO_SHOP_POOL') else 'off'))
        asyncio.run(server.serve(sockets=[sock]))
        return
    from werkzeug.serving import make_server, WSGIRequestHandler
    if kind == 'flask':
        from flask_app import app
    else:
        from django.core.wsgi import get_wsgi_application
        import django_app  # noqa: F401 -- configures settings
        app = get_wsgi_application()

    class Quiet(WSGIRequestHandler):
        def log_request(self, *args, **kwargs):
            pass
    server = make_server('127.0.0.1', 0, app, threaded=True, request_handler=Quiet)
    print(f'listening on http://127.0.0.1:{server.server_port}', flush=True)
    server.serve_forever()


if __name__ == '__main__':
    main(sys.argv[1])
