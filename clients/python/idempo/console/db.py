"""What the console reads and how it decides, on a connection made as the signed-in person.

Visibility: a person sees a scope's records when the database says they review it
(idempo.may_review: its review_role, else its allowed_role, else anyone; docs/security.md).
Every record, queue and event is read through idempo's reader functions (review_queue_page(),
reviewable_operations_of(), ...), which return only those scopes and take the page's conditions
as arguments, so that nothing a query adds runs on another scope's rows (docs/security.md); the
decision functions refuse the others; the pages that read idempo.stats or idempo.scopes (every
scope) join VISIBLE, so they show the same scopes as the queues.

Staleness: every page that offers a decision carries a token of the state it showed (the
record, its open review, its open conflicts).  A decision runs in one REPEATABLE READ
transaction: the state is read again and compared with the token (refused if it differs),
then idempo's own function is called, which locks the record; a change committed after the
transaction's snapshot makes that lock fail with 40001, refused the same way.  The function
locks only what it writes (resolve_conflict the conflict, resolve the record), and a reviewer
may not lock rows (FOR UPDATE needs UPDATE on idempo's tables, which would let them write
the tables directly): so before committing, the state is read once more on a second
connection, which sees what others committed since the snapshot, and compared with the token.
"""
import datetime
import hashlib
import json

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

PAGE = 50

# the scopes the current role reviews (joined as s): the database's rule, idempo.may_review (the
# reader functions below filter by it already; idempo.stats and idempo.scopes show every scope)
VISIBLE = "idempo.may_review(s.review_role, s.allowed_role)"


CHANGED_WHILE = 'The record changed while you decided: nothing was decided. This is the record as it is now.'


class Refused(Exception):
    """A decision not made; message for the person, and the new state when it went stale."""

    def __init__(self, message, stale=False):
        super().__init__(message)
        self.stale = stale


def connect(dsn, role, password):
    return psycopg.connect(dsn, user=role, password=password, application_name='idempo console',
                           connect_timeout=10, autocommit=True, row_factory=dict_row)


class NotChecked(Exception):
    """The connection opened but the server did not check the password (the reason is for the log)."""


def sign_in(dsn, role, password):
    """The role PostgreSQL knows this person as (session_user: the server's name for the login,
    which is not always the text typed), when the server checked the password; else NotChecked."""
    with connect(dsn, role, password) as conn:
        # a trust or peer line in pg_hba.conf lets the connection in without asking for the
        # password: any password would do, so the sign-in would prove nothing
        if not conn.pgconn.used_password:
            raise NotChecked('the server did not ask for the password (a trust or peer line in pg_hba.conf '
                             'matches this connection; docs/console.md)')
        row = conn.execute('SELECT session_user AS role, r.rolsuper FROM pg_catalog.pg_roles AS r '
                           'WHERE r.rolname = session_user').fetchone()
        # a superuser is a member of every role: every scope would be visible and decidable
        if row['rolsuper']:
            raise NotChecked('a superuser: the console refuses superusers (docs/console.md)')
        return row['role']


# ---- single sign-on: the console's own role (the DSN's), SET ROLE to the person ----

def _service_connect(dsn):
    return psycopg.connect(dsn, application_name='idempo console', connect_timeout=10, autocommit=True,
                           row_factory=dict_row)


def service_check(dsn, group):
    """The console's own role, when it may serve single sign-on; else NotChecked, saying why.
    A superuser could become anyone (SET ROLE needs no grant); a CREATEROLE role could grant
    itself any role; BYPASSRLS reads past row security."""
    with _service_connect(dsn) as conn:
        row = conn.execute('SELECT session_user AS role, r.rolsuper, r.rolcreaterole, r.rolbypassrls '
                           'FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user').fetchone()
        if row['rolsuper'] or row['rolcreaterole'] or row['rolbypassrls']:
            raise NotChecked(f"the DSN's role {row['role']} is a superuser or has CREATEROLE or BYPASSRLS: "
                             'the console serves single sign-on only as a role without them')
        if conn.execute('SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s', (group,)).fetchone() is None:
            raise NotChecked(f'the group role {group} of --sso-group does not exist')
        return row['role']


