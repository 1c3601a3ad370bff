"""The shop as a Flask app with idempo.flask."""
import os

from flask import Flask, jsonify, request

from idempo.flask import Idempotency, connect, current

import common

app = Flask(__name__)
APP_NAME = os.environ.get('APP_NAME', 'idempo-shop')
if common.POOL_SIZE:
    from psycopg_pool import ConnectionPool
    connection = ConnectionPool(kwargs={'application_name': APP_NAME}, min_size=common.POOL_SIZE,
                                max_size=common.POOL_SIZE).connection
else:
    connection = connect(application_name=APP_NAME)
Idempotency(app, routes=common.ROUTES, connection=connection)


@app.post('/orders')
def create_order():
    body = request.get_json()
    if body['customer'] == 'nobody':       # a 4xx the handler decided: stored
        return jsonify({'detail': 'no such customer'}), 404
    if common.lose_connection(body, current().key):
        current().conn.execute(common.TERMINATE_SQL)
    order = current().conn.execute(common.ORDER_SQL, common.order_args(body)).fetchone()
    if body['customer'].startswith('flaky'):   # a 5xx after a write: not stored, the write rolled back
        return jsonify({'detail': 'try again'}), 503
    return jsonify(common.row(common.ORDER_COLUMNS, order)), 201, {'x-order-handler': 'flask'}


@app.post('/reservations')
def reserve():
    body = request.get_json()
    (rid,) = current().conn.execute(common.ORDER_SQL, ['reservation', f"line-{body['line']}", 1]).fetchone()[:1]
    return jsonify({'id': rid}), 201


@app.post('/payments')
def pay():
    body, ctx = request.get_json(), current()
    try:
        charge = common.charge_card(body, ctx.provider_key)
    except Exception:
        slug, title, detail = common.PAYMENT_FAILED
        return jsonify({'type': f'{common.DOCS}#{slug}', 'title': title, 'status': 502, 'detail': detail}), 502, \
            {'content-type': 'application/problem+json'}
    ctx.begin()                    # the payment row and complete() commit together
    payment = ctx.conn.execute(common.PAYMENT_SQL, common.payment_args(body, charge)).fetchone()
    return jsonify(common.row(common.PAYMENT_COLUMNS, payment)), 201


@app.before_request
def authenticate():
    # an auth check before the view: a refusal here never reached it, and its key is freed
    if request.path == '/transfers' and 'Authorization' not in request.headers:
        return jsonify({'detail': 'log in first'}), 401


@app.post('/transfers')
def transfer():
    status, body = common.transfer(request.get_json())
    return jsonify(body), status
