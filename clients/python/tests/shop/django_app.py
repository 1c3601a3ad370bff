"""The shop as a Django project in one file, with idempo.django's middleware (Django's own
connection: psycopg2 under Django 3.2)."""
import json
import os

import django
from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

import common

settings.configure(
    DEBUG=False, ALLOWED_HOSTS=['127.0.0.1', 'localhost'], ROOT_URLCONF=__name__, SECRET_KEY='test',
    # after CsrfViewMiddleware, as docs/python.md says: a request its check refuses (403) never
    # reached the view, and its key is freed
    MIDDLEWARE=['django.middleware.csrf.CsrfViewMiddleware', 'idempo.django.IdempotencyMiddleware'],
    IDEMPO_ROUTES=common.ROUTES,
    DATABASES={'default': {'ENGINE': 'django.db.backends.postgresql', 'NAME': os.environ['PGDATABASE'],
                           'HOST': os.environ.get('PGHOST', ''), 'PORT': os.environ.get('PGPORT', ''),
                           'USER': os.environ.get('PGUSER', ''),
                           'OPTIONS': {'application_name': os.environ.get('APP_NAME', 'idempo-shop')}}},
    USE_TZ=True,
)
django.setup()


@csrf_exempt                       # a JSON API: the client is not a browser
def create_order(request):
    body = json.loads(request.body)
    if body['customer'] == 'nobody':       # a 4xx the handler decided: stored
        return JsonResponse({'detail': 'no such customer'}, status=404)
    with connection.cursor() as cur:
        if common.lose_connection(body, request.idempo.key):
            cur.execute(common.TERMINATE_SQL)
        cur.execute(common.ORDER_SQL, common.order_args(body))
        order = cur.fetchone()
    if body['customer'].startswith('flaky'):   # a 5xx after a write: not stored, the write rolled back
        return JsonResponse({'detail': 'try again'}, status=503)
    response = JsonResponse(common.row(common.ORDER_COLUMNS, order), status=201)
    response['x-order-handler'] = 'django'
    return response


@csrf_exempt
def reserve(request):
    body = json.loads(request.body)
    with connection.cursor() as cur:
        cur.execute(common.ORDER_SQL, ['reservation', f"line-{body['line']}", 1])
        return JsonResponse({'id': cur.fetchone()[0]}, status=201)


@csrf_exempt
def pay(request):
    body, ctx = json.loads(request.body), request.idempo
    try:
        charge = common.charge_card(body, ctx.provider_key)
    except Exception:
        slug, title, detail = common.PAYMENT_FAILED
        return JsonResponse({'type': f'{common.DOCS}#{slug}', 'title': title, 'status': 502, 'detail': detail},
                            status=502, content_type='application/problem+json')
    ctx.begin()                    # the payment row and complete() commit together
    with connection.cursor() as cur:
        cur.execute(common.PAYMENT_SQL, common.payment_args(body, charge))
        return JsonResponse(common.row(common.PAYMENT_COLUMNS, cur.fetchone()), status=201)


def transfer(request):
    # not csrf_exempt: CsrfViewMiddleware refuses a POST without the token before this runs
    status, body = common.transfer(json.loads(request.body))
    return JsonResponse(body, status=status)


urlpatterns = [path('orders', create_order), path('payments', pay), path('reservations', reserve),
               path('transfers', transfer)]
