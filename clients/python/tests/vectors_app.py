"""The app of clients/http-vectors.json on one framework, on 127.0.0.1 (a free port); prints
"listening on URL".  usage: vectors_app.py asgi|flask|django   (PGHOST, PGPORT, PGUSER, PGDATABASE)

POST /orders (one transaction) and POST /payments (calls_out): the status is the JSON body's
reply_status (default 201), the body a new random id, plus the header x-vec: handler."""
import json
import os
import socket
import sys
import uuid

from idempo.http import Route

ROUTES = {'/orders': Route('vec.orders'), '/payments': Route('vec.payments', calls_out=True)}


def answer(body: bytes):
    try:
        status = json.loads(body).get('reply_status', 201)
    except (ValueError, AttributeError):
        status = 201
    return status, json.dumps({'id': str(uuid.uuid4())})


def asgi_app():
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route as Path

    from idempo.asgi import IdempotencyMiddleware, connect

    async def endpoint(request):
        status, text = answer(await request.body())
        return Response(text, status, headers={'x-vec': 'handler'}, media_type='application/json')
    app = Starlette(routes=[Path('/orders', endpoint, methods=['POST']), Path('/payments', endpoint, methods=['POST'])])
    app.add_middleware(IdempotencyMiddleware, routes=ROUTES, connection=connect())
    return app


def flask_app():
    from flask import Flask, Response, request

    from idempo.flask import Idempotency, connect
    app = Flask(__name__)

    def endpoint():
        status, text = answer(request.get_data())
        return Response(text, status, headers={'x-vec': 'handler'}, content_type='application/json')
    app.add_url_rule('/orders', 'orders', endpoint, methods=['POST'])
    app.add_url_rule('/payments', 'payments', endpoint, methods=['POST'])
    Idempotency(app, routes=ROUTES, connection=connect())
    return app


def django_app():
    import django
    from django.conf import settings
    settings.configure(
        DEBUG=False, ALLOWED_HOSTS=['127.0.0.1'], ROOT_URLCONF=__name__, SECRET_KEY='vectors',
        MIDDLEWARE=['idempo.django.IdempotencyMiddleware'], IDEMPO_ROUTES=ROUTES,
        DATABASES={'default': {'ENGINE': 'django.db.backends.postgresql', 'NAME': os.environ['PGDATABASE'],
                               'HOST': os.environ.get('PGHOST', ''), 'PORT': os.environ.get('PGPORT', ''),
                               'USER': os.environ.get('PGUSER', '')}},
        USE_TZ=True)
    django.setup()
    from django.core.wsgi import get_wsgi_application
    from django.http import HttpResponse
    from django.urls import path
    from django.views.decorators.csrf import csrf_exempt

    @csrf_exempt
    def endpoint(request):
        status, text = answer(request.body)
        response = HttpResponse(text, status=status, content_type='application/json')
        response['x-vec'] = 'handler'
        return response
    global urlpatterns
    urlpatterns = [path('orders', endpoint), path('payments', endpoint)]
    return get_wsgi_application()


def main(kind):
    if kind == 'asgi':
        import asyncio
        import uvicorn
        app = asgi_app()
        sock = socket.socket()
        sock.bind(('127.0.0.1', 0))
        sock.listen(128)            # connections queue until uvicorn accepts them: none is refused
        print(f'listening on http://127.0.0.1:{sock.getsockname()[1]}', flush=True)
        asyncio.run(uvicorn.Server(uvicorn.Config(app, log_level='warning', lifespan='off')).serve(sockets=[sock]))
        return
    from werkzeug.serving import WSGIRequestHandler, make_server
    app = flask_app() if kind == 'flask' else django_app()

    class Quiet(WSGIRequestHandler):
        def log_request(self, *args, **kwargs):
            pass
    server = make_server('127.0.0.1', 0, app, threaded=True, request_handler=Quiet)
    print(f'listening on http://127.0.0.1:{server.server_port}', flush=True)
    server.serve_forever()


if __name__ == '__main__':
    main(sys.argv[1])
