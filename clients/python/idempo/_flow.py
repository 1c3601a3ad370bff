"""The flows, written once for both the sync and the async API.

Each flow is a generator that yields operations (run this SQL, call the user's function, begin,
commit, sleep, start or stop the heartbeat) and is sent what they return, or thrown what they
raised.  idempo._sync and idempo.aio run the same generators, so the blocking and the asyncio
API cannot drift apart: a fix in a flow is a fix in both.
"""
from __future__ import annotations

import datetime as _dt
import decimal
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ._types import (Claim, Conflict, Done, InvalidState, Operation, Outcome, Status, Superseded,
                     Unknown, from_database_error, not_acquired)

LIBRARY_VERSION = '1.0.1'      # the package's (idempo.__version__; a test holds them equal)
# The versions of idempo's SQL objects this library speaks: 0.3.x and 1.x (1.x keeps 0.3.0's
# API), written as the Node library's SUPPORTED; ASCII digits only, nothing after the last one.
SUPPORTED = re.compile(r'(0\.3|1\.[0-9]+)\.[0-9]+', re.ASCII)
SUPPORTED_TEXT = '0.3.x or 1.x'

CLAIM_COLUMNS = ('outcome::text, status::text, attempt, result::text, target_ref, error, first_seen_at, '
                 'lease_expires_at, conflict_id, review_id, completed_at')
# What once(), call_once() and the middleware read: the timestamps they do not use are left out
# (each costs the driver a parse on every claim; claim() returns them all).
NARROW_COLUMNS = ('outcome::text, status::text, attempt, result::text, target_ref, error, NULL, '
                  'lease_expires_at, conflict_id, review_id, NULL')
# once()'s fast path and the middleware: an acquired claim reads two values; any other answer the
# rest in one JSON array.  Every column costs the driver a parse on every claim (Debian's psycopg
# reads each through ctypes), and the acquired claim is the one that does the work.
FAST_COLUMNS = ("outcome::text, attempt, result::text, CASE WHEN outcome <> 'acquired' THEN json_build_array("
                "status, target_ref, error, extract(epoch FROM lease_expires_at), conflict_id, review_id)::text END")
# once()'s claim: one column.  Acquired (with nothing else set), the attempt as text (what the work needs, one value to
# read); any other answer a JSON array of the rest, read with one json.loads.  The driver's cost
# is per column (Debian's psycopg reads each through ctypes), and the claim that acquires is the
# one that does the work.
LEAN_COLUMN = ("CASE WHEN outcome = 'acquired' AND status = 'in_progress' AND result IS NULL AND target_ref IS NULL "
               "AND error IS NULL AND conflict_id IS NULL AND review_id IS NULL THEN attempt::text "
               "ELSE json_build_array(outcome, status, attempt, result, target_ref, error, "
               "extract(epoch FROM lease_expires_at), conflict_id, review_id)::text END")


# ---------------------------------------------------------------------------------------------
# Operations a flow yields

@dataclass
class Sql:
    sql: str
    args: tuple
    fetch: bool = True           # a statement with a row to read (not BEGIN, SAVEPOINT...)


@dataclass
class Call:
    fn: Callable
    args: tuple
    outside: bool = False        # the call to the other system (call, lookup): the asyncio API runs
                                 # a plain function in a thread, so the event loop and the heartbeat go on


class Begin:
    pass


class Commit:
    pass


class Rollback:
    pass


@dataclass
class Sleep:
    seconds: float


@dataclass
class HeartbeatStart:
    scope: str
    key: str
    attempt: int
    every: float
    extend: Any


class HeartbeatStop:
    pass


@dataclass
class Clock:
    """-> time.monotonic()"""


# ---------------------------------------------------------------------------------------------
# SQL

def interval(value) -> Optional[str]:
    """A lease or extension as PostgreSQL interval text: timedelta, seconds or text."""
    if value is None:
        return None
    if isinstance(value, _dt.timedelta):
        return f'{value.total_seconds()} seconds'
    if isinstance(value, (int, float)):
        return f'{float(value)} seconds'
    return str(value)


