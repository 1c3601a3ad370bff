"""python3 -m idempo.console --dsn DSN [--listen HOST:PORT] [--read-only] [--session-minutes N]"""
import argparse
import logging
import sys

from .app import Settings, create_app


def main(argv=None):
    p = argparse.ArgumentParser(prog='python3 -m idempo.console',
                                description='The review console of idempo (docs/console.md).')
    p.add_argument('--dsn', required=True,
                   help="libpq connection string of the database, without user or password: each person signs in as their own role")
    p.add_argument('--listen', default='127.0.0.1:8040', help='HOST:PORT to listen on (default 127.0.0.1:8040)')
    p.add_argument('--read-only', action='store_true', help='show, never decide')
    p.add_argument('--session-minutes', type=int, default=30,
                   help='a session ends after this many minutes without a request (default 30)')
    p.add_argument('--session-hours', type=int, default=8, help='and this many hours after sign-in (default 8)')
    p.add_argument('--https', action='store_true',
                   help='the console is served through HTTPS (a proxy): cookies are marked Secure')
    a = p.parse_args(argv)
    host, _, port = a.listen.rpartition(':')
    if not host or not port.isdigit():
        p.error('--listen takes HOST:PORT')
    settings = Settings(dsn=a.dsn, read_only=a.read_only, idle_seconds=a.session_minutes * 60,
                        max_seconds=a.session_hours * 3600, secure_cookies=a.https)
    logging.basicConfig(level=logging.INFO, format='%(asctime)s %(name)s %(message)s', stream=sys.stderr)
    import uvicorn
    # uvicorn's access log prints query strings (a searched key); the console logs its own lines
    uvicorn.run(create_app(settings), host=host.strip('[]'), port=int(port), access_log=False,
                log_level='info', proxy_headers=False)


if __name__ == '__main__':
    main()