# the person's role, and whether it is a member of the reviewers' group
PERSON = """SELECT r.rolsuper, r.rolcreaterole, r.rolbypassrls, r.rolname = session_user AS is_service,
       r.rolname = g.rolname AS is_group, pg_catalog.pg_has_role(r.oid, g.oid, 'MEMBER') AS in_group
    FROM pg_catalog.pg_roles AS r, pg_catalog.pg_roles AS g
    WHERE r.rolname = %s AND g.rolname = %s"""


def connect_as(dsn, person, group):
    """A connection as the console's own role, then SET ROLE to the person's role, so that the
    database sees them as the current role (grants, scope visibility, the actor idempo records).
    NotChecked (the reason for the log) when the role is not one the console serves: it does
    not exist, is not a member of the group, is the group or the console's own role, or is a
    superuser or has CREATEROLE or BYPASSRLS.  Checked on every connection: a role taken out of
    the group is refused from its next request on.  The connection is the request's own and is
    closed at its end (never pooled): a person's role never carries over to another's request."""
    conn = _service_connect(dsn)
    try:
        row = conn.execute(PERSON, (person, group)).fetchone()
        if row is None:
            raise NotChecked('no such role')
        if row['is_service'] or row['is_group']:
            raise NotChecked("the console's own role or the group itself, not a person's role")
        if not row['in_group']:
            raise NotChecked('the role is not a member of the --sso-group role')
        if row['rolsuper'] or row['rolcreaterole'] or row['rolbypassrls']:
            raise NotChecked('a superuser, or a role with CREATEROLE or BYPASSRLS: the console refuses them')
        try:
            conn.execute(sql.SQL('SET ROLE {}').format(sql.Identifier(person)))
        except psycopg.errors.InsufficientPrivilege:
            raise NotChecked("the console's own role may not SET ROLE to it: GRANT the person's role TO the "
                             "console's role (docs/console.md)") from None
        return conn
    except BaseException:
        conn.close()
        raise


def scopes(conn):
    return conn.execute(f"""SELECT s.name, s.hash_keys, s.store_params, s.audit, s.allowed_role, s.owner,
               s.environment, s.description, s.enabled, s.retention, s.lease, s.verify_settle,
               s.fingerprint_ignore, s.fingerprint_include
        FROM idempo.scopes AS s WHERE {VISIBLE} ORDER BY s.name""").fetchall()


def scope(conn, name):
    return conn.execute(f'SELECT s.* FROM idempo.scopes AS s WHERE s.name = %s AND {VISIBLE}', (name,)).fetchone()


def overview(conn):
    rows = conn.execute(f"""SELECT st.* FROM idempo.stats AS st JOIN idempo.scopes AS s ON s.name = st.scope
        WHERE {VISIBLE} ORDER BY st.scope""").fetchall()
    # the first row of each queue, in the queue's order (see the queues below: no ORDER BY here)
    oldest = (_with_hash_keys(conn, conn.execute('SELECT q.scope, q.key, q.waiting '
                                                 'FROM idempo.review_queue_page(page_size => 1) AS q').fetchall())
              or [None])[0]
    oldest_unknown = conn.execute('SELECT x.scope, x.key, x.waiting '
                                  'FROM idempo.unknown_queue_page(page_size => 1) AS x').fetchone()
    try:
        with conn.transaction():
            workers = conn.execute('SELECT kind, state, rounds, last_round_at FROM idempo.workers()').fetchall()
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction):
        workers = None      # not granted, or an edition without background workers
    return rows, oldest, oldest_unknown, workers


DAYS = 14
# what the overview charts per day, from the audit log: (label, the events counted)
ACTIVITY = [
    ('claims that ran the action', "e.action = 'claim' AND e.outcome = 'acquired'"),
    ('replays', "e.outcome = 'replay'"),
    ('conflicts', "e.outcome = 'conflict'"),
    ('records into review', "e.to_status = 'in_review' AND e.from_status IS DISTINCT FROM 'in_review'"),
    ('verified, resolved or released', "e.action IN ('resolve', 'verify found', 'verify not found', 'release')"),
]