_ENCODER = ENCODER = json.JSONEncoder(separators=(',', ':'), ensure_ascii=False)     # made once: json.dumps with
_OUTCOMES = {o.value: o for o in Outcome}                                  # arguments makes one per call
_STATUSES = STATUSES = {s.value: s for s in Status}


def to_json(value) -> Optional[str]:
    return None if value is None else _ENCODER.encode(value)


def _numeric(token: str):
    """A JSON number with a fraction or an exponent, as jsonb writes it back: numeric never
    writes an exponent, and keeps max(0, digits after the point - exponent) decimals: '1e+16'
    (Python's repr of a float from 1e16 up) comes back '10000000000000000', an int; -0.0 as 0.0."""
    mantissa, _, exponent = token.lower().partition('e')
    if exponent and len(mantissa.partition('.')[2]) - int(exponent) <= 0:
        return int(decimal.Decimal(token))
    return float(token) + 0.0           # + 0.0: -0.0 becomes 0.0, as numeric has no negative zero


def _jsonb_key(k: str):
    """jsonb's order of an object's keys: shorter first, then by their UTF-8 bytes."""
    b = k.encode()
    return (len(b), b)


def _jsonb_object(pairs):
    """An object with its keys in jsonb's order (the last of duplicates wins)."""
    last = dict(pairs)
    return {k: last[k] for k in sorted(last, key=_jsonb_key)}


def as_stored(text: Optional[str]):
    """A result as a replay will read it back from its jsonb (a tuple as a list, an int dict key
    as a str, keys in jsonb's order, 1e+16 as an int): what the first answer carries too, so that
    the first call and its retries agree."""
    return None if text is None else json.loads(text, parse_float=_numeric, object_pairs_hook=_jsonb_object)


class _NotPlain(Exception):
    pass


def _plain(value):
    """A copy of value as jsonb gives it back, for the types whose way through JSON is known
    (what to_json writes and json.loads reads): raises _NotPlain for any other."""
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is dict:
        for k in value:
            if type(k) is not str:              # an int key comes back a str; None 'null'...
                raise _NotPlain
        keys = sorted(value, key=_jsonb_key) if len(value) > 1 else value
        return {k: _plain(value[k]) for k in keys}
    if t is list or t is tuple:
        return [_plain(v) for v in value]
    if t is float and value - value == 0.0:     # finite: NaN and Infinity are not JSON numbers
        return _numeric(float.__repr__(value))  # the text the encoder writes
    raise _NotPlain


def stored(value, text: Optional[str]):
    """as_stored(text) where text is to_json(value): the same answer, without parsing the text
    back when value is made of dicts with str keys, lists, tuples, str, int, float, bool and None
    (the JSON round trip was the largest part of what once() added to an operation)."""
    try:
        return _plain(value)
    except (_NotPlain, RecursionError):
        return as_stored(text)


def claim_sql(*, params_sql: str = '%s::jsonb', fingerprint: bool = False, wait: bool = True,
              run_id: bool = False, intent_at: bool = False, complete_on_commit: bool = False,
              lease: bool = False, now: bool = False, narrow: bool = False, fast: bool = False,
              verify_unknown: bool = True) -> str:
    """The claim statement; named arguments only for what is given, so that an older server's
    claim (no lease parameter) still answers the calls that do not use them."""
    named = [f'params => {params_sql}']
    if fingerprint:
        named.append('fingerprint => %s')
    if run_id:
        named.append('run_id => %s')
    if intent_at:
        named.append('intent_at => %s')
    if not wait:
        named.append('wait => false')
    if complete_on_commit:
        named.append('complete_on_commit => true')
    if lease:
        named.append('lease => %s::interval')
    if not verify_unknown:
        named.append('verify_unknown => false')
    columns = FAST_COLUMNS if fast else NARROW_COLUMNS if narrow else CLAIM_COLUMNS
    return (f'SELECT {columns}' + (', idempo.now()' if now else '')
            + f' FROM idempo.claim(%s, %s, {", ".join(named)})')


