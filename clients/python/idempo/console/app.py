"""The console's web application (Starlette, run by uvicorn; pages rendered on the server)."""
import collections
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import logging
import secrets
import threading
import time
import urllib.parse

import jinja2
import psycopg
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from . import db
from .templates import CSS, TEMPLATES

log = logging.getLogger('idempo.console')

COOKIE = 'idempo_console'
LOGIN_COOKIE = 'idempo_console_login'     # the sign-in form's token, before any session
TITLES = {'reviews': 'Open reviews', 'conflicts': 'Open conflicts', 'unknown': 'Unknown operations'}
MAX_FORM = 1024 * 1024
# what many decisions at once may say (a success names its target_ref: one by one)
RESOLUTIONS = {'records': ('not_executed', 'failed'), 'conflicts': ('kept_stored', 'new_key', 'dismissed')}
RESOLUTIONS_NEEDED = {
    'records': 'Many at once: not executed or failed (a success names its target_ref, one by one).',
    'conflicts': 'Choose: kept stored, new key or dismissed.'}
LOG_SAFE = "/!$&'()*+,;=:@"    # kept as they are in a logged path (with letters, digits, -._~)
CSP = ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")


class TooLarge(Exception):
    """A posted body over MAX_FORM: refused before it is read whole."""


class Form(dict):
    """A posted form: each field's first value, and all of them (getall) for repeated ones."""

    def __init__(self, parsed):
        super().__init__({k: v[0] for k, v in parsed.items()})
        self.lists = parsed

    def getall(self, name):
        return self.lists.get(name, [])


@dataclasses.dataclass
class Settings:
    dsn: str
    read_only: bool = False
    idle_seconds: int = 1800
    # a person's kept connection is opened anew after this long (take_conn)
    reconnect_seconds: float = 60
    max_seconds: int = 8 * 3600
    secure_cookies: bool = False
    # single sign-on (docs/console.md): the header a proxy sets, the proxies' addresses (ip_network
    # objects), the reviewers' group role, how the header's value maps to a role name
    sso_header: str = None
    sso_trust: tuple = ()
    sso_group: str = None
    sso_map: str = 'exact'
    sso_domain: str = None
    # failed password sign-ins: at most this many per client address and per role name in the window
    sign_in_attempts: int = 10
    sign_in_window: int = 900


@dataclasses.dataclass
class Session:
    role: str
    password: str = dataclasses.field(repr=False)
    csrf: str
    started: float
    seen: float
    # what the last decision did, shown once on the page it leads to: (page, sentence); never
    # taken from the URL (a link could put any sentence in the console's "done" box)
    flash: tuple = None
    # single sign-on: the header's value the session was opened for (another value ends it)
    sso: str = dataclasses.field(default=None, repr=False)
    # the person's connection, kept between their requests (take_conn): opening one per
    # page costs more than the page's queries; used by one request at a time (conn_lock)
    conn: object = dataclasses.field(default=None, repr=False)
    conn_opened: float = 0.0
    conn_lock: object = dataclasses.field(default_factory=threading.Lock, repr=False)
    # the "select all" runs of this session, by id (at most MAX_RUNS, each at most db.MAX_ALL records)
    runs: dict = dataclasses.field(default_factory=dict)

    def close_conn(self):
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


MAX_RUNS = 3


@dataclasses.dataclass
class Run:
    """A "select all" run, kept in its session: what the filter matched when the person selected
    (each record with the state it was selected in), then decided chunk by chunk, a request each."""
    id: str
    kind: str
    filters: dict               # the queue's filter (shown; the selection is not taken again)
    items: list                 # (scope, key, token, conflict ids), fixed at selection
    count: int
    more: bool
    left_out: int
    resolution: str = None
    note: str = None            # set when the person confirms: the run starts
    position: int = 0           # items decided (or refused) so far
    decided: list = dataclasses.field(default_factory=list)
    refused: list = dataclasses.field(default_factory=list)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)


