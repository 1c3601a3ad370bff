"""once() on Django's connection inside transaction.atomic(), run by test_core.py in a process
of its own (Django's settings are configured once per process).  Prints "ok" at the end."""
import os
import sys

import django
from django.conf import settings

settings.configure(DATABASES={'default': {
    'ENGINE': 'django.db.backends.postgresql', 'NAME': os.environ['PGDATABASE'], 'HOST': os.environ.get('PGHOST', ''),
    'PORT': os.environ.get('PGPORT', ''), 'USER': os.environ.get('PGUSER', '')}}, USE_TZ=True)
django.setup()

from django.db import connection, transaction  # noqa: E402

import idempo  # noqa: E402

scope, key = sys.argv[1], sys.argv[2]


def reserve():
    with transaction.atomic(), idempo.once(connection, scope, key, {'qty': 1}) as op:
        if op.acquired:
            with connection.cursor() as cur:
                cur.execute('INSERT INTO stock_moves VALUES (%s, 1)', [key])
            op.result = {'n': 1}
    return op


first, second = reserve(), reserve()
assert first.acquired and second.replayed and second.result == {'n': 1}, (first.claim, second.claim)
try:
    with transaction.atomic(), idempo.once(connection, scope, key + '-rolled-back'):
        raise ZeroDivisionError
except ZeroDivisionError:
    pass
assert idempo.lookup(connection, scope, key + '-rolled-back') is None
try:
    idempo.once(connection, scope, key + '-no-atomic').__enter__()      # autocommit: refused
    raise AssertionError('once() outside atomic() must be refused')
except idempo.NoTransaction:
    pass
with connection.cursor() as cur:
    cur.execute('SELECT count(*) FROM stock_moves WHERE key = %s', [key])
    assert cur.fetchone()[0] == 1
print('ok')