def claim_args(scope, key, params_args, *, fingerprint=None, run_id=None, intent_at=None, lease=None) -> tuple:
    args = [scope, key, *params_args]
    if fingerprint is not None:
        args.append(fingerprint)
    if run_id is not None:
        args.append(run_id)
    if intent_at is not None:
        args.append(intent_at)
    if lease is not None:
        args.append(interval(lease))
    return tuple(args)


def parse_claim(scope: str, key: str, row, fast: bool = False) -> Claim:
    if fast:
        outcome = _OUTCOMES[row[0]]
        result = None if row[2] is None else json.loads(row[2])
        if row[3] is None:                      # acquired
            return Claim(scope, key, outcome, Status.IN_PROGRESS, row[1], result)
        status, target_ref, error, lease_end, conflict_id, review_id = json.loads(row[3])
        return Claim(scope, key, outcome, None if status is None else _STATUSES[status], row[1], result, target_ref,
                     error, None, None if lease_end is None else _dt.datetime.fromtimestamp(float(lease_end), _dt.timezone.utc),
                     conflict_id, review_id, None, row[4] if len(row) > 4 else None)
    return Claim(scope, key, _OUTCOMES[row[0]], None if row[1] is None else _STATUSES[row[1]], row[2],
                 None if row[3] is None else json.loads(row[3]), row[4], row[5], row[6], row[7], row[8], row[9],
                 row[10], row[11] if len(row) > 11 else None)


COMPLETE_SQL = 'SELECT idempo.complete(%s, %s, attempt => %s, result => %s::jsonb, target_ref => %s)::text'
COMPLETE_NO_REF_SQL = 'SELECT idempo.complete(%s, %s, attempt => %s, result => %s::jsonb)::text'
FAIL_SQL = 'SELECT idempo.fail(%s, %s, attempt => %s, error => %s, retryable => %s)::text'
VERIFY_SQL = ('SELECT idempo.verify(%s, %s, %s, found => %s, target_ref => %s, result => %s::jsonb)::text')
HEARTBEAT_SQL = 'SELECT idempo.heartbeat(%s, %s, %s, %s::interval)'
LOOKUP_SQL = ('SELECT status::text, attempt, result::text, target_ref, error, first_seen_at, last_attempt_at, '
              'lease_expires_at, completed_at FROM idempo.lookup(%s, %s) WHERE scope IS NOT NULL')
CHANGED_SQL = 'SELECT changed_fields::text FROM idempo.conflict_queue WHERE id = %s'
VERSION_PROBE_SQL = ("SELECT to_regprocedure('idempo.version()') IS NOT NULL, "
                     "(SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'idempo')")
VERSION_SQL = 'SELECT idempo.version()'


def supported(version: Optional[str]) -> bool:
    return version is not None and SUPPORTED.fullmatch(version) is not None


def version_flow():
    """-> the version of idempo's SQL objects (idempo.version()); raises UnsupportedVersion."""
    from ._types import UnsupportedVersion
    has_function, extversion = yield Sql(VERSION_PROBE_SQL, ())
    if not has_function:
        raise UnsupportedVersion(extversion, SUPPORTED_TEXT, LIBRARY_VERSION,
                                 no_version_function=extversion is not None)
    (found,) = yield Sql(VERSION_SQL, ())
    if not supported(found):
        raise UnsupportedVersion(found, SUPPORTED_TEXT, LIBRARY_VERSION)
    return found


def text_names(scope, key):
    """Scopes and keys are text.  A number or a UUID (an order id often is one) would reach the
    server as an integer or uuid argument, whose answer ("function idempo.claim(unknown, integer,
    params => jsonb) does not exist") names neither the key nor the cure: refused here, by name.
    Not converted: str(1.0) or str(True) is not the key another client would send for them."""
    for name, value in (('scope', scope), ('key', key)):
        if not isinstance(value, str):
            raise TypeError(f'the {name} must be a str, not {type(value).__name__} ({value!r}): idempo\'s '
                            f"scopes and keys are text (convert with str(), e.g. f'order-{{order_id}}')")