def activity(conn):
    """Per day of the last DAYS (oldest first): the day and a count per ACTIVITY entry, from the
    audit events of the scopes the person reviews (audit => true scopes only); None when the role
    may not read them."""
    counts = ',\n'.join(f'count(*) FILTER (WHERE {cond}) AS c{i}' for i, (_, cond) in enumerate(ACTIVITY))
    try:
        with conn.transaction():
            rows = conn.execute(f"""WITH days AS (
                    SELECT d AS day FROM pg_catalog.generate_series(
                        date_trunc('day', idempo.now()) - interval '{DAYS - 1} days', date_trunc('day', idempo.now()),
                        interval '1 day') AS d),
                per_day AS (
                    SELECT date_trunc('day', e.at) AS day, {counts}
                    FROM idempo.reviewable_events_since(
                        date_trunc('day', idempo.now()) - interval '{DAYS - 1} days') AS e
                    GROUP BY 1)
                SELECT days.day, {', '.join(f'COALESCE(per_day.c{i}, 0) AS c{i}' for i in range(len(ACTIVITY)))}
                FROM days LEFT JOIN per_day ON per_day.day = days.day ORDER BY days.day""").fetchall()
    except psycopg.errors.InsufficientPrivilege:
        return None
    return [dict(day=r['day'], counts=[r[f'c{i}'] for i in range(len(ACTIVITY))]) for r in rows]


class BadInput(Exception):
    """A value of a hand-made link the console does not understand (the message says which)."""


BIGINT_MAX = 2 ** 63 - 1


def after_position(after, n):
    """A keyset position 'time|id' or 'time|scope|key' of the previous page's last row, or Nones;
    BadInput if it is not one (checked before it reaches SQL: a 400, not a failed query)."""
    if not after:
        return [None] * n
    parts = after.split('|', n - 1)
    if len(parts) != n:
        raise BadInput('the page position is not one the console wrote')
    try:
        datetime.datetime.fromisoformat(parts[0])
    except ValueError:
        raise BadInput('the page position is not one the console wrote') from None
    # '٣' is a digit to str.isdigit(), and a bigint stops at 2^63 - 1
    if n == 2 and not (parts[1].isascii() and parts[1].isdigit() and int(parts[1]) <= BIGINT_MAX):
        raise BadInput('the page position is not one the console wrote')
    return parts


_after = after_position


def _age(minutes):
    return datetime.timedelta(minutes=minutes) if minutes else None


# The queues are pages of idempo's reader functions, which take the page's conditions (scope,
# reason, key searched, age, the previous page's last row, the page's size) as arguments: the
# function filters by the caller's scopes first and plans the page with the values, an index range
# in the queue's order (review_queue's and conflict_queue's partial indexes).  A key searched is a
# prefix of keys kept in clear, and the whole key (compared by its digest) in hash_keys scopes.


def _with_hash_keys(conn, rows):
    hashed = {r['name'] for r in scopes(conn) if r['hash_keys']}
    for r in rows:
        r['hash_keys'] = r['scope'] in hashed
    return rows


def reviews(conn, scope=None, reason=None, q=None, older_than=None, after=None, limit=PAGE + 1):
    t, i = _after(after, 2)
    return _with_hash_keys(conn, conn.execute("""SELECT x.id, x.scope, x.key, x.reason, x.opened_at, x.waiting,
               x.status, x.attempt, x.detail
        FROM idempo.review_queue_page(scope => %(scope)s::text, reason => %(reason)s::text,
            key_search => %(q)s::text, older_than => %(age)s::interval, after_opened_at => %(t)s::timestamptz,
            after_id => %(i)s::bigint, page_size => %(limit)s::integer) AS x""",
                        dict(scope=scope, reason=reason, q=q, age=_age(older_than), t=t, i=i,
                             limit=limit)).fetchall())


def conflicts(conn, scope=None, q=None, older_than=None, after=None, limit=PAGE + 1):
    t, i = _after(after, 2)
    return _with_hash_keys(conn, conn.execute("""SELECT x.id, x.scope, x.key, x.occurrences, x.first_detected_at,
               x.waiting, x.stored_status, x.changed_fields
        FROM idempo.conflict_queue_page(scope => %(scope)s::text, key_search => %(q)s::text,
            older_than => %(age)s::interval, after_first_detected_at => %(t)s::timestamptz,
            after_id => %(i)s::bigint, page_size => %(limit)s::integer) AS x""",
                        dict(scope=scope, q=q, age=_age(older_than), t=t, i=i, limit=limit)).fetchall())


