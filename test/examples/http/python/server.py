#!/usr/bin/env python3
"""A small shop API whose POSTs are made idempotent by the Idempotency-Key header, with the
idempo library's WSGI middleware (clients/python: idempo.wsgi; its behaviour: idempo.http):
  POST /orders    {customer, sku, qty}      one transaction: claim + INSERT + complete
  POST /payments  {order_id, amount_cents}  two transactions around a call to the payment
                                            provider (PROVIDER_URL), which honours our key
The standard library's WSGI server, psycopg 3, and idempo: nothing else.
Environment: PGHOST, PGPORT, PGDATABASE, PGUSER (libpq's names), PROVIDER_URL, HTTP_PORT
(0: any free port).  Checks the database first and exits with status 1 if it cannot use it; then
listens on 127.0.0.1 only and prints "listening on http://127.0.0.1:PORT".
"""
import json
import os
import sys
import urllib.request
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import psycopg

from idempo.http import Reply, Route, problem
from idempo.wsgi import ENVIRON_KEY, IdempotencyMiddleware, connect

PROVIDER_URL = os.environ.get('PROVIDER_URL', 'http://127.0.0.1:9099')
DOCS = 'https://example.com/docs/idempotency'     # point problem types at your API docs
APP_NAME = 'idempo-http-python'


def json_reply(status, value):
    return Reply(status, [('content-type', 'application/json')], json.dumps(value).encode())


def require_json_object(request):
    if not request.is_json:
        return problem(415, 'json-only', 'Send application/json', f'Got "{request.media_type}".', docs=DOCS)
    if not isinstance(request.json, dict):
        return problem(400, 'invalid-body', 'The body must be a JSON object', '', docs=DOCS)
    return None


def whole(value):
    """An integer column's value in JSON terms: 2 and 2.0 are the same number (and fingerprint)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and float(value).is_integer() and abs(value) < 2**31


def validate_order(request):
    """Runs before the claim: an invalid request uses up no key (as Stripe does)."""
    body = request.json
    return require_json_object(request) or (
        None if isinstance(body.get('customer'), str) and isinstance(body.get('sku'), str)
        and whole(body.get('qty')) and body['qty'] > 0
        else problem(400, 'invalid-order', 'Invalid order',
                     'Need customer and sku (strings) and qty (a positive integer).', docs=DOCS))


def validate_payment(request):
    body = request.json
    return require_json_object(request) or (
        None if whole(body.get('order_id')) and whole(body.get('amount_cents')) and body['amount_cents'] > 0
        else problem(400, 'invalid-payment', 'Invalid payment', 'Need order_id and amount_cents (positive integers).',
                     docs=DOCS))


# One scope per endpoint (schema.sql).  /payments calls out: its claim commits first and holds
# the key by its lease while the provider is called; a failure frees the key (on_error='retry',
# right because the provider honours our key; the default, 'doubt', leaves the attempt to its
# lease and a person or a verifier decides).
ROUTES = {
    '/orders': Route('http.orders', validate=validate_order, docs=DOCS),
    '/payments': Route('http.payments', calls_out=True, on_error='retry', validate=validate_payment, docs=DOCS),
}


def create_order(ctx, body):
    order = ctx.conn.execute('INSERT INTO shop.orders (customer, sku, qty) VALUES (%s, %s, %s) '
                             'RETURNING id, customer, sku, qty', [body['customer'], body['sku'], int(body['qty'])])
    return json_reply(201, dict(zip(('id', 'customer', 'sku', 'qty'), order.fetchone())))


def charge_card(body, provider_key):
    """The outside call.  Our key goes along, so a retried call returns the charge already made.
    urlopen raises on a non-2xx answer; the timeout is well inside the scope's 30 s lease."""
    data = json.dumps({'amount_cents': int(body['amount_cents']), 'reference': f"order-{int(body['order_id'])}"}).encode()
    call = urllib.request.Request(f'{PROVIDER_URL}/charges', data=data, method='POST', headers={
        'Content-Type': 'application/json', 'Idempotency-Key': provider_key})
    with urllib.request.urlopen(call, timeout=10) as answer:
        return json.load(answer)


def pay(ctx, body):
    try:
        charge = charge_card(body, ctx.provider_key)
    except Exception:
        return problem(502, 'upstream-failed', 'The payment provider did not answer',
                       'Nothing was recorded; retry with the same Idempotency-Key.', docs=DOCS)
    ctx.begin()                   # the payment row and complete() commit together
    payment = ctx.conn.execute('INSERT INTO shop.payments (order_id, amount_cents, charge_id) VALUES (%s, %s, %s) '
                               'RETURNING id, order_id, amount_cents, charge_id',
                               [int(body['order_id']), int(body['amount_cents']), charge['id']])
    return json_reply(201, dict(zip(('id', 'order_id', 'amount_cents', 'charge_id'), payment.fetchone())))


HANDLERS = {'/orders': create_order, '/payments': pay}


def shop(environ, start_response):
    """The app behind the middleware: it sees only requests the claim handed it."""
    handler = HANDLERS.get(environ.get('PATH_INFO', ''))
    if handler is None or environ['REQUEST_METHOD'] != 'POST':
        reply = problem(404, 'not-found', 'No such endpoint', environ.get('PATH_INFO', ''), docs=DOCS)
    else:
        ctx = environ[ENVIRON_KEY]
        body = json.loads(environ['wsgi.input'].read(int(environ.get('CONTENT_LENGTH') or 0)))
        try:
            reply = handler(ctx, body)
        except Exception as err:
            # not stored (5xx): the one-transaction form rolls back, the calls-out form fails
            # the attempt retryable; either way the retry runs afresh
            print(f"POST {environ['PATH_INFO']} failed: {err}", file=sys.stderr)
            reply = problem(500, 'internal', 'Internal error', 'Nothing was stored; retry with the same Idempotency-Key.',
                            docs=DOCS)
    start_response(f'{reply.status} -', reply.headers)
    return [reply.body]


# A connection per request keeps the example short; use psycopg_pool in production.
app = IdempotencyMiddleware(shop, routes=ROUTES, connection=connect(application_name=APP_NAME))


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_request(self, *args, **kwargs):
        pass                            # quiet; errors are printed above


def check_database():
    """Fail at start-up, loudly, rather than answer every request with 500: the database must be
    reachable, with schema.sql loaded (the shop's tables and both scopes)."""
    try:
        with psycopg.connect(autocommit=True, application_name=APP_NAME) as conn:
            conn.execute("SELECT 'shop.orders'::regclass, 'shop.payments'::regclass, "
                         "idempo.lookup('http.orders', 'start-up check'), idempo.lookup('http.payments', 'start-up check')")
    except psycopg.Error as err:
        user = os.environ.get('PGUSER') or os.environ.get('USER', '')
        where = (f"host={os.environ.get('PGHOST') or '/var/run/postgresql'} port={os.environ.get('PGPORT') or 5432} "
                 f"dbname={os.environ.get('PGDATABASE') or user} user={user}")
        print(f'cannot use the database ({where}): {str(err).strip()}\n'
              'Set PGHOST, PGPORT, PGDATABASE and PGUSER, and load schema.sql into that database.', file=sys.stderr)
        sys.exit(1)


def main():
    check_database()
    server = make_server('127.0.0.1', int(os.environ.get('HTTP_PORT', '8080')), app, server_class=Server,
                         handler_class=QuietHandler)
    print(f'listening on http://127.0.0.1:{server.server_address[1]}', flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == '__main__':
    main()