def claim_flow(scope, key, params=None, *, params_sql='%s::jsonb', params_args=None, fingerprint=None, wait=True,
               run_id=None, intent_at=None, lease=None, complete_on_commit=False, now=False, narrow=False, fast=False,
               verify_unknown=True):
    """verify_unknown=False: a caller that cannot look the action up (the HTTP middleware's retry
    without a lookup) is answered unknown without taking the verification lease."""
    text_names(scope, key)
    if params_args is None:
        params_args = (to_json(params),)
    sql = claim_sql(params_sql=params_sql, fingerprint=fingerprint is not None, wait=wait, run_id=run_id is not None,
                    intent_at=intent_at is not None, complete_on_commit=complete_on_commit,
                    lease=lease is not None, now=now, narrow=narrow, fast=fast, verify_unknown=verify_unknown)
    row = yield Sql(sql, claim_args(scope, key, params_args, fingerprint=fingerprint, run_id=run_id,
                                    intent_at=intent_at, lease=lease))
    return parse_claim(scope, key, row, fast)


_LEAN_SQL: dict = {}


def lean_claim(scope, key, params, fingerprint=None, run_id=None, intent_at=None, wait=True):
    """once()'s claim (on_busy='raise'): -> (sql, args); its answer is read by lean_answer."""
    if type(scope) is not str or type(key) is not str:
        text_names(scope, key)
    shape = (fingerprint is not None, run_id is not None, intent_at is not None, wait)
    sql = _LEAN_SQL.get(shape)
    if sql is None:
        sql = _LEAN_SQL[shape] = claim_sql(fingerprint=shape[0], run_id=shape[1], intent_at=shape[2],
                                           wait=wait, fast=True).replace(FAST_COLUMNS, LEAN_COLUMN)
    if shape == (False, False, False, True):
        return sql, (scope, key, None if params is None else _ENCODER.encode(params))
    return sql, claim_args(scope, key, (to_json(params),), fingerprint=fingerprint, run_id=run_id,
                           intent_at=intent_at)


def lean_answer(scope, key, text: str):
    """-> the attempt (an int) if the claim acquired, else the Claim."""
    if text[0] != '[':
        return int(text)
    outcome, status, attempt, result, target_ref, error, lease_end, conflict_id, review_id = json.loads(text)
    return Claim(scope, key, _OUTCOMES[outcome], None if status is None else _STATUSES[status], attempt, result,
                 target_ref, error, None,
                 None if lease_end is None else _dt.datetime.fromtimestamp(float(lease_end), _dt.timezone.utc),
                 conflict_id, review_id)


def lean_claim_flow(scope, key, params, **claim_kw):
    """lean_claim as a flow (the asyncio API's once()): -> Claim."""
    sql, args = lean_claim(scope, key, params, **claim_kw)
    row = yield Sql(sql, args)
    answer = lean_answer(scope, key, row[0])
    if type(answer) is int:
        return Claim(scope, key, Outcome.ACQUIRED, Status.IN_PROGRESS, answer)
    return answer


def conflict_flow(claim: Claim):
    """-> the Conflict exception for a conflict answer, with the changed fields when the scope
    stores params (one more query, only on this path)."""
    changed = None
    if claim.conflict_id is not None:
        row = yield Sql(CHANGED_SQL, (claim.conflict_id,))
        if row is not None and row[0] is not None:
            changed = json.loads(row[0])
    return Conflict(claim, changed)


def refusal_flow(claim: Claim):
    """-> the exception for an answer that is not acquired and not replay."""
    if claim.outcome is Outcome.CONFLICT:
        return (yield from conflict_flow(claim))
    return not_acquired(claim)


def status_flow(sql, args):
    text_names(args[0], args[1])                # (scope, key, ...)
    (status,) = yield Sql(sql, args)
    return _STATUSES[status]


