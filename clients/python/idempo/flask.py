"""Idempotency-Key for Flask: the WSGI middleware (idempo.wsgi) installed on the app, and the
request's Context as idempo.flask.current().

    from idempo.flask import Idempotency, current
    from idempo.http import Route

    Idempotency(app, routes={'/orders': Route('http.orders')}, connection=connect('dbname=shop'))

    @app.post('/orders')
    def create_order():
        conn = current().conn              # the claim's transaction: write here
        ...

Behaviour and the storing rule: idempo.http.  A request refused before its view ran (a
before_request function that returned a reply: an auth check's 401) frees its key: Flask calls
dispatch_request only when no before_request function answered, and the view's start is marked
there.
"""
from __future__ import annotations

from typing import Callable, ContextManager, Dict, Optional, Union

from .http import MAX_BODY_BYTES, Context, Route, Routes
from .wsgi import ENVIRON_KEY, IdempotencyMiddleware, connect

__all__ = ['Idempotency', 'current', 'connect']


class Idempotency:
    def __init__(self, app=None, *, routes: Union[Dict[str, Route], Routes], connection: Callable[[], ContextManager],
                 max_body: int = MAX_BODY_BYTES):
        self.routes, self.connection, self.max_body = routes, connection, max_body
        if app is not None:
            self.init_app(app)

    def init_app(self, app):
        app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, routes=self.routes, connection=self.connection,
                                             max_body=self.max_body)
        full_dispatch, dispatch = app.full_dispatch_request, app.dispatch_request

        def full_dispatch_request(*args, **kwargs):
            # this app, not another one mounted inside app.wsgi_app (DispatcherMiddleware), handles
            # the request: from here on it can tell whether its view started (None until then)
            ctx = current()
            if ctx is not None and ctx.started is None:
                ctx.started = False
            return full_dispatch(*args, **kwargs)

        def dispatch_request(*args, **kwargs):
            # full_dispatch_request calls this only when no before_request function answered
            from flask import request
            ctx = current()
            if ctx is not None and request.routing_exception is None:
                ctx.started = True
            return dispatch(*args, **kwargs)
        app.full_dispatch_request = full_dispatch_request
        app.dispatch_request = dispatch_request
        app.extensions['idempo'] = self


def current() -> Optional[Context]:
    """The idempo Context of the request being handled (None on a route that is not idempotent)."""
    from flask import request
    return request.environ.get(ENVIRON_KEY)
