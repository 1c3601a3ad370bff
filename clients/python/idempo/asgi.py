"""Idempotency-Key middleware for ASGI apps (Starlette, FastAPI), on psycopg 3's AsyncConnection.

    from idempo.asgi import IdempotencyMiddleware, connect
    from idempo.http import Route

    app.add_middleware(IdempotencyMiddleware, connection=connect('dbname=shop'),
                       routes={'/orders': Route('http.orders')})

    @app.post('/orders', status_code=201)
    async def create_order(order: Order, request: Request):
        conn = request.state.idempo.conn          # the claim's transaction: write here
        ...

The reply is held until the claim's transaction has committed (streamed replies are buffered).
Behaviour and the storing rule: idempo.http.
"""
from __future__ import annotations

import contextlib
from typing import Any, AsyncContextManager, Callable, Dict, Union

from . import aio
from . import _flow as F
from .http import MAX_BODY_BYTES, Refusal, Reply, Route, Routes, connection_lost, flow_for, problem, unavailable


def connect(conninfo: str = '', **kwargs) -> Callable[[], AsyncContextManager[Any]]:
    """A connection factory: one autocommit AsyncConnection per request (use a pool in
    production: psycopg_pool's AsyncConnectionPool.connection fits `connection=` as it is)."""
    import psycopg

    @contextlib.asynccontextmanager
    async def connection():
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        try:
            yield conn
        finally:
            await conn.close()
    return connection


async def _read_body(receive, limit):
    chunks, size = [], 0
    while True:
        message = await receive()
        if message['type'] == 'http.disconnect':
            return None
        chunk = message.get('body', b'')
        size += len(chunk)
        if size > limit:
            return False
        chunks.append(chunk)
        if not message.get('more_body', False):
            return b''.join(chunks)


async def send_reply(send, reply: Reply):
    headers = [(n.encode('latin-1'), v.encode('latin-1')) for n, v in reply.headers if n != 'content-length']
    headers.append((b'content-length', str(len(reply.body)).encode()))
    await send({'type': 'http.response.start', 'status': reply.status, 'headers': headers})
    await send({'type': 'http.response.body', 'body': reply.body})


def route_path(scope) -> str:
    """The path the app routes on: the ASGI path without the root path, as Starlette's
    get_route_path takes it.  Uvicorn from 0.26 (`--root-path /api`, behind a proxy) puts the root
    path in scope['path'] as the ASGI spec says: '/api/orders' matched no route '/orders', and
    the endpoint the app ran went unprotected."""
    path, root = scope['path'], scope.get('root_path') or ''
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == '/'):
        return path[len(root):] or '/'
    return path


class IdempotencyMiddleware:
    """routes: {path: Route} (or idempo.http.Routes); connection: a callable returning an async
    context manager that yields an AsyncConnection (connect(), or a pool's .connection)."""

    def __init__(self, app, *, routes: Union[Dict[str, Route], Routes], connection: Callable[[], AsyncContextManager],
                 max_body: int = MAX_BODY_BYTES):
        self.app = app
        self.routes = Routes.of(routes)
        self.connection = connection
        self.max_body = max_body
        self.version = None

    async def __call__(self, scope, receive, send):
        route = self.routes.match(scope['method'], route_path(scope)) if scope['type'] == 'http' else None
        if route is None:
            return await self.app(scope, receive, send)
        body = await _read_body(receive, self.max_body)
        if body is None:
            return                                   # the client went away
        if body is False:
            return await send_reply(send, problem(413, 'too-large', 'Request body too large',
                                                  f'At most {self.max_body} bytes.', docs=route.docs))
        query = scope.get('query_string', b'')
        path = scope.get('raw_path') or scope['path'].encode()
        path = path.decode('latin-1') + ('?' + query.decode('latin-1') if query else '')
        headers = [(n.decode('latin-1').lower(), v.decode('latin-1')) for n, v in scope['headers']]
        try:
            info, key = Routes.prepare(route, scope['method'], path, headers, body)
        except Refusal as refusal:
            return await send_reply(send, refusal.reply)

        # A connection lost before the app ran (a pooled connection left stale by a restart:
        # nothing was claimed, nothing called) is tried once more on another; lost again, or
        # after the app ran, the answer is 503 + Retry-After, never a 500.
        for tries_left in (1, 0):
            had, started, lost = False, False, None
            try:
                async with self.connection() as conn:
                    had = True
                    runner = aio.Runner(conn)
                    runner.version = self.version        # checked on the first connection: once per app

                    async def begin(ctx):
                        if not ctx.began:
                            await runner.do(F.HeartbeatStop())     # before the transaction opens on this connection
                            await runner.begin()
                            ctx.began = True

                    async def handler(ctx):
                        nonlocal started
                        started = True
                        ctx._begin = begin
                        scope.setdefault('state', {})['idempo'] = ctx
                        return await self._run_app(scope, receive, body)

                    try:
                        reply = await runner.run(flow_for(conn, route, info, key, handler))
                    except Exception as err:
                        # asked here, before the factory closes the connection (connect()'s does)
                        if not connection_lost(err, conn):
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
        await send_reply(send, reply)

    async def _run_app(self, scope, receive, body) -> Reply:
        sent_body = False

        async def replay_receive():
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {'type': 'http.request', 'body': body, 'more_body': False}
            return await receive()                     # waits for the disconnect

        start, chunks = {}, []

        async def capture(message):
            if message['type'] == 'http.response.start':
                start.update(message)
            elif message['type'] == 'http.response.body':
                chunks.append(message.get('body', b''))

        await self.app(scope, replay_receive, capture)
        if not start:
            raise RuntimeError('the app sent no response')
        headers = [(n.decode('latin-1').lower(), v.decode('latin-1')) for n, v in start.get('headers', [])]
        return Reply(start['status'], headers, b''.join(chunks))