def heartbeat_flow(scope, key, attempt, extend):
    text_names(scope, key)
    (until,) = yield Sql(HEARTBEAT_SQL, (scope, key, attempt, interval(extend)))
    return until


def lookup_flow(scope, key):
    text_names(scope, key)
    row = yield Sql(LOOKUP_SQL, (scope, key))
    if row is None:
        return None
    return Operation(scope, key, Status(row[0]), row[1], None if row[2] is None else json.loads(row[2]), *row[3:])


def done_of(claim: Claim, *, replayed=True) -> Done:
    return Done(claim.scope, claim.key, claim.status, claim.attempt, claim.result, claim.target_ref, claim.error,
                replayed=replayed)


def claim_until_decided(scope, key, params, *, on_busy, busy_timeout, now=False, **claim_kw):
    """Claim; on busy with on_busy='wait', claim again until the key is free or busy_timeout
    (seconds) has passed (then raise Busy).  -> Claim."""
    if on_busy != 'wait':             # the caller answers busy (raises Busy)
        return (yield from claim_flow(scope, key, params, now=now, narrow=True, **claim_kw))
    # A claim reads an existing record FOR UPDATE: a busy answer leaves this transaction holding
    # the row lock, and the holder's complete() would wait for us while we wait for it.  So each
    # waiting claim runs in a savepoint, rolled back (lock released) before the pause.
    start = None
    pause = 0.05
    while True:
        yield Sql('SAVEPOINT idempo_wait', None, fetch=False)
        claim = yield from claim_flow(scope, key, params, now=True, narrow=True, **claim_kw)
        if claim.outcome is not Outcome.BUSY:
            yield Sql('RELEASE SAVEPOINT idempo_wait', None, fetch=False)
            return claim
        yield Sql('ROLLBACK TO SAVEPOINT idempo_wait', None, fetch=False)
        yield Sql('RELEASE SAVEPOINT idempo_wait', None, fetch=False)
        now = yield Clock()
        start = now if start is None else start
        left = busy_timeout - (now - start)
        if left <= 0:
            raise not_acquired(claim)
        yield Sleep(min(pause, claim.retry_after(), left))
        pause = min(pause * 2, 1.0)


# ---------------------------------------------------------------------------------------------
# The two-system flow

def decide(retryable, honours_key, err) -> Optional[bool]:
    """True: fail(retryable) (the attempt had no effect, or the target honours the key); False:
    fail(final); None: in doubt, leave the attempt to its lease (it turns unknown, and the next
    claim looks it up)."""
    if retryable is not None:
        return retryable(err)
    return True if honours_key else None


def call_flow(conn, scope, key, call, *, params=None, lookup=None, record=None, retryable=None,
              honours_key=False, target_ref=None, provider_key=None, lease=None, heartbeat=None,
              extend=None, on_busy='raise', busy_timeout=30.0, run_id=None, intent_at=None, retries=0):
    text_names(scope, key)
    pkey = provider_key(scope, key) if provider_key else f'{scope}/{key}'
    left = retries
    for _ in range(retries + 5):
        # The claim commits at once: the attempt holds the key by its lease while the call runs.
        yield Begin()
        try:
            claim = yield from claim_until_decided(scope, key, params, on_busy=on_busy, busy_timeout=busy_timeout,
                                                   now=True, run_id=run_id, intent_at=intent_at, lease=lease)
            if claim.outcome is Outcome.CONFLICT:
                raise (yield from conflict_flow(claim))
        except BaseException:
            yield Commit()           # a claim may have written (a review, a conflict): keep it
            raise
        yield Commit()
        if claim.outcome is Outcome.REPLAY:
            return done_of(claim)
        if claim.outcome is Outcome.UNKNOWN:
            if lookup is None:
                raise Unknown(claim)
            try:
                settled = yield from verify_flow(conn, claim, pkey, lookup, record, target_ref)
            except Superseded:
                continue            # the verify race: another verifier or a newer attempt won; ask again
            if settled is not None:
                return settled
            continue                # not found: retryable now, the next claim acquires
        if claim.outcome is not Outcome.ACQUIRED:
            raise not_acquired(claim)
        try:
            return (yield from attempt_flow(conn, claim, pkey, call, record, retryable, honours_key, target_ref,
                                            heartbeat, extend))
        except Exception:
            # retries: claim again -- the next attempt (after fail(retryable)), or, in doubt, busy
            # until the lease runs out (on_busy='wait'), then unknown -> lookup -> verify
            if left <= 0:
                raise
            left -= 1
    raise Unknown(claim, f'key "{key}" in scope "{scope}": still not settled after {retries} retries')