def unknown(conn, scope=None, q=None, older_than=None, after=None, limit=PAGE + 1):
    t, sc, k = _after(after, 3)
    return _with_hash_keys(conn, conn.execute("""SELECT x.scope, x.key, x.attempt, x.last_attempt_at, x.waiting
        FROM idempo.unknown_queue_page(scope => %(scope)s::text, key_search => %(q)s::text,
            older_than => %(age)s::interval, after_last_attempt_at => %(t)s::timestamptz,
            after_scope => %(sc)s::text, after_key => %(k)s::text, page_size => %(limit)s::integer) AS x""",
                        dict(scope=scope, q=q, age=_age(older_than), t=t, sc=sc, k=k,
                             limit=limit)).fetchall())


# (scope, key) pairs, as two arrays of the same length: the i-th scope with the i-th key
PAIRS = 'scopes => %(scopes)s::text[], keys => %(keys)s::text[]'


def _states(conn, pairs):
    """The record, its open review and its open conflicts (what a state token is made of) of each
    (scope, key), read together: {(scope, key): (op, review, conflicts)} (visibility is the caller's)."""
    out = {p: (None, None, []) for p in pairs}
    arrays = dict(scopes=[p[0] for p in pairs], keys=[p[1] for p in pairs])
    for op in conn.execute(f"""SELECT x.*,
               (x.status IN ('succeeded', 'failed') AND x.expires_at <= idempo.now()) AS remembered
        FROM idempo.reviewable_operations_of({PAIRS}) AS x""", arrays).fetchall():
        k = (op['scope'], op['key'])
        if k in out:
            out[k] = (op,) + out[k][1:]
    for r in conn.execute(f"""SELECT x.scope AS _scope, x.key AS _key, x.id, x.reason, x.opened_at, x.waiting, x.detail,
               x.snapshot
        FROM idempo.open_reviews_of({PAIRS}) AS x""", arrays).fetchall():
        k = (r.pop('_scope'), r.pop('_key'))
        if k in out and out[k][1] is None:
            out[k] = (out[k][0], r, out[k][2])
    for c in conn.execute(f"""SELECT x.scope AS _scope, x.key AS _key, x.id, x.occurrences, x.first_detected_at,
               x.last_detected_at, x.waiting, x.run_id, x.changed_fields, x.stored_params, x.incoming_params
        FROM idempo.open_conflicts_of({PAIRS}) AS x""", arrays).fetchall():
        k = (c.pop('_scope'), c.pop('_key'))
        if k in out:
            out[k][2].append(c)
    for k in out:
        out[k][2].sort(key=lambda c: c['id'])
    return out


def record(conn, scope_name, key, history=True):
    """The record (key as stored), its open review and conflicts, its history; None if not visible."""
    s = scope(conn, scope_name)
    if s is None:
        return None
    op, review, conflicts_ = _states(conn, [(scope_name, key)])[(scope_name, key)]
    if op is None and review is None and not conflicts_:
        return None
    events = None
    try:
        with conn.transaction():
            if not history:
                raise _NoHistory
            events = conn.execute("""SELECT e.id, e.at, e.run_id, e.attempt, e.from_status, e.to_status, e.outcome,
                       e.action, e.actor
                FROM idempo.reviewable_events_of(%s, %s) AS e ORDER BY e.id""", (scope_name, key)).fetchall()
    except (psycopg.errors.InsufficientPrivilege, _NoHistory):
        pass
    rec = dict(scope=s, key=key, op=op, review=review, conflicts=conflicts_, events=events)
    rec['token'] = state_token(op, review, conflicts_)
    return rec


class _NoHistory(Exception):
    pass


def tokens(conn, rows):
    """The state token of each row of a queue (what a decision on many is checked against); the
    rows come from the queues' queries, which show only the scopes the person may see."""
    out = {}
    pairs = list(dict.fromkeys((r['scope'], r['key']) for r in rows))
    for i in range(0, len(pairs), 1000):
        for k, (op, review, conflicts_) in _states(conn, pairs[i:i + 1000]).items():
            if op is not None or review is not None or conflicts_:
                out[k] = state_token(op, review, conflicts_)
    return out


def decide_many(conn, person, picks, resolution, note, committed=None):
    """resolve() for each (scope, key, token) picked, each in a transaction of its own and only if
    the record is still in the state it was picked in; returns (decided, refused) lists."""
    decided, refused = [], []
    for scope_name, key, token in picks:
        try:
            decide(conn, person, scope_name, key, token, 'resolve', note, {'resolution': resolution}, committed)
            decided.append((scope_name, key))
        except Refused as e:
            refused.append((scope_name, key, str(e)))
    return decided, refused


