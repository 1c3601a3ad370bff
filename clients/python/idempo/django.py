"""Idempotency-Key middleware for Django, on Django's own connection: the claim, the view's
ORM writes and complete() commit in one transaction.atomic() block.

settings.py:
    MIDDLEWARE = [..., 'django.middleware.csrf.CsrfViewMiddleware', ...auth middlewares...,
                  'idempo.django.IdempotencyMiddleware']
    IDEMPO_ROUTES = {'/orders': Route('http.orders'), '/payments': Route('http.payments', calls_out=True)}
    IDEMPO_DATABASE = 'default'            # optional

A view finds its Context as request.idempo; in calls_out routes it calls request.idempo.begin()
after the outside call, before its writes.  Behaviour and the storing rule: idempo.http.

A request refused before its view ran frees its key (a calls_out route's attempt is failed
retryable, whatever on_error says): Django runs the middlewares' process_view in MIDDLEWARE order
after URL resolution and stops at the first that answers (CsrfViewMiddleware's 403), so ours,
which marks the view started, runs only if every middleware listed above it let the request
through.  List it after CsrfViewMiddleware and the auth middlewares: listed before them, their
refusal is taken for the view's and left to the lease (safe, but the key waits for a person).
A 404 from URL resolution never reaches process_view: freed too.
"""
from __future__ import annotations

from . import _flow as F
from ._sync import Runner
from .http import (Context, Refusal, Reply, Routes, cgi_headers, connection_closed, connection_lost, serve,
                   unavailable)


class DjangoRunner(Runner):
    """Transactions as transaction.atomic() blocks, so that Django knows of them (the ORM's own
    atomic blocks nest as savepoints, on_commit hooks run)."""

    def __init__(self, alias):
        from django.db import connections
        self.alias = alias
        super().__init__(connections[alias])
        self.blocks = []

    def begin(self):
        from django.db import transaction
        block = transaction.atomic(using=self.alias)
        block.__enter__()
        self.blocks.append(block)

    def commit(self):
        self.blocks.pop().__exit__(None, None, None)

    def rollback(self):
        if not self.blocks:
            return
        block = self.blocks.pop()
        try:
            err = RuntimeError('rolled back by idempo')
            block.__exit__(RuntimeError, err, None)
        except Exception:
            pass

    def beat_once(self, op):
        # From the Heartbeat thread: transaction.atomic() there would take that thread's own
        # connection, so the statement goes to the driver's; no block of ours is open while the
        # handler calls out (Django's autocommit: the statement commits by itself).
        with self.lock:
            self.execute(F.HEARTBEAT_SQL, (op.scope, op.key, op.attempt, op.extend))
            if not getattr(self.raw, 'autocommit', False):
                self.raw.commit()


def _django_reply(response) -> Reply:
    headers = [(n.lower(), v) for n, v in response.items()]
    for cookie in response.cookies.values():
        headers.append(('set-cookie', cookie.output(header='').strip()))
    body = b''.join(response.streaming_content) if getattr(response, 'streaming', False) else response.content
    return Reply(response.status_code, headers, body)


def _http_response(reply: Reply):
    from django.http import HttpResponse
    response = HttpResponse(reply.body, status=reply.status)
    for name, value in reply.headers:
        if name == 'set-cookie':
            response.cookies.load(value)
        elif name != 'content-length':
            response[name] = value
    return response


class IdempotencyMiddleware:
    def __init__(self, get_response):
        from django.conf import settings
        self.get_response = get_response
        routes = getattr(settings, 'IDEMPO_ROUTES', {})
        self.routes = Routes.of(routes)
        self.alias = getattr(settings, 'IDEMPO_DATABASE', 'default')

    def __call__(self, request):
        route = self.routes.match(request.method, request.path_info)
        if route is None:
            return self.get_response(request)
        try:
            info, key = Routes.prepare(route, request.method, request.get_full_path(), cgi_headers(request.META),
                                       request.body)
        except Refusal as refusal:
            return _http_response(refusal.reply)
        # A connection lost before the view ran (a persistent connection, CONN_MAX_AGE, left stale
        # by a restart: nothing was claimed, nothing called) is closed and tried once more on a
        # new one; lost again, or after the view ran, the answer is 503 + Retry-After, never a 500.
        for tries_left in (1, 0):
            runner, started = None, []

            def app(ctx):
                started.append(True)
                request.idempo = ctx
                ctx.started = False             # until process_view below says otherwise
                return _django_reply(self.get_response(request))
            try:
                runner = DjangoRunner(self.alias)
                reply = serve(runner, runner.conn, route, info, key, app)
                # the driver's connection the request began on (Django may have made another)
                if reply.status >= 500 and connection_closed(runner.raw):
                    self._close()
                    reply = unavailable(route)        # Django's 500 for the view's lost connection
                return _http_response(reply)
            except Exception as err:
                if not connection_lost(err, runner.raw if runner is not None else None):
                    raise
                self._close()
                if started or not tries_left:
                    return _http_response(unavailable(route))

    def _close(self):
        from django.db import connections
        try:
            connections[self.alias].close()
        except Exception:
            pass

    def process_view(self, request, view_func, view_args, view_kwargs):
        # Django's base handler calls this after the process_view of the middlewares listed
        # above this one let the request through, just before the view
        ctx = getattr(request, 'idempo', None)
        if isinstance(ctx, Context):
            ctx.started = True
        return None