def heartbeat_for(claim, every=None, extend=None) -> Optional[HeartbeatStart]:
    """The heartbeat that holds an acquired attempt's lease while its outside call runs (call_once,
    the middleware's calls_out routes), or None when neither `every` is given nor the claim's
    lease known: by default a beat every third of the lease, extending by the lease itself."""
    if every is None and claim.lease_expires_at is not None and claim.now is not None:
        every = max(0.05, (claim.lease_expires_at - claim.now).total_seconds() / 3)
    if extend is None and claim.lease_expires_at is not None and claim.now is not None:
        # heartbeat(extend => NULL) extends by the SCOPE's lease and never shortens: an attempt
        # claimed with a longer lease(=>) would not be extended at all and lose its key when that
        # lease runs out.  So extend by the lease this attempt holds.
        extend = claim.lease_expires_at - claim.now
    if not every:
        return None
    return HeartbeatStart(claim.scope, claim.key, claim.attempt, every, interval(extend))


def attempt_flow(conn, claim, pkey, call, record, retryable, honours_key, target_ref, heartbeat, extend):
    scope, key, attempt = claim.scope, claim.key, claim.attempt
    beat = heartbeat_for(claim, heartbeat, extend)
    every = beat is not None
    if every:
        yield beat
    try:
        value = yield Call(call, (pkey,), outside=True)
    except BaseException as err:
        # every exit stops the heartbeat, a cancelled task or a KeyboardInterrupt included: a
        # heartbeat left running would hold the key for as long as the process lives
        if every:
            yield HeartbeatStop()
        if not isinstance(err, Exception):
            raise
        decision = yield from after_error(claim, retryable, honours_key, err)
        if decision is False:        # a final failure is an outcome, recorded and replayed
            return Done(scope, key, Status.FAILED, attempt, None, None, error_text(err))
        raise
    if every:
        # A heartbeat refused (the lease ran out) needs no answer here: complete() decides --
        # refused if a newer attempt took the key (Superseded), accepted as a late reply if the
        # key only turned unknown.
        yield HeartbeatStop()
    # The business write and complete(attempt) commit together, or neither does.
    yield Begin()
    try:
        result = (yield Call(record, (conn, value))) if record else value
        ref = target_ref(value) if target_ref else None
        text = to_json(result)
        status = yield from status_flow(COMPLETE_SQL, (scope, key, attempt, text, ref))
    except InvalidState as refused:
        yield Rollback()
        raise Superseded(f'attempt {attempt} of key "{key}" in scope "{scope}" was superseded while it ran '
                         f'(its lease ran out{"" if not every else ": the heartbeat could not keep it"}); '
                         f'nothing recorded: {refused.message}') from refused
    except BaseException as err:
        yield Rollback()
        if not isinstance(err, Exception):
            raise               # cancelled or interrupted in record(): its write is undone, the connection
                                # left with no transaction open; the attempt is in doubt, left to its lease
        # The call succeeded and our write did not: only a target that honours the key makes a
        # new attempt safe; otherwise leave it in doubt (the lookup will find the action).
        if honours_key:
            yield from after_error(claim, lambda e: True, True, err)
        raise
    yield Commit()
    return Done(scope, key, status, attempt, as_stored(text), ref)


