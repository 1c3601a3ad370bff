"""Idempotency-Key middleware for WSGI apps (Flask, or any other), on a blocking connection
(psycopg 3 or psycopg2).  idempo.flask wraps it for Flask; behaviour: idempo.http.

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, routes={...}, connection=connect('dbname=shop'))

The handler finds its Context in environ['idempo.context'] (idempo.flask.current() in Flask).
"""
from __future__ import annotations

import contextlib
import io
from typing import Any, Callable, ContextManager, Dict, Union

from ._sync import Runner
from .http import (MAX_BODY_BYTES, Refusal, Reply, Route, Routes, cgi_headers, connection_closed, connection_lost,
                   problem, serve, unavailable)

ENVIRON_KEY = 'idempo.context'


def connect(conninfo: str = '', **kwargs) -> Callable[[], ContextManager[Any]]:
    """A connection factory: one autocommit psycopg 3 connection per request (use a pool in
    production: psycopg_pool's ConnectionPool.connection fits `connection=` as it is)."""
    import psycopg

    @contextlib.contextmanager
    def connection():
        conn = psycopg.connect(conninfo, autocommit=True, **kwargs)
        try:
            yield conn
        finally:
            conn.close()
    return connection


def _status_line(status: int) -> str:
    from http import HTTPStatus
    try:
        return f'{status} {HTTPStatus(status).phrase}'
    except ValueError:
        return f'{status} Unknown'


def send_reply(start_response, reply: Reply):
    headers = [(n, v) for n, v in reply.headers if n != 'content-length']
    headers.append(('content-length', str(len(reply.body))))
    start_response(_status_line(reply.status), headers)
    return [reply.body]


class IdempotencyMiddleware:
    def __init__(self, app, *, routes: Union[Dict[str, Route], Routes], connection: Callable[[], ContextManager],
                 max_body: int = MAX_BODY_BYTES):
        self.app = app
        self.routes = Routes.of(routes)
        self.connection = connection
        self.max_body = max_body
        self.version = None

    def __call__(self, environ, start_response):
        route = self.routes.match(environ['REQUEST_METHOD'], environ.get('PATH_INFO', ''))
        if route is None:
            return self.app(environ, start_response)
        length = environ.get('CONTENT_LENGTH') or '0'
        if not length.isdigit():
            return send_reply(start_response, problem(400, 'bad-length', 'Bad Content-Length', length, docs=route.docs))
        if not environ.get('CONTENT_LENGTH') and environ.get('wsgi.input_terminated'):
            # a chunked body (no Content-Length): the server ends the stream, so read to its end;
            # read as empty, it was left out of the fingerprint and the app saw no body
            body = environ['wsgi.input'].read(self.max_body + 1)
            length = str(len(body))
        else:
            body = None
        if int(length) > self.max_body:
            return send_reply(start_response, problem(413, 'too-large', 'Request body too large',
                                                      f'At most {self.max_body} bytes.', docs=route.docs))
        if body is None:
            body = environ['wsgi.input'].read(int(length)) if int(length) else b''
        query = environ.get('QUERY_STRING', '')
        path = environ.get('PATH_INFO', '') + ('?' + query if query else '')
        headers = cgi_headers(environ)
        try:
            info, key = Routes.prepare(route, environ['REQUEST_METHOD'], path, headers, body)
        except Refusal as refusal:
            return send_reply(start_response, refusal.reply)

        # A connection lost before the app ran (a pooled connection left stale by a restart:
        # nothing was claimed, nothing called) is tried once more on another; lost again, or
        # after the app ran, the answer is 503 + Retry-After, never a 500.
        for tries_left in (1, 0):
            had, started, lost = False, [], None
            try:
                with self.connection() as conn:
                    had = True
                    runner = Runner(conn)
                    runner.version = self.version        # checked on the first connection: once per app

                    def app(ctx):
                        started.append(True)
                        environ[ENVIRON_KEY] = ctx
                        environ['wsgi.input'] = io.BytesIO(body)
                        return self._run_app(environ)

                    try:
                        reply = serve(runner, conn, route, info, key, app)
                        if reply.status >= 500 and connection_closed(runner.raw):
                            reply = unavailable(route)     # the framework's 500 for the view's lost connection
                    except Exception as err:
                        # asked here, before the factory closes the connection (connect()'s does);
                        # runner.raw: the driver's, under a wrapper (SQLAlchemy)
                        if not connection_lost(err, runner.raw):
                            raise
                        lost = err
                    self.version = runner.version
            except Exception as err:
                if had or not connection_lost(err, None):     # none to be had: a refused connect, a pool timeout
                    raise
                lost = err
            if lost is None:
                break
            if started or not tries_left:
                reply = unavailable(route)
                break
        return send_reply(start_response, reply)

    def _run_app(self, environ) -> Reply:
        got = {}

        def start_response(status, headers, exc_info=None):
            got['status'], got['headers'] = int(status.split(' ', 1)[0]), headers
            return lambda data: got.setdefault('written', []).append(data)

        result = self.app(environ, start_response)
        try:
            body = b''.join([*got.get('written', []), *result])
        finally:
            close = getattr(result, 'close', None)
            if close:
                close()
        return Reply(got['status'], [(n.lower(), v) for n, v in got['headers']], body)
