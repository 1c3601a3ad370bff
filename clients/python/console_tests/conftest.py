"""The console's tests: a fresh database per test, the console started as `python3 -m
idempo.console` on it, and people who sign in with their own roles.

The server that PGHOST, PGPORT and PGUSER (a superuser) name must ask the console's roles for
their passwords (scram-sha-256 or md5 in pg_hba.conf; the run script sets that up), and have
idempo installable.  The roles (alice, carol: reviewers of billing; bob: reviewer of the shop)
are made once per server.
"""
import functools
import html
import http.client
import http.cookiejar
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import psycopg
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PASSWORDS = {'alice': 'alice-pw', 'bob': 'bob-pw', 'carol': 'carol-pw'}

ROLES = """
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_billing_app') THEN CREATE ROLE console_billing_app; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_shop_app') THEN CREATE ROLE console_shop_app; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_reviewer') THEN CREATE ROLE console_reviewer; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_billing_reviewers') THEN CREATE ROLE console_billing_reviewers; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_shop_reviewers') THEN CREATE ROLE console_shop_reviewers; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'alice') THEN CREATE ROLE alice LOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'carol') THEN CREATE ROLE carol LOGIN; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'bob') THEN CREATE ROLE bob LOGIN; END IF;
END $$;
ALTER ROLE alice LOGIN PASSWORD 'alice-pw';
ALTER ROLE carol LOGIN PASSWORD 'carol-pw';
ALTER ROLE bob LOGIN PASSWORD 'bob-pw';
GRANT console_reviewer, console_billing_reviewers TO alice, carol;
GRANT console_reviewer, console_shop_reviewers TO bob;
-- single sign-on: the console's own role (NOINHERIT: it holds the people's roles only to SET ROLE
-- to them), the people it may become; an outsider (not a reviewer) and a superuser it was
-- granted by mistake
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_sso') THEN CREATE ROLE console_sso LOGIN NOINHERIT; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_outsider') THEN CREATE ROLE console_outsider; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'console_sso_root') THEN CREATE ROLE console_sso_root SUPERUSER; END IF;
END $$;
ALTER ROLE console_sso LOGIN NOINHERIT PASSWORD 'console-sso-pw';
GRANT console_billing_app TO console_outsider;
GRANT console_reviewer TO console_sso_root;
GRANT alice, bob, carol, console_outsider, console_sso_root TO console_sso;
"""

# docs/console.md's grant set
GRANTS = """
GRANT USAGE ON SCHEMA idempo TO console_reviewer;
GRANT SELECT ON idempo.scopes, idempo.stats TO console_reviewer;
GRANT EXECUTE ON FUNCTION
    idempo.review_queue_page(text, text, text, interval, timestamptz, bigint, integer),
    idempo.conflict_queue_page(text, text, interval, timestamptz, bigint, integer),
    idempo.unknown_queue_page(text, text, interval, timestamptz, text, text, integer),
    idempo.reviewable_operations_of(text[], text[]),
    idempo.open_reviews_of(text[], text[]),
    idempo.open_conflicts_of(text[], text[]),
    idempo.reviewable_events_of(text, text),
    idempo.reviewable_events_since(timestamptz),
    idempo.resolve(text, text, text, text, text, jsonb, text),
    idempo.verify(text, text, integer, boolean, text, jsonb),
    idempo.resolve_conflict(bigint, text, text, text),
    idempo.request_review(text, text, text),
    idempo.release(text, text, text, text),
    idempo.lookup(text, text)
TO console_reviewer;
SELECT name FROM idempo.create_scope('billing.charge', allowed_role => 'console_billing_app',
    review_role => 'console_billing_reviewers', store_params => true,
    audit => true, lease => '1 minute', verify_settle => '10 seconds');
SELECT name FROM idempo.create_scope('shop.order', allowed_role => 'console_shop_app',
    review_role => 'console_shop_reviewers', store_params => true,
    audit => true, lease => '1 minute');
SELECT name FROM idempo.create_scope('signup.mail', allowed_role => 'console_billing_app',
    review_role => 'console_billing_reviewers', hash_keys => true,
    audit => true, lease => '1 minute');
"""