def error_text(err):
    return f'{type(err).__name__}: {err}'[:1000]


def after_error(claim, retryable, honours_key, err):
    """fail() as the rule decides; -> the decision (True, False, None)."""
    decision = decide(retryable, honours_key, err)
    if decision is None:
        return None
    try:
        yield Begin()
        yield Sql(FAIL_SQL, (claim.scope, claim.key, claim.attempt, error_text(err), decision))
        yield Commit()
    except InvalidState:
        yield Rollback()        # superseded meanwhile: not ours to release; the newer attempt decides
        return None
    return decision


def verify_flow(conn, claim, pkey, lookup, record, target_ref):
    """The claim answered unknown (this caller holds the verification lease): look the action up
    and verify.  -> Done if it was found (recorded with verify in one transaction), None if not
    found and now retryable.  Raises Unknown while verify_settle has not passed, and re-raises a
    refused verify (another verifier, a newer attempt) as Superseded."""
    found = yield Call(lookup, (pkey,), outside=True)
    settle = (None, None)
    yield Begin()
    try:
        if found is not None:
            result = (yield Call(record, (conn, found))) if record else found
            ref = target_ref(found) if target_ref else None
            text = to_json(result)
            status = yield from status_flow(VERIFY_SQL, (claim.scope, claim.key, claim.attempt, True, ref, text))
        else:
            status = yield from status_flow(VERIFY_SQL, (claim.scope, claim.key, claim.attempt, False, None, None))
            if status is Status.UNKNOWN:
                settle = yield from settle_window_flow(claim)
    except InvalidState as refused:
        yield Rollback()
        raise Superseded(f'verify of attempt {claim.attempt} of key "{claim.key}" in scope "{claim.scope}" '
                         f'was refused: {refused.message}') from refused
    except BaseException:
        yield Rollback()
        raise
    yield Commit()
    if found is not None:
        return Done(claim.scope, claim.key, status, claim.attempt, as_stored(text), ref, verified=True)
    if status is Status.RETRYABLE:
        return None
    last, settles_at = settle
    if settles_at is not None:
        when = (f'the settle window ends at {settles_at.isoformat()} (the end of attempt {claim.attempt}\'s lease, '
                f'{last.isoformat()}, + the scope\'s verify_settle)')
    elif last is not None:
        when = (f'the settle window ends the scope\'s verify_settle after {last.isoformat()} (the end of attempt '
                f'{claim.attempt}\'s lease; this role cannot read idempo.scopes)')
    else:
        when = 'the settle window (verify_settle after the attempt\'s lease ended) has not passed'
    err = Unknown(claim, f'key "{claim.key}" in scope "{claim.scope}": attempt {claim.attempt} was not found in the '
                         f'target system, but too early to believe it (a lagging replica, a request still in flight): '
                         f'{when}; call again with the same key after then: it looks the action up again')
    err.settles_at = settles_at
    raise err


SETTLE_SQL = ("SELECT last_attempt_at, has_table_privilege('idempo.scopes', 'SELECT') FROM idempo.lookup(%s, %s) "
              'WHERE scope IS NOT NULL')
VERIFY_SETTLE_SQL = 'SELECT %s::timestamptz + verify_settle FROM idempo.scopes WHERE name = %s'


def settle_window_flow(claim):
    """-> (last_attempt_at, when the settle window ends or None): verify_settle counts from the end
    of the attempt's lease, which an unknown record keeps in last_attempt_at (docs/time-and-doubt.md).
    The scope's verify_settle only when this role may read idempo.scopes."""
    row = yield Sql(SETTLE_SQL, (claim.scope, claim.key))
    if row is None or row[0] is None:
        return (None, None)
    if not row[1]:
        return (row[0], None)
    ends = yield Sql(VERIFY_SETTLE_SQL, (row[0], claim.scope))
    return (row[0], ends[0] if ends else None)


def translate(err: BaseException) -> BaseException:
    typed = from_database_error(err)
    if typed is None:
        return err
    typed.__cause__ = err
    return typed