MAX_ALL = 10000     # records (conflicts) one "select all" run decides at most
CHUNK = 100         # decided per request of a run: each request's work stays short


def select_all(conn, kind, filters):
    """Every record a queue's filter matches, not only a page (conflicts, for the conflict queue),
    oldest first, at most MAX_ALL, with the state each is selected in.  Returns (items, count,
    more, left_out): items (scope, key, token, conflict ids: () for a record) in the queue's
    order, one per record; count: the records (conflicts) selected; more: more than MAX_ALL
    match; left_out: records of hash_keys scopes, which resolve() takes only with the key typed
    in clear (conflicts are resolved by their id: none is left out)."""
    fetch = {'unknown': unknown, 'reviews': reviews, 'conflicts': conflicts}[kind]
    # the matches and their states from one snapshot: a record that changes in between is not
    # selected in a state the filter did not match
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with conn.transaction():
            rows = fetch(conn, **filters, after=None, limit=MAX_ALL + 1)
            more = len(rows) > MAX_ALL
            rows = rows[:MAX_ALL]
            left_out = 0
            if kind != 'conflicts':
                left_out = sum(1 for r in rows if r['hash_keys'])
                rows = [r for r in rows if not r['hash_keys']]
            toks = tokens(conn, rows)
    finally:
        conn.isolation_level = None
    grouped = {}
    for r in rows:
        k = (r['scope'], r['key'])
        if k in toks:
            grouped.setdefault(k, []).extend([r['id']] if kind == 'conflicts' else [])
    items = [(sc, k, toks[(sc, k)], tuple(cids)) for (sc, k), cids in grouped.items()]
    return items, sum(len(i[3]) or 1 for i in items), more, left_out


def decide_items(conn, person, items, resolution, note, committed=None):
    """A chunk of many decisions: items (scope, key, token, conflict ids).  Each record is decided in
    a transaction of its own, only if it is still in the state it was selected in: resolve() for a
    record, resolve_conflict() for each of its conflicts (together: closing one changes the
    record's state).  Returns (decided, refused): (scope, key, conflict id or None) and
    (scope, key, conflict id or None, why)."""
    decided, refused = [], []
    for scope_name, key, token, cids in items:
        if cids:
            action, form = 'resolve_conflicts', {'resolution': resolution, 'conflict_ids': list(cids)}
        else:
            action, form = 'resolve', {'resolution': resolution}
        try:
            decide(conn, person, scope_name, key, token, action, note, form, committed)
            decided += [(scope_name, key, c) for c in cids or (None,)]
        except Refused as e:
            refused += [(scope_name, key, c, str(e)) for c in cids or (None,)]
    return decided, refused


def state_token(op, review, conflicts_):
    """What a decision is taken on: any change to the record, its review or its conflicts changes it."""
    state = [op, review and review['id'],
             [(c['id'], c['occurrences'], c['last_detected_at']) for c in conflicts_]]
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()[:32]


def decide(conn, person, scope_name, key, token, action, note, form, committed=None):
    """One decision through idempo's functions; returns a sentence saying what was done.
    committed(): a second connection as the same person (autocommit), to read what others have
    committed meanwhile."""
    conn.autocommit = False
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    notices = []

    def notice(d):
        notices.append(d.message_primary)
    conn.add_notice_handler(notice)       # removed below: the connection serves the next pages
    try:
        with conn.transaction():
            rec = record(conn, scope_name, key)
            if rec is None:
                raise Refused('There is no such record in the scopes you may see.')
            if rec['token'] != token:
                raise Refused('The record changed since you read it: nothing was decided. '
                              'This is the record as it is now.', stale=True)
            done = _call(conn, person, rec, action, note, form)
            # what others committed after the snapshot, to rows the function did not lock: the
            # second connection does not see this transaction's changes, so it must still show
            # the page's state (left: a change committed between this read and the commit)
            if committed is not None:
                now = record(committed(), scope_name, key, history=False)
                if now is None or now['token'] != token:
                    raise Refused(CHANGED_WHILE, stale=True)      # rolls the decision back
    except psycopg.errors.SerializationFailure:
        raise Refused(CHANGED_WHILE, stale=True)
    except psycopg.Error as e:
        raise Refused(f'idempo refused: {e.diag.message_primary} ({e.sqlstate})'
                      + (f' {e.diag.message_hint}' if e.diag.message_hint else ''))
    finally:
        conn.rollback() if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE else None
        conn.autocommit = True
        conn.isolation_level = None
        conn.remove_notice_handler(notice)
    return done + (' ' + ' '.join(notices) if notices else '')


