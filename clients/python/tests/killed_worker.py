"""A worker for test_call.py's kill -9 test: call_once whose call charges (a row in
provider_charges, committed on a connection of its own, as a provider would) and then hangs
until the test kills this process.  Prints "charged" once the charge is made."""
import os
import sys
import time

import psycopg

import idempo

scope, key = sys.argv[1], sys.argv[2]


def charge(reference):
    with psycopg.connect(autocommit=True) as provider:
        provider.execute('INSERT INTO provider_charges VALUES (%s, %s)', [reference, f'ch-{os.getpid()}'])
    print('charged', flush=True)
    time.sleep(600)                   # the reply never comes: kill -9 arrives first


with psycopg.connect(autocommit=True) as conn:
    idempo.call_once(conn, scope, key, charge, params={'amount': 5})