class Sessions:
    """In memory only: the password a person signed in with never leaves the process (the
    cookie holds a random id), and a restart signs everybody out."""

    def __init__(self, settings):
        self.settings = settings
        self.by_id = {}
        self.lock = threading.Lock()
        self.sweeper = None

    def new(self, role, password, sso=None):
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self.lock:
            self._sweep(now)
            self.by_id[sid] = Session(role, password, secrets.token_urlsafe(32), now, now, sso=sso)
            if self.sweeper is None:
                self.sweeper = threading.Thread(target=self._sweep_every, name='idempo console sessions',
                                                daemon=True)
                self.sweeper.start()
        return sid

    def _sweep(self, now):
        """(self.lock held) The sessions nobody came back to are forgotten (with their passwords
        and connections); a kept connection unused for settings.reconnect_seconds is closed (the
        next page would open a new one anyway): an idle console holds no connection for long."""
        for old in [k for k, s in self.by_id.items() if now - s.seen > self.settings.idle_seconds
                    or now - s.started > self.settings.max_seconds]:
            self._drop(old)
        for s in self.by_id.values():
            if s.conn is not None and now - s.seen > self.settings.reconnect_seconds \
                    and s.conn_lock.acquire(blocking=False):
                try:
                    s.close_conn()
                finally:
                    s.conn_lock.release()

    def _sweep_every(self):
        while True:
            time.sleep(min(10, max(self.settings.reconnect_seconds, 0.1)))
            with self.lock:
                self._sweep(time.monotonic())

    def get(self, sid):
        if not sid:
            return None
        now = time.monotonic()
        with self.lock:
            s = self.by_id.get(sid)
            if s is None:
                return None
            if now - s.seen > self.settings.idle_seconds or now - s.started > self.settings.max_seconds:
                self._drop(sid)
                return None
            s.seen = now
            return s

    def end(self, sid):
        with self.lock:
            self._drop(sid)

    def _drop(self, sid):
        """Forgets a session (self.lock held); its connection is closed now, or by the request
        using it when that ends."""
        s = self.by_id.pop(sid, None)
        if s is not None and s.conn_lock.acquire(blocking=False):
            try:
                s.close_conn()
            finally:
                s.conn_lock.release()


class Attempts:
    """Failed sign-ins per key (a client address, a role name) in a sliding window.  Bounded: at
    most max_keys keys, the one whose last failure is oldest forgotten first; each key keeps at
    most `limit` times."""

    def __init__(self, limit, window, max_keys=10000):
        self.limit, self.window, self.max_keys = limit, window, max_keys
        self.failures = collections.OrderedDict()
        self.lock = threading.Lock()

    def wait(self, key, now):
        """Seconds until the key may try again: 0 when it is under the limit."""
        if self.limit <= 0:
            return 0
        with self.lock:
            times = self.failures.get(key)
            while times and times[0] <= now - self.window:
                times.popleft()
            if not times:
                self.failures.pop(key, None)
                return 0
            return max(1, int(times[0] + self.window - now + 0.999)) if len(times) >= self.limit else 0

    def failed(self, key, now):
        if self.limit <= 0:
            return
        with self.lock:
            times = self.failures.pop(key, None) or collections.deque(maxlen=self.limit)
            times.append(now)
            self.failures[key] = times          # the most recent at the end
            while len(self.failures) > self.max_keys:
                self.failures.popitem(last=False)


def peer_trusted(peer, trusted):
    """Whether the TCP peer (the address uvicorn saw, never a forwarded header) is one of the
    proxies of --sso-trust; an IPv4 peer on a dual-stack socket (::ffff:a.b.c.d) as its IPv4."""
    if not peer:
        return False
    try:
        addr = ipaddress.ip_address(peer)
    except ValueError:
        return False
    if addr.version == 6 and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr in net for net in trusted)


ASCII_LOWER = str.maketrans('ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')


def sso_role(value, how='exact', domain=None):
    """The role name a header's value maps to, or None when it maps to none (docs/console.md):
    exact: the value as it is; lower: its ASCII letters lower-cased; local-part: a value
    LOCAL@DOMAIN whose DOMAIN is --sso-domain (ASCII case ignored), LOCAL lower-cased.  The name
    must be 1 to 63 bytes (PostgreSQL would cut a longer one to another name) without control
    characters."""
    if how == 'lower':
        value = value.translate(ASCII_LOWER)
    elif how == 'local-part':
        local, at, dom = value.partition('@')
        if not at or '@' in dom or not domain or dom.translate(ASCII_LOWER) != domain.translate(ASCII_LOWER):
            return None
        value = local.translate(ASCII_LOWER)
    elif how != 'exact':
        raise ValueError(f'unknown --sso-map {how}')
    if not value or len(value.encode('utf-8')) > 63 or any(ord(c) < 32 or ord(c) == 127 for c in value):
        return None
    return value