def admin(dbname='postgres'):
    return psycopg.connect(dbname=dbname, autocommit=True)


@pytest.fixture
def database(request):
    name = 'idempo_console_' + re.sub(r'\W', '_', request.node.name.lower())[:40]
    with admin() as c:
        c.execute(f'DROP DATABASE IF EXISTS {name} WITH (FORCE)')
        c.execute(f'CREATE DATABASE {name}')
        c.execute(ROLES)
    with admin(name) as c:
        plain = os.environ.get('IDEMPO_CONSOLE_PLAIN')
        if plain:       # the managed edition (console_tests/run with CONSOLE_EDITION=managed)
            c.execute('SET client_min_messages = warning')
            with open(plain) as f:
                c.execute(f.read())
        else:
            c.execute('CREATE EXTENSION idempo')
        c.execute(GRANTS)
    return name


class Data:
    """Records made the way applications and the sweep make them, as the superuser."""

    def __init__(self, dbname):
        self.dbname = dbname

    def sql(self, query, args=None, user=None):
        """As the superuser, or as one of the people (their own connection, as the console's)."""
        if user:
            c = psycopg.connect(dbname=self.dbname, user=user, password=PASSWORDS[user], autocommit=True)
        else:
            c = admin(self.dbname)
        with c:
            cur = c.execute(query, args)
            return cur.fetchall() if cur.description else None

    def one(self, query, args=None):
        with admin(self.dbname) as c:
            return c.execute(query, args).fetchone()

    def unknown(self, scope, keys, params=None):
        """Claims the keys, then lets their leases run out (the sweep, 10 minutes later)."""
        with admin(self.dbname) as c:
            for k in keys:
                c.execute('SELECT idempo.claim(%s, %s, params => %s)', (scope, k, psycopg.types.json.Jsonb(params or {'amount': 10})))
            c.execute("SET idempo.clock_offset = '10 minutes'")
            c.execute('SELECT idempo.sweep(100000)')

    def conflict(self, scope, key, stored, incoming):
        with admin(self.dbname) as c:
            c.execute('SELECT idempo.claim(%s, %s, params => %s, complete_on_commit => true)',
                      (scope, key, psycopg.types.json.Jsonb(stored)))
        with admin(self.dbname) as c:
            assert c.execute('SELECT outcome FROM idempo.claim(%s, %s, params => %s)',
                             (scope, key, psycopg.types.json.Jsonb(incoming))).fetchone()[0] == 'conflict'
        # the conflict is recorded after the claim's transaction, by the sweeper: wait for it
        deadline = time.monotonic() + 60
        while not self.one('SELECT id FROM idempo.conflict_queue WHERE scope = %s AND key = %s', (scope, key)):
            assert time.monotonic() < deadline, 'the conflict was never recorded'
            time.sleep(0.05)
        return self.one('SELECT id FROM idempo.conflict_queue WHERE scope = %s AND key = %s', (scope, key))[0]

    def conflict_again(self, scope, key, incoming):
        """The conflicting request once more: its open conflict occurs again (the sweeper records it)."""
        q = 'SELECT occurrences FROM idempo.conflict_queue WHERE scope = %s AND key = %s'
        before = self.one(q, (scope, key))[0]
        with admin(self.dbname) as c:
            assert c.execute('SELECT outcome FROM idempo.claim(%s, %s, params => %s)',
                             (scope, key, psycopg.types.json.Jsonb(incoming))).fetchone()[0] == 'conflict'
        deadline = time.monotonic() + 60
        while self.one(q, (scope, key))[0] == before:
            assert time.monotonic() < deadline, 'the conflict was never recorded again'
            time.sleep(0.05)

    def status(self, scope, key):
        row = self.one('SELECT status FROM idempo.operations WHERE scope = %s AND key = %s', (scope, key))
        return row and row[0]


