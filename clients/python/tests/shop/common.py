"""What the three shop apps share: the routes (one per endpoint), the validators (run before the
claim, so an invalid request uses up no key), and the call to the payment provider."""
import json
import os
import urllib.request

from idempo.http import Route, problem

PROVIDER_URL = os.environ.get('PROVIDER_URL', 'http://127.0.0.1:9099')
DOCS = 'https://example.com/docs/idempotency'


def whole(value):
    """An integer column's value in JSON terms: 2 and 2.0 are the same number (and fingerprint)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and float(value).is_integer() and abs(value) < 2**31


def json_object(request):
    if not request.is_json:
        return problem(415, 'json-only', 'Send application/json', f'Got "{request.media_type}".', docs=DOCS)
    if not isinstance(request.json, dict):
        return problem(400, 'invalid-body', 'The body must be a JSON object', '', docs=DOCS)
    return None


def validate_order(request):
    body = request.json
    return json_object(request) or (
        None if isinstance(body.get('customer'), str) and isinstance(body.get('sku'), str)
        and whole(body.get('qty')) and body['qty'] > 0
        else problem(400, 'invalid-order', 'Invalid order',
                     'Need customer and sku (strings) and qty (a positive integer).', docs=DOCS))


def validate_payment(request):
    body = request.json
    return json_object(request) or (
        None if whole(body.get('order_id')) and whole(body.get('amount_cents')) and body['amount_cents'] > 0
        else problem(400, 'invalid-payment', 'Invalid payment',
                     'Need order_id and amount_cents (positive integers).', docs=DOCS))


def tenant(request):
    """Keys are per client: here the X-Client header stands for the authenticated client."""
    return next((v for n, v in request.headers if n == 'x-client'), 'anonymous')


ROUTES = {
    '/orders': Route('http.orders', validate=validate_order, tenant=tenant, docs=DOCS),
    # the provider deduplicates by our key (charge_card sends it): a failed call may be retried
    '/payments': Route('http.payments', calls_out=True, on_error='retry', validate=validate_payment, tenant=tenant,
                       docs=DOCS),
    # the key from payload fields instead of a header: {"order_id", "line"}
    '/reservations': Route('http.orders', key_header=None, key_fields=('order_id', 'line'), docs=DOCS),
    # calls_out with the default on_error='doubt', behind a check that runs before the view
    # (Django's CSRF check, Flask's before_request, a FastAPI dependency): see transfer()
    '/transfers': Route('http.payments', calls_out=True, docs=DOCS),
}

# What the check before /transfers' view wants: Authorization (Flask, FastAPI), or the CSRF
# cookie and the same token in X-CSRFToken (Django).
CSRF_TOKEN = 'k' * 64
CREDENTIALS = [('Authorization', 'Bearer shop'), ('Cookie', f'csrftoken={CSRF_TOKEN}'), ('X-CSRFToken', CSRF_TOKEN)]


def transfer(body):
    """/transfers' view, once its check let the request through: {"to": "blocked"} is refused by
    the view itself (403, not stored), {"to": "crash"} raises; otherwise 201.  -> (status, body)"""
    if body['to'] == 'crash':
        raise RuntimeError('the view failed after it started')
    if body['to'] == 'blocked':
        return 403, {'detail': 'this account may not receive transfers'}
    return 201, {'to': body['to']}

PAYMENT_FAILED = ('upstream-failed', 'The payment provider did not answer',
                  'Nothing was recorded; retry with the same Idempotency-Key.')


def charge_card(body, provider_key):
    """The outside call.  Our key goes along, so a retried call returns the charge already made.
    urlopen raises on a non-2xx answer; the timeout is well inside the scope's 30 s lease."""
    data = json.dumps({'amount_cents': int(body['amount_cents']), 'reference': f"order-{int(body['order_id'])}"}).encode()
    call = urllib.request.Request(f'{PROVIDER_URL}/charges', data=data, method='POST', headers={
        'Content-Type': 'application/json', 'Idempotency-Key': provider_key})
    with urllib.request.urlopen(call, timeout=10) as answer:
        return json.load(answer)


# customer "lost...": the view's connection is ended by the server (pg_terminate_backend of its
# own backend, as a restart would), once per key: the retry with the same key runs
LOST_KEYS = set()
TERMINATE_SQL = 'SELECT pg_terminate_backend(pg_backend_pid())'


def lose_connection(body, key):
    if body['customer'].startswith('lost') and key not in LOST_KEYS:
        LOST_KEYS.add(key)
        return True
    return False


# IDEMPO_SHOP_POOL=N: the app takes its connections from a psycopg_pool pool of N (asgi, flask)
POOL_SIZE = int(os.environ.get('IDEMPO_SHOP_POOL') or 0)


ORDER_SQL = 'INSERT INTO shop.orders (customer, sku, qty) VALUES (%s, %s, %s) RETURNING id, customer, sku, qty'
PAYMENT_SQL = ('INSERT INTO shop.payments (order_id, amount_cents, charge_id) VALUES (%s, %s, %s) '
               'RETURNING id, order_id, amount_cents, charge_id')


def order_args(body):
    return [body['customer'], body['sku'], int(body['qty'])]


def payment_args(body, charge):
    return [int(body['order_id']), int(body['amount_cents']), charge['id']]


def row(names, values):
    return dict(zip(names, values))


ORDER_COLUMNS = ('id', 'customer', 'sku', 'qty')
PAYMENT_COLUMNS = ('id', 'order_id', 'amount_cents', 'charge_id')
