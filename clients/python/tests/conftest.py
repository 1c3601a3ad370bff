"""Test fixtures: a new database per test session on the server that libpq's variables name
(PGHOST, PGPORT, PGUSER), with idempo created in it.  With IDEMPO_TEST_SHIM=1 the stand-ins of
tests/shim.sql are added where the server's idempo lacks a function (for development against
a server older than the library; test/run never sets it)."""
import http.client
import os
import threading
import uuid

import pytest

psycopg = pytest.importorskip('psycopg')

HERE = os.path.dirname(os.path.abspath(__file__))


def _admin():
    return psycopg.connect(dbname=os.environ.get('IDEMPO_TEST_ADMIN_DB', 'postgres'), autocommit=True)


@pytest.fixture(scope='session')
def dbname():
    name = f'idempo_py_{uuid.uuid4().hex[:8]}'
    with _admin() as admin:
        admin.execute(f'CREATE DATABASE {name}')
    try:
        with psycopg.connect(dbname=name, autocommit=True) as c:
            c.execute('CREATE EXTENSION idempo')
            if os.environ.get('IDEMPO_TEST_SHIM') == '1':
                c.execute(open(os.path.join(HERE, 'shim.sql')).read())
        os.environ['PGDATABASE'] = name      # framework servers started by tests use it too
        yield name
    finally:
        if os.environ.get('IDEMPO_TEST_KEEP_DB') != '1':
            with _admin() as admin:
                admin.execute(f'DROP DATABASE IF EXISTS {name} WITH (FORCE)')


@pytest.fixture
def db(dbname):
    """An autocommit psycopg 3 connection for setup and checks."""
    with psycopg.connect(dbname=dbname, autocommit=True) as c:
        yield c


@pytest.fixture
def conn(dbname):
    """A psycopg 3 connection for the code under test (autocommit: transactions are explicit)."""
    with psycopg.connect(dbname=dbname, autocommit=True) as c:
        yield c


@pytest.fixture
def scope(db):
    """A new scope per test: -> a function making one with the given settings."""
    def make(**settings):
        name = f's{uuid.uuid4().hex[:10]}'
        names = ', '.join(f'{k} => %s' for k in settings)
        db.execute(f'SELECT idempo.create_scope(%s{", " if settings else ""}{names})', [name, *settings.values()])
        return name
    return make


def new_key():
    return str(uuid.uuid4())


class FakeProvider:
    """A stand-in payment provider that does NOT deduplicate: every call that gets through
    charges.  A subclass's fate(reference, *args) decides each call: None (charged, answered),
    'request' (never sent: nothing charged, ConnectionRefusedError, as a client whose connect()
    was refused sees it), 'reply' (charged, the answer lost on the way back: TimeoutError) or
    'reset' (charged, the connection closed before the answer: http.client's RemoteDisconnected,
    which is a ConnectionResetError and so a ConnectionError: a rule that takes every
    ConnectionError for "not sent" charges twice); .lost counts requests and replies."""

    def __init__(self):
        self.charges = {}              # reference -> [charge ids]
        self.lock = threading.Lock()
        self.lost = {'request': 0, 'reply': 0}

    def fate(self, reference, *args):
        return None

    def charge(self, reference, *args):
        with self.lock:
            lose = self.fate(reference, *args)
            if lose == 'request':
                self.lost['request'] += 1
                raise ConnectionRefusedError('connection refused: the request was not sent')
            charge = f'ch_{uuid.uuid4().hex[:16]}'
            self.charges.setdefault(reference, []).append(charge)
            if lose == 'reply':
                self.lost['reply'] += 1
                raise TimeoutError('reply lost on the way back')
            if lose == 'reset':
                self.lost['reply'] += 1
                raise http.client.RemoteDisconnected('Remote end closed connection without response')
            return {'id': charge}

    def find(self, reference):
        with self.lock:
            found = self.charges.get(reference)
            return {'id': found[0]} if found else None