@pytest.fixture
def data(database):
    return Data(database)


def free_port():
    base = os.environ.get('IDEMPO_CONSOLE_TEST_PORT')
    if base:
        return int(base)
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Console:
    def __init__(self, dbname, *args, dsn_extra=''):
        self.port = free_port()
        self.url = f'http://127.0.0.1:{self.port}'
        dsn = f"dbname={dbname} host={os.environ.get('PGHOST', '')} port={os.environ.get('PGPORT', '5432')}" + dsn_extra
        self.log = open(os.path.join(os.environ.get('IDEMPO_CONSOLE_TEST_LOGDIR', '/tmp'),
                                     f'console-{self.port}.log'), 'w+')
        self.proc = subprocess.Popen([sys.executable, '-m', 'idempo.console', '--dsn', dsn,
                                      '--listen', f'127.0.0.1:{self.port}', *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(('127.0.0.1', self.port), timeout=1):
                    break
            except OSError:
                assert self.proc.poll() is None, 'the console did not start: ' + self.logs()
                assert time.monotonic() < deadline, 'the console does not listen: ' + self.logs()
                time.sleep(0.05)

    def logs(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


@pytest.fixture
def console(database):
    started = []

    def start(*args, **kw):
        c = Console(database, *args, **kw)
        started.append(c)
        return c
    yield start
    for c in started:
        c.stop()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


class FromAddress(urllib.request.HTTPHandler):
    """Connects from a given local address (any of 127.0.0.0/8 reaches the console on 127.0.0.1):
    the peer address the console sees."""

    def __init__(self, source):
        super().__init__()
        self.source = source

    def http_open(self, req):
        return self.do_open(functools.partial(http.client.HTTPConnection, source_address=(self.source, 0)), req)


class Person:
    """A browser without a browser: cookies, forms, redirects followed.  source: the address it
    connects from; headers: sent with every request (a proxy's single sign-on header)."""

    def __init__(self, console, source='127.0.0.1', headers=None):
        self.console = console
        self.headers = dict(headers or {})
        self.jar = http.cookiejar.CookieJar()
        via = [FromAddress(source)]
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), *via)
        self.raw = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), NoRedirect, *via)

    def request(self, path, form=None, follow=True, doseq=False):
        body = urllib.parse.urlencode(form, doseq=doseq).encode() if form is not None else None
        req = urllib.request.Request(self.console.url + path, body, headers=self.headers)
        try:
            with (self.opener if follow else self.raw).open(req, timeout=30) as r:
                return r.status, r.read().decode(), r.headers, r.url
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), e.headers, e.url

    def get(self, path, **kw):
        return self.request(path, **kw)

    def post(self, path, form, **kw):
        """doseq=True: a list is sent as the field repeated."""
        return self.request(path, form, **kw)

    def login_form(self, role, password):
        """The sign-in form as the sign-in page fills it (with its pre-session token)."""
        _, page, _, _ = self.get('/login')
        m = re.search(r'name="login_csrf" value="([^"]+)"', page)
        return dict({'role': role, 'password': password}, **({'login_csrf': html.unescape(m.group(1))} if m else {}))

    def sign_in(self, role, password=None):
        status, body, _, _ = self.post('/login', self.login_form(role, password or PASSWORDS[role]))
        assert status == 200 and f'<strong id="whoami">{role}</strong>' in body, body
        return self

    def forms(self, body):
        """The page's POST forms as dicts of their hidden fields, by their action field."""
        out = []
        for f in re.findall(r'<form method="post" action="/decide">(.*?)</form>', body, re.S):
            out.append({html.unescape(n): html.unescape(v) for n, v in
                        re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', f)})
        return out

    def form(self, body, action, **fields):
        for f in self.forms(body):
            if f['action'] == action and all(f.get(k) == v for k, v in fields.items()):
                return f
        raise AssertionError(f'no {action} form on the page')


@pytest.fixture
def person():
    return Person


def text_of(body):
    """The page's text, as a person reads it (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r'<[^>]+>', ' ', body))