def _interval(v):
    """An interval as a person reads it: 3 d 4 h, 12 min, 40 s."""
    if v is None:
        return ''
    secs = int(v.total_seconds())
    d, r = divmod(secs, 86400)
    h, r = divmod(r, 3600)
    m, s = divmod(r, 60)
    if d:
        return f'{d} d {h} h'
    if h:
        return f'{h} h {m} min'
    if m:
        return f'{m} min'
    return f'{s} s'


def _short_key(row):
    """A key for a list: a digest (hash_keys scopes) shortened, never anything in clear."""
    return row['key'][:16] + '…' if row.get('hash_keys') else row['key']


def create_app(settings):
    env = jinja2.Environment(loader=jinja2.DictLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters['interval'] = _interval
    env.filters['short_key'] = _short_key
    env.filters['ts'] = lambda t: t.strftime('%Y-%m-%d %H:%M:%S %Z') if t else ''
    env.filters['day'] = lambda t: t.strftime('%Y-%m-%d') if t else ''
    env.filters['q'] = lambda d: urllib.parse.urlencode({k: v for k, v in d.items() if v not in (None, '')})
    env.globals['sso'] = bool(settings.sso_header)
    sessions = Sessions(settings)
    by_address = Attempts(settings.sign_in_attempts, settings.sign_in_window)
    by_role = Attempts(settings.sign_in_attempts, settings.sign_in_window)
    # role names are counted by a keyed digest: a password typed into the role field is not kept
    name_key = secrets.token_bytes(32)

    def page(request, name, status=200, session=None, **ctx):
        body = env.get_template(name).render(session=session, read_only=settings.read_only, path=request.url.path,
                                             **ctx)
        return HTMLResponse(body, status_code=status)

    async def form_of(request):
        # the limit holds while reading (a body of any size, even before sign-in, is never
        # held whole): the announced length first, then what arrives (chunked: no length)
        length = request.headers.get('content-length', '0')
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_FORM:
            raise TooLarge
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise TooLarge
        return Form(urllib.parse.parse_qs(body.decode('utf-8', 'replace'), keep_blank_values=True))

    def cross_site(request):
        """A POST that the browser says comes from another site (where it says anything)."""
        fetch_site = request.headers.get('sec-fetch-site')
        if fetch_site is not None and fetch_site not in ('same-origin', 'none'):
            return True
        # 'null': what browsers send under the console's Referrer-Policy: no-referrer (it says
        # nothing; Sec-Fetch-Site and the token still hold)
        origin = request.headers.get('origin')
        return origin not in (None, 'null') and urllib.parse.urlsplit(origin).netloc != request.headers.get('host')

    def take_flash(s, where):
        if s.flash is not None and s.flash[0] == where:
            done, s.flash = s.flash[1], None
            return done
        return None

    def too_large(request, s=None):
        return page(request, 'error.html', 413, s, message='This form is too large.')

    def route_failed(request, fn, e, status, s):
        """An error the route did not expect: the log names the route and the SQLSTATE, never the
        request's values (a message or a traceback would carry them: it goes to DEBUG only)."""
        log.error('%s %s failed: %s (SQLSTATE %s)', request.method, fn.__name__, type(e).__name__,
                  getattr(e, 'sqlstate', None))
        log.debug('the traceback', exc_info=e)
        return page(request, 'error.html', status, s, message='Something went wrong: nothing was done.')

    def sso_identity(request):
        """The single sign-on header's value, when a trusted proxy sent it once; else None (a
        header from any other peer is ignored, and logged: without its value)."""
        values = request.headers.getlist(settings.sso_header)
        if not values:
            return None
        peer = request.client.host if request.client else None
        if not peer_trusted(peer, settings.sso_trust):
            log.warning('the single sign-on header %s from %s ignored: not a proxy of --sso-trust',
                        settings.sso_header, peer)
            return None
        if len(values) > 1:
            log.warning('single sign-on refused: the header %s came %d times', settings.sso_header, len(values))
            return None
        try:        # Starlette decodes header values as Latin-1; a proxy sends UTF-8
            return values[0].encode('latin-1').decode('utf-8')
        except UnicodeError:
            log.warning('single sign-on refused: the header %s is not UTF-8', settings.sso_header)
            return None

    def not_signed_in(request):
        return login_page(request, 401, 'You are not signed in: this console takes who you are from the '
                                        'single sign-on in front of it, and it did not say, or named no '
                                        'reviewer this console may serve.')

    def open_conn(s):
        if settings.sso_header:
            return db.connect_as(settings.dsn, s.role, settings.sso_group)
        return db.connect(settings.dsn, s.role, s.password)

    def take_conn(s):
        """The session's connection for one request (the session's requests wait for each other):
        the kept one while it is idle and younger than settings.reconnect_seconds, else a new one:
        a password changed, a LOGIN revoked, a pg_hba.conf line changed (what PostgreSQL checks
        when a connection opens) take effect that soon."""
        s.conn_lock.acquire()
        try:
            c = s.conn
            if c is None or c.closed or c.broken or time.monotonic() - s.conn_opened > settings.reconnect_seconds \
                    or c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                s.close_conn()
                s.conn = open_conn(s)
                s.conn_opened = time.monotonic()
            return s.conn
        except BaseException:
            s.conn_lock.release()
            raise

    def give_back_conn(s, sid, keep):
        """After the request: the connection is kept for the session's next one only if the request
        ended normally, it is idle, and the session still exists."""
        try:
            c = s.conn
            if c is not None and keep and not c.closed and not c.broken and \
                    c.info.transaction_status == psycopg.pq.TransactionStatus.IDLE and sid in sessions.by_id:
                c.autocommit = True
                c.isolation_level = None
            else:
                s.close_conn()
        finally:
            s.conn_lock.release()

    def signed_in(fn):
        async def handler(request):
            sid = request.cookies.get(COOKIE)
            s = sessions.get(sid)
            new_sid = None
            if settings.sso_header:
                who = sso_identity(request)
                # a session is the header's identity's: another value (or none) ends it
                if s is not None and s.sso != who:
                    sessions.end(sid)
                    s = None
                if who is None:
                    return not_signed_in(request)
                if s is None:
                    role = sso_role(who, settings.sso_map, settings.sso_domain)
                    if role is None:
                        log.warning('single sign-on refused: the header value maps to no role name (--sso-map)')
                        return not_signed_in(request)
                    new_sid = sid = sessions.new(role, None, sso=who)
                    s = sessions.get(sid)
            elif s is None:
                return RedirectResponse('/login', status_code=303)
            r = await route(request, sid, s)
            if new_sid is not None and new_sid in sessions.by_id:
                r.set_cookie(COOKIE, new_sid, httponly=True, samesite='strict', secure=settings.secure_cookies,
                             path='/')
            return r

        async def route(request, sid, s):
            form = None
            if request.method == 'POST':
                try:
                    form = await form_of(request)
                except TooLarge:
                    return too_large(request, s)
                # every change carries the session's token (and SameSite=Strict cookies besides);
                # compared as bytes: compare_digest refuses a str that is not ASCII
                if cross_site(request) or \
                        not hmac.compare_digest(form.get('csrf', '').encode(), s.csrf.encode()):
                    return page(request, 'error.html', 403, s, message='This form is not valid (expired or not from this console). Reload the page.')
            try:
                conn = await run_in_threadpool(take_conn, s)
            except db.NotChecked as e:      # single sign-on: not a role the console serves
                sessions.end(sid)
                log.warning('single sign-on refused: %s', e)
                return not_signed_in(request)
            except psycopg.OperationalError as e:
                if settings.sso_header:
                    return route_failed(request, fn, e, 503, None)
                sessions.end(sid)
                return RedirectResponse('/login', status_code=303)
            second = []

            def committed():
                """A second connection, opened once per request, for what others committed."""
                if not second:
                    second.append(open_conn(s))
                return second[0]
            request.state.committed = committed
            keep = False
            try:
                r = await run_in_threadpool(fn, request, s, conn, form)
                keep = True
                return r
            except psycopg.errors.InsufficientPrivilege as e:
                return page(request, 'error.html', 403, s,
                            message=f'Your role may not read this: {e.diag.message_primary}. '
                                    'docs/console.md lists the grants the console needs.')
            except db.BadInput as e:                        # a hand-made link
                return page(request, 'error.html', 400, s, message=f'Not understood: {e}.')
            except psycopg.DataError as e:                  # a value out of range, a NUL: class 22
                log.info('%s %s refused: a value not understood (SQLSTATE %s)', request.method, fn.__name__,
                         e.sqlstate)
                return page(request, 'error.html', 400, s,
                            message='Not understood: a value in the request is not valid here.')
            except Exception as e:
                return route_failed(request, fn, e, 500, s)
            finally:
                await run_in_threadpool(give_back_conn, s, sid, keep)
                for c in second:
                    await run_in_threadpool(c.close)
        return handler

    def login_page(request, status=200, message=None):
        # a token for this browser's sign-in form (a cookie and the form's field): a form on
        # another site cannot have it, so it cannot sign the browser in as someone else
        token = request.cookies.get(LOGIN_COOKIE) or ''
        if not (len(token) == 43 and token.isascii()):
            token = secrets.token_urlsafe(32)
        r = page(request, 'login.html', status, message=message, login_csrf=token)
        if settings.sso_header:
            return r
        r.set_cookie(LOGIN_COOKIE, token, httponly=True, samesite='strict', secure=settings.secure_cookies,
                     path='/login')
        return r

    async def login(request):
        if settings.sso_header:
            # no password form: who signs in is the proxy's to say (a POST is not even read)
            if request.method == 'GET' and sso_identity(request) is not None:
                return RedirectResponse('/', status_code=303)
            return not_signed_in(request)
        if request.method == 'GET':
            return login_page(request)
        try:
            form = await form_of(request)
        except TooLarge:
            return too_large(request)
        token = request.cookies.get(LOGIN_COOKIE, '')
        if cross_site(request) or not token or \
                not hmac.compare_digest(form.get('login_csrf', '').encode(), token.encode()):
            log.info('sign-in refused: the form is not from this console')
            return login_page(request, 403, 'This sign-in form is not valid (expired or not from this console). '
                                            'Sign in again.')
        role, password = form.get('role', ''), form.get('password', '')
        if not role or not password:
            return login_page(request, 400, 'Give your role and its password.')
        # too many failures from this address or for this role name: not even tried (each try
        # is a connection, and a guess); the name counted as the server cuts it (63 bytes)
        now = time.monotonic()
        address = request.client.host if request.client else ''
        name = hmac.new(name_key, role.encode('utf-8', 'replace')[:63], hashlib.sha256).digest()
        wait = max(by_address.wait(address, now), by_role.wait(name, now))
        if wait:
            log.warning('sign-in refused without trying: %d failed sign-ins from %s or for the role name in %d '
                        'minutes', settings.sign_in_attempts, address, settings.sign_in_window // 60)
            r = login_page(request, 429, f'Too many failed sign-ins: try again in {(wait + 59) // 60} minute(s).')
            r.headers['Retry-After'] = str(wait)
            return r
        def refused():
            by_address.failed(address, now)
            by_role.failed(name, now)
            return login_page(request, 401, 'Sign-in failed: that role and password were not accepted.')
        if '\x00' in role or '\x00' in password:      # libpq would cut the name there
            return refused()
        try:
            role = await run_in_threadpool(db.sign_in, settings.dsn, role, password)
        except psycopg.Error:
            log.info('sign-in refused for a role')   # never the name or the password
            return refused()
        except db.NotChecked as e:
            # the same answer as a wrong password (no telling which roles exist); the operator's
            # log says why
            log.warning('sign-in refused for a role: %s', e)
            return refused()
        sid = sessions.new(role, password)
        r = RedirectResponse('/', status_code=303)
        r.set_cookie(COOKIE, sid, httponly=True, samesite='strict', secure=settings.secure_cookies, path='/')
        r.delete_cookie(LOGIN_COOKIE, path='/login')
        return r

    @signed_in
    def logout(request, s, conn, form):
        sessions.end(request.cookies.get(COOKIE))
        r = RedirectResponse('/login', status_code=303)
        r.delete_cookie(COOKIE, path='/')
        return r

    def filters(request, p=None, kind=None):
        """A queue's filter: from the page's link, or (p, kind) from a posted form."""
        if p is None:
            p, kind = request.query_params, request.url.path.lstrip('/')
        age = p.get('older_than', '')
        if age and not (age.isascii() and age.isdigit()):      # '²' is a digit to str.isdigit()
            raise db.BadInput('the age is a number of minutes')
        after = p.get('after') or None
        db.after_position(after, 3 if kind == 'unknown' else 2)     # checked here: 400
        return dict(scope=p.get('scope') or None, reason=p.get('reason') or None, q=p.get('q') or None,
                    older_than=min(int(age), 10 ** 7) if age else None,   # minutes: 19 years at most
                    after=after)

    @signed_in
    def overview(request, s, conn, form):
        rows, oldest, oldest_unknown, workers = db.overview(conn)
        top = max([1] + [r['in_progress'] + r['unknown'] + r['in_review'] + r['open_conflicts'] for r in rows])
        days = db.activity(conn)
        charts = None if days is None else [
            dict(label=label, counts=[d['counts'][i] for d in days], top=max([1] + [d['counts'][i] for d in days]))
            for i, (label, _) in enumerate(db.ACTIVITY)]
        return page(request, 'overview.html', session=s, rows=rows, oldest=oldest, oldest_unknown=oldest_unknown,
                    workers=workers, top=top, role=s.role, days=days, charts=charts)

    def queue(kind, fetch, after_of):
        @signed_in
        def handler(request, s, conn, form):
            f = filters(request)
            args = {k: v for k, v in f.items() if k != 'reason' or kind == 'reviews'}
            rows = fetch(conn, **args)
            more = len(rows) > db.PAGE
            rows = rows[:db.PAGE]
            nxt = dict(f, after=after_of(rows[-1])) if more else None
            # rows decided many at once carry the state they were shown in (not hash_keys rows:
            # resolve() needs their key in clear, typed on the record's page; a conflict is
            # resolved by its id)
            picks = db.tokens(conn, [r for r in rows if kind == 'conflicts' or not r['hash_keys']]) \
                if not settings.read_only else {}
            return page(request, 'queue.html', session=s, kind=kind, rows=rows, f=f, next=nxt, title=TITLES[kind],
                        picks=picks, max_all=db.MAX_ALL, scopes=db.scopes(conn))
        return handler

    def record_page(request, s, conn, rec, message=None, status=200, done=None):
        return page(request, 'record.html', status, s, rec=rec, message=message, done=done,
                    key=rec['key'])

    @signed_in
    def record(request, s, conn, form):
        scope, key = request.query_params.get('scope', ''), request.query_params.get('key', '')
        rec = db.record(conn, scope, key)
        if rec is None:
            return page(request, 'error.html', 404, s, message='There is no such record in the scopes you may see.')
        return record_page(request, s, conn, rec, done=take_flash(s, ('record', scope, key)))

    @signed_in
    def decide(request, s, conn, form):
        scope, key = form.get('scope', ''), form.get('key', '')
        back = f"/record?{urllib.parse.urlencode({'scope': scope, 'key': key})}"
        if settings.read_only:
            return page(request, 'error.html', 403, s, message='This console is read-only.')
        note = (form.get('note') or '').strip()
        problem = None
        if not note:
            problem = 'A decision needs a note: say why.'
        elif form.get('confirm') != 'yes':
            problem = 'Tick the confirmation to decide.'
        if problem is None:
            try:
                done = db.decide(conn, s.role, scope, key, form.get('token', ''), form.get('action', ''), note, form,
                                 request.state.committed)
                log.info('decision %s', form.get('action', ''))
                if form.get('action') == 'release':     # the record is gone: its scope's page says so
                    back = f"/scopes/{urllib.parse.quote(scope, safe='')}"
                    s.flash = (('scope', scope), done)
                else:
                    s.flash = (('record', scope, key), done)
                return RedirectResponse(back, status_code=303)
            except db.Refused as e:
                problem = str(e)
                status = 409 if e.stale else 422
        else:
            status = 422
        rec = db.record(conn, scope, key)
        if rec is None:
            return page(request, 'error.html', 404, s, message=problem)
        return record_page(request, s, conn, rec, message=problem, status=status)

    @signed_in
    def bulk(request, s, conn, form):
        """Many records (or conflicts) decided at once: the selection is shown (count and sample) with
        one note and a confirmation; each is then decided only if still in the state it was picked in."""
        if settings.read_only:
            return page(request, 'error.html', 403, s, message='This console is read-only.')
        picks = []
        for v in form.getall('pick'):
            try:
                p = json.loads(v)
            except ValueError:
                continue
            # a record: [scope, key, token]; a conflict: [scope, key, token, id]
            if isinstance(p, list) and len(p) in (3, 4) and all(isinstance(x, str) for x in p[:3]) \
                    and (len(p) == 3 or type(p[3]) is int):
                picks.append(tuple(p))
        kind = 'conflicts' if picks and len(picks[0]) == 4 else 'records'
        resolution = form.get('resolution')
        if not picks:
            return page(request, 'error.html', 422, s, message='Select the records to decide.')
        if any(len(p) != len(picks[0]) for p in picks):
            return page(request, 'error.html', 422, s, message='Select records or conflicts, not both.')
        if resolution not in RESOLUTIONS[kind]:
            return page(request, 'error.html', 422, s, message=RESOLUTIONS_NEEDED[kind])
        note = (form.get('note') or '').strip()
        if form.get('step') != 'decide' or not note or form.get('confirm') != 'yes':
            problem = None if form.get('step') != 'decide' else (
                'A decision needs a note: say why.' if not note else 'Tick the confirmation to decide.')
            return page(request, 'bulk.html', 200 if problem is None else 422, s, picks=picks, kind=kind,
                        resolution=resolution, message=problem, result=None)
        if kind == 'records':
            decided, refused = db.decide_many(conn, s.role, picks, resolution, note, request.state.committed)
            refused = [(sc, k, None, why) for sc, k, why in refused]
        else:
            items = {}
            for sc, k, token, cid in picks:     # a record's conflicts are closed together
                items.setdefault((sc, k, token), []).append(cid)
            decided, refused = db.decide_items(conn, s.role, [(*i, tuple(c)) for i, c in items.items()], resolution,
                                               note, request.state.committed)
        log.info('decision %s on %d %s by one person (%d refused)', 'resolve' if kind == 'records' else
                 'resolve_conflict', len(decided), kind, len(refused))
        return page(request, 'bulk.html', session=s, picks=picks, kind=kind, resolution=resolution, message=None,
                    result=dict(decided=decided, refused=refused))

    def run_page(request, s, run, status=200, message=None):
        return page(request, 'run.html', status, s, run=run, message=message, max_all=db.MAX_ALL, TITLES=TITLES,
                    resolutions=RESOLUTIONS['conflicts' if run.kind == 'conflicts' else 'records'])

    @signed_in
    def bulk_all(request, s, conn, form):
        """Select every record a queue's filter matches (not only the page): the records and the
        state each is in are kept in the session (the page carries only the run's id); the count
        and a sample are shown, with one note and a confirmation to ask for."""
        if settings.read_only:
            return page(request, 'error.html', 403, s, message='This console is read-only.')
        kind = form.get('kind')
        if kind not in TITLES:
            raise db.BadInput('which queue?')
        f = filters(request, form, kind)
        args = {k: v for k, v in f.items() if k != 'after' and (k != 'reason' or kind == 'reviews')}
        items, count, more, left_out = db.select_all(conn, kind, args)
        if not items:
            return page(request, 'error.html', 422, s,
                        message='Nothing this filter matches can be decided many at once.')
        run = Run(secrets.token_urlsafe(16), kind, args, items, count, more, left_out)
        with sessions.lock:
            while len(s.runs) >= MAX_RUNS:      # the oldest is forgotten (with what it selected)
                del s.runs[next(iter(s.runs))]
            s.runs[run.id] = run
        return run_page(request, s, run)

    @signed_in
    def bulk_run(request, s, conn, form):
        """A run: started by the confirmation (POST), then one chunk per request (the progress page
        asks for the next by itself, or with its button) until every selected record is decided
        or refused.  A GET only continues a run this session's person confirmed."""
        if settings.read_only:
            return page(request, 'error.html', 403, s, message='This console is read-only.')
        run = s.runs.get((form or request.query_params).get('run', ''))
        if run is None:
            return page(request, 'error.html', 404, s,
                        message='This selection is not (or no longer) kept: select again from the queue.')
        if form is not None and form.get('step') == 'start' and run.note is None:
            note = (form.get('note') or '').strip()
            resolution = form.get('resolution')
            kind = 'conflicts' if run.kind == 'conflicts' else 'records'
            if resolution not in RESOLUTIONS[kind]:
                return run_page(request, s, run, 422, RESOLUTIONS_NEEDED[kind])
            if not note:
                return run_page(request, s, run, 422, 'A decision needs a note: say why.')
            if form.get('confirm') != 'yes':
                return run_page(request, s, run, 422, 'Tick the confirmation to decide.')
            run.resolution, run.note = resolution, note
        if run.note is None:
            return run_page(request, s, run)
        # one request decides a chunk at a time: another one meanwhile (a second tab) shows progress
        if run.lock.acquire(blocking=False):
            try:
                if run.position < len(run.items):
                    chunk = run.items[run.position:run.position + db.CHUNK]
                    decided, refused = db.decide_items(conn, s.role, chunk, run.resolution, run.note,
                                                       request.state.committed)
                    run.position += len(chunk)
                    run.decided += decided
                    run.refused += refused
                    log.info('decision %s on %d %s by one person (%d refused; run at %d of %d)',
                             'resolve_conflict' if run.kind == 'conflicts' else 'resolve', len(decided), run.kind,
                             len(refused), run.position, len(run.items))
            finally:
                run.lock.release()
        return run_page(request, s, run)

    @signed_in
    def scope_page(request, s, conn, form):
        sc = db.scope(conn, request.path_params['name'])
        if sc is None:
            return page(request, 'error.html', 404, s, message='There is no such scope among those you may see.')
        return page(request, 'scope.html', session=s, sc=sc, done=take_flash(s, ('scope', sc['name'])))

    async def css(request):
        return Response(CSS, media_type='text/css')

    routes = [
        Route('/', overview), Route('/login', login, methods=['GET', 'POST']),
        Route('/logout', logout, methods=['POST']),
        Route('/reviews', queue('reviews', db.reviews, lambda r: f"{r['opened_at'].isoformat()}|{r['id']}")),
        Route('/conflicts', queue('conflicts', db.conflicts, lambda r: f"{r['first_detected_at'].isoformat()}|{r['id']}")),
        Route('/unknown', queue('unknown', db.unknown,
                                lambda r: f"{r['last_attempt_at'].isoformat()}|{r['scope']}|{r['key']}")),
        Route('/record', record), Route('/decide', decide, methods=['POST']),
        Route('/bulk', bulk, methods=['POST']), Route('/bulk/all', bulk_all, methods=['POST']),
        Route('/bulk/run', bulk_run, methods=['GET', 'POST']),
        Route('/scopes/{name:path}', scope_page), Route('/console.css', css),
    ]
    app = Starlette(routes=routes)

    async def headers(scope, receive, send):
        async def send_with(message):
            if message['type'] == 'http.response.start':
                h = message.setdefault('headers', [])
                h += [(b'content-security-policy', CSP.encode()), (b'x-content-type-options', b'nosniff'),
                      (b'referrer-policy', b'no-referrer'), (b'cache-control', b'no-store'),
                      (b'x-frame-options', b'DENY')]
                if scope.get('type') == 'http':
                    # no query string; the path percent-encoded: a decoded newline would forge a line
                    log.info('%s %s %s', scope['method'], urllib.parse.quote(scope['path'], safe=LOG_SAFE),
                             message['status'])
            await send(message)
        await app(scope, receive, send_with)

    headers.settings = settings
    headers.sessions = sessions
    return headers
