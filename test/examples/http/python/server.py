#!/usr/bin/env python3
"""A small shop API whose POSTs are made idempotent by the Idempotency-Key header (see
idempotency.py):
  POST /orders    {customer, sku, qty}      one transaction: claim + INSERT + complete
  POST /payments  {order_id, amount_cents}  two transactions around a call to the payment
                                            provider (PROVIDER_URL), which honours our key
Environment: PGHOST, PGPORT, PGDATABASE, PGUSER (libpq's names), PROVIDER_URL, HTTP_PORT
(0: any free port).  Checks the database first and exits with status 1 if it cannot use it; then
listens on 127.0.0.1 only and prints "listening on http://127.0.0.1:PORT".
"""
import json
import os
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import psycopg

from idempotency import Refusal, Route, json_reply, problem, send, serve

PROVIDER_URL = os.environ.get('PROVIDER_URL', 'http://127.0.0.1:9099')


def require_json_object(request):
    if not request.is_json:
        return problem(415, 'json-only', 'Send application/json', f'Got "{request.media_type}".')
    if not isinstance(request.json, dict):
        return problem(400, 'invalid-body', 'The body must be a JSON object', '')
    return None


def whole(value):
    """An integer column's value in JSON terms: 2 and 2.0 are the same number (and fingerprint)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and float(value).is_integer() and abs(value) < 2**31


def validate_order(request):
    invalid = require_json_object(request)
    if invalid:
        return invalid
    body = request.json
    if isinstance(body.get('customer'), str) and isinstance(body.get('sku'), str) \
            and whole(body.get('qty')) and body['qty'] > 0:
        return None
    return problem(400, 'invalid-order', 'Invalid order',
                   'Need customer and sku (strings) and qty (a positive integer).')


def create_order(conn, request):
    body = request.json
    order = conn.execute('INSERT INTO shop.orders (customer, sku, qty) VALUES (%s, %s, %s) '
                         'RETURNING id, customer, sku, qty', [body['customer'], body['sku'], int(body['qty'])]).fetchone()
    return json_reply(201, dict(zip(('id', 'customer', 'sku', 'qty'), order)))


def validate_payment(request):
    invalid = require_json_object(request)
    if invalid:
        return invalid
    body = request.json
    if whole(body.get('order_id')) and whole(body.get('amount_cents')) and body['amount_cents'] > 0:
        return None
    return problem(400, 'invalid-payment', 'Invalid payment', 'Need order_id and amount_cents (positive integers).')


def charge_card(request, provider_key):
    """The outside call.  Our key goes along, so a retried call returns the charge already made.
    urlopen raises on a non-2xx answer; the timeout is well inside the scope's 30 s lease."""
    body = json.dumps({'amount_cents': int(request.json['amount_cents']),
                       'reference': f"order-{int(request.json['order_id'])}"}).encode()
    call = urllib.request.Request(f'{PROVIDER_URL}/charges', data=body, method='POST', headers={
        'Content-Type': 'application/json', 'Idempotency-Key': provider_key})
    with urllib.request.urlopen(call, timeout=10) as answer:
        return json.load(answer)


def record_payment(conn, request, charge):
    payment = conn.execute('INSERT INTO shop.payments (order_id, amount_cents, charge_id) VALUES (%s, %s, %s) '
                           'RETURNING id, order_id, amount_cents, charge_id',
                           [int(request.json['order_id']), int(request.json['amount_cents']), charge['id']]).fetchone()
    return json_reply(201, dict(zip(('id', 'order_id', 'amount_cents', 'charge_id'), payment)))


ROUTES = {
    '/orders': Route('http.orders', validate_order, handler=create_order),
    '/payments': Route('http.payments', validate_payment, call_out=charge_card, record=record_payment),
}


class ShopHandler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'       # keep-alive; every reply carries Content-Length

    def do_POST(self):
        route = ROUTES.get(urlsplit(self.path).path)
        try:
            if not route:
                self.close_connection = True      # its body was not read
                reply = problem(404, 'not-found', 'No such endpoint', self.path)
            else:
                # A connection per request keeps the example short; use psycopg_pool in production.
                with psycopg.connect(autocommit=True, application_name='idempo-http-python') as conn:
                    reply = serve(conn, route, self)
        except Refusal as refusal:
            reply = refusal.reply
        except Exception as err:
            print(f'POST {self.path} failed: {err}', file=sys.stderr)
            reply = problem(500, 'internal', 'Internal error', 'Nothing was stored; retry with the same Idempotency-Key.')
        send(self, reply)

    def log_message(self, format, *args):
        pass                            # quiet; errors are printed above


def check_database():
    """Fail at start-up, loudly, rather than answer every request with 500: the database must be
    reachable, with schema.sql loaded (the shop's tables and both scopes)."""
    try:
        with psycopg.connect(autocommit=True, application_name='idempo-http-python') as conn:
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
    server = ThreadingHTTPServer(('127.0.0.1', int(os.environ.get('HTTP_PORT', '8080'))), ShopHandler)
    server.daemon_threads = True
    print(f'listening on http://127.0.0.1:{server.server_address[1]}', flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == '__main__':
    main()