def _clear_key(conn, rec, form):
    """The key to pass idempo's functions: as stored, or in hash_keys scopes the clear key the
    person typed, which must hash to this record's digest."""
    if not rec['scope']['hash_keys']:
        return rec['op']['key']
    clear = form.get('clear_key') or ''
    digest = hashlib.sha256(clear.encode('utf-8')).hexdigest()
    if not clear or digest != rec['op']['key']:
        raise Refused('This scope stores only the digest of its keys: type the key in clear; '
                      'the one typed does not hash to this record.')
    return clear


def _resolve_conflict(conn, cid, resolution, person, note):
    conn.execute('SELECT idempo.resolve_conflict(%s, %s, %s, %s)', (cid, resolution, person, note))


def _call(conn, person, rec, action, note, form):
    op = rec['op']
    s = rec['scope']['name']
    if action == 'resolve':
        if op is None:
            raise Refused('There is no record to resolve.')
        resolution = form.get('resolution')
        if resolution not in ('succeeded', 'not_executed', 'failed'):
            raise Refused('Choose what happened: succeeded, not executed or failed.')
        target_ref = form.get('target_ref') or None
        if resolution == 'succeeded' and not target_ref:
            raise Refused('A resolution as succeeded names the target_ref of the action in the target system.')
        st = conn.execute('SELECT idempo.resolve(%s, %s, %s, %s, target_ref => %s, note => %s) AS s',
                          (s, _clear_key(conn, rec, form), resolution, person, target_ref, note)).fetchone()['s']
        return f'Resolved as {resolution}: the record is now {st}.'
    if action == 'verify':
        if op is None or op['status'] != 'unknown':
            raise Refused('Only an unknown record is verified.')
        found = form.get('found')
        if found not in ('true', 'false'):
            raise Refused('Say whether the action is found in the target system.')
        target_ref = form.get('target_ref') or None
        st = conn.execute('SELECT idempo.verify(%s, %s, %s, %s, %s) AS s',
                          (s, _clear_key(conn, rec, form), op['attempt'], found == 'true', target_ref)).fetchone()['s']
        return f"Verified ({'found' if found == 'true' else 'not found'}): the record is now {st}."
    if action == 'resolve_conflict':
        try:
            cid = int(form.get('conflict_id', ''))
        except ValueError:
            raise Refused('Which conflict?')
        if cid not in [c['id'] for c in rec['conflicts']]:
            raise Refused('That conflict is not open on this record.', stale=True)
        resolution = form.get('resolution')
        if resolution not in ('kept_stored', 'new_key', 'dismissed'):
            raise Refused('Choose: kept stored, new key or dismissed.')
        _resolve_conflict(conn, cid, resolution, person, note)
        return f'Conflict {cid} resolved: {resolution}.'
    if action == 'resolve_conflicts':      # many at once: the conflicts of one record selected together
        ids = form.get('conflict_ids')
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            raise Refused('Which conflict?')
        if any(i not in [c['id'] for c in rec['conflicts']] for i in ids):
            raise Refused('That conflict is not open on this record.', stale=True)
        resolution = form.get('resolution')
        if resolution not in ('kept_stored', 'new_key', 'dismissed'):
            raise Refused('Choose: kept stored, new key or dismissed.')
        for cid in ids:
            _resolve_conflict(conn, cid, resolution, person, note)
        return f"Conflict(s) {', '.join(map(str, ids))} resolved: {resolution}."
    if action == 'request_review':
        if op is None or rec['review'] is not None or op['status'] == 'in_review':
            raise Refused('Only a record that is not in review can be put in review.')
        rid = conn.execute('SELECT idempo.request_review(%s, %s, %s) AS r',
                           (s, _clear_key(conn, rec, form), note)).fetchone()['r']
        return f'Put in review (review {rid}).'
    if action == 'release':
        if op is None or not op['remembered']:
            raise Refused('Only a remembered key (finished, its result expired) can be released.')
        rid = conn.execute('SELECT idempo.release(%s, %s, %s, %s) AS r',
                           (s, _clear_key(conn, rec, form), person, note)).fetchone()['r']
        return f'Released: the next claim of the key runs the action again (review {rid}).'
    raise Refused('Unknown decision.')
