"""The blocking API: psycopg 3 connections, psycopg2 and any DB-API connection whose paramstyle
is "format" (%s), Django's connection and SQLAlchemy sessions (unwrapped to the driver's
connection, so the calls run in the caller's transaction)."""
from __future__ import annotations

import datetime as _dt
import functools
import inspect
import threading
import time
import weakref
from typing import Any, Callable, Optional

from . import _flow as F
from ._types import (ActionFailed, Claim, Done, IdempoError, InvalidState, LeaseLost, Operation, Outcome,
                     Status)


class NoTransaction(IdempoError):
    """once()/@idempotent run in the caller's transaction, and none is open."""


class InTransaction(IdempoError):
    """call_once() commits its claim before the call, so it needs a connection with no transaction open."""


def unwrap(conn):
    """The driver's connection under Django's or SQLAlchemy's wrappers (the same session, so the
    same transaction); any other object is taken as a DB-API connection."""
    module = type(conn).__module__ or ''
    if module.startswith('django.'):
        conn.ensure_connection()
        return conn.connection
    if module.startswith('sqlalchemy.'):
        if hasattr(conn, 'get_bind'):               # Session
            conn = conn.connection()
        fairy = getattr(conn, 'connection', conn)    # Connection -> pooled DB-API connection
        return getattr(fairy, 'dbapi_connection', fairy)
    return conn


def transaction_open(raw) -> bool:
    pgconn = getattr(raw, 'pgconn', None)
    if pgconn is not None and hasattr(raw, 'info'):                   # psycopg 3, without its enum
        return pgconn.transaction_status != 0
    info = getattr(raw, 'info', None)
    if info is not None and hasattr(info, 'transaction_status'):     # psycopg 3
        return int(info.transaction_status) != 0
    status = getattr(raw, 'get_transaction_status', None)            # psycopg2
    if status is not None:
        return status() != 0
    return not getattr(raw, 'autocommit', False)


def _tuple_row():
    from psycopg.rows import tuple_row
    return tuple_row


_checked: 'weakref.WeakKeyDictionary[Any, str]' = weakref.WeakKeyDictionary()
_checked_lock = threading.Lock()


# A Runner kept per connection holds it weakly, and its psycopg 3 cursor lives on the connection
# (a cycle the collector frees): a value of this dictionary that held its key strongly would keep
# every connection the library ever saw alive.
_runners: 'weakref.WeakKeyDictionary[Any, Runner]' = weakref.WeakKeyDictionary()


def runner_for(conn) -> 'Runner':
    """The Runner of a driver's connection, made once and kept as long as the connection (with
    its version check); a wrapper (Django, SQLAlchemy) gets a new one each time, since the
    connection under it may change."""
    try:
        runner = _runners.get(conn)
    except TypeError:                 # not weakly referable
        return Runner(conn)
    if runner is None:
        if unwrap(conn) is not conn:
            return Runner(conn)
        # two threads may get here at once: one Runner per connection (its lock keeps the
        # heartbeat's BEGIN/heartbeat/COMMIT apart from the other statements), so the first wins
        runner = Runner(conn, kept=True)
        with _checked_lock:
            runner = _runners.setdefault(conn, runner)
    return runner


class Runner:
    """Runs a flow's operations on one connection."""

    def __init__(self, conn, kept=False):
        # kept (in _runners): the connection weakly; the caller holds it during a call, a Once
        # for as long as it lives
        if kept:
            self._conn = self._raw = weakref.ref(conn)
        else:
            raw = unwrap(conn)
            self._conn, self._raw = (lambda: conn), (lambda: raw)
        self.direct = hasattr(self.raw, 'execute') and hasattr(self.raw, 'pgconn')     # psycopg 3
        self.lock = threading.RLock()
        self.beat = None
        self.version = None

    @property
    def conn(self):
        return self._conn()

    @property
    def raw(self):
        return self._raw()

    def _cursor(self, raw):
        """psycopg 3: the library's one cursor of this connection, made once and kept on it."""
        cur = getattr(raw, '_idempo_cursor', None)
        if cur is None or cur.closed:
            cur = raw.cursor(row_factory=_tuple_row())
            try:
                raw._idempo_cursor = cur
            except AttributeError:          # a connection class without attributes: not kept
                pass
        return cur

    # -- database
    def execute(self, sql, args, fetch=True):
        """One statement; -> its first row (fetch) or None.  psycopg 3: one cursor, kept (a
        cursor made per statement, as Connection.execute makes one, cost about as much client
        CPU as the rest of what once() adds), reading tuples whatever the connection's
        row_factory; any other DB-API connection goes through a cursor per statement."""
        with self.lock:
            if self.direct:
                cur = self._cursor(self.raw)
                cur.execute(sql, args)
                return cur.fetchone() if fetch else None
            cur = self.raw.cursor()
            try:
                cur.execute(sql, args)
                return cur.fetchone() if fetch else None
            finally:
                cur.close()

    def value(self, sql, args):
        """One statement, its error typed; -> the first column of its first row, as text.
        psycopg 3: an ASCII value (an attempt, a status) read straight from libpq's result,
        without building the row (fetchone() cost once() about as much client CPU as the rest
        it adds); anything else through fetchone(), decoded as the connection's encoding says."""
        try:
            with self.lock:
                if self.direct:
                    cur = self._cursor(self.raw)
                    cur.execute(sql, args)
                    res = cur.pgresult
                    if res is not None and res.ntuples == 1:
                        v = res.get_value(0, 0)
                        if v is not None and v.isascii():
                            return v.decode('ascii')
                    return cur.fetchone()[0]
            return self.execute(sql, args)[0]
        except Exception as err:
            typed = F.translate(err)
            if typed is err:
                raise
            raise typed from err

    def begin(self):
        if getattr(self.raw, 'autocommit', False):
            self.execute('BEGIN', None, False)

    def commit(self):
        if getattr(self.raw, 'autocommit', False):
            self.execute('COMMIT', None, False)
        else:
            with self.lock:
                self.raw.commit()

    def rollback(self):
        try:
            if getattr(self.raw, 'autocommit', False):
                self.execute('ROLLBACK', None, False)
            else:
                with self.lock:
                    self.raw.rollback()
        except Exception:
            pass                # the connection is gone: nothing to roll back

    def beat_once(self, op):
        """One heartbeat, committed (the Heartbeat thread's)."""
        with self.lock:
            self.begin()
            try:
                self.execute(F.HEARTBEAT_SQL, (op.scope, op.key, op.attempt, op.extend))
            except BaseException:
                self.rollback()
                raise
            self.commit()

    # -- the flow
    def query(self, sql, args, fetch=True):
        """One statement, its error typed (idempo's exception for a SQLSTATE)."""
        try:
            return self.execute(sql, args, fetch)
        except Exception as err:
            typed = F.translate(err)
            if typed is err:
                raise
            raise typed from err

    def ensure_version(self):
        if self.version is not None:
            return self.version
        try:
            if self.raw in _checked:
                self.version = _checked[self.raw]
                return self.version
        except TypeError:        # not weakly referable: check every time
            return self.run(F.version_flow(), check=False)
        found = self.run(F.version_flow(), check=False)
        with _checked_lock:
            _checked[self.raw] = found
        self.version = found
        return found

    def run(self, gen, check=True):
        if check:
            self.ensure_version()
        send, throw = None, None
        while True:
            try:
                op = gen.throw(throw) if throw is not None else gen.send(send)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            try:
                send = self.do(op)
            except BaseException as err:      # noqa: B902 -- thrown into the flow, which re-raises
                throw = err

    def do(self, op):
        if isinstance(op, F.Sql):
            return self.query(op.sql, op.args, op.fetch)
        if isinstance(op, F.Call):
            return op.fn(*op.args)
        if isinstance(op, F.Begin):
            return self.begin()
        if isinstance(op, F.Commit):
            return self.commit()
        if isinstance(op, F.Rollback):
            return self.rollback()
        if isinstance(op, F.Sleep):
            return time.sleep(op.seconds)
        if isinstance(op, F.Clock):
            return time.monotonic()
        if isinstance(op, F.HeartbeatStart):
            self.beat = Heartbeat(self, op)
            self.beat.start()
            return None
        if isinstance(op, F.HeartbeatStop):
            beat, self.beat = self.beat, None
            return beat.stop() if beat else None
        raise TypeError(f'unknown operation {op!r}')


class Heartbeat(threading.Thread):
    """Extends the attempt's lease every `every` seconds while the user's call runs, on the same
    connection (idle meanwhile; the runner's lock keeps statements apart).  Stops at the first
    refusal: the lease was lost, and the complete() after the call will be refused (fencing)."""

    def __init__(self, runner: Runner, op: F.HeartbeatStart):
        super().__init__(name=f'idempo-heartbeat {op.scope}/{op.key}', daemon=True)
        self.runner, self.op = runner, op
        self.stopping = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self):
        op = self.op
        while not self.stopping.wait(op.every):
            try:
                self.runner.beat_once(op)
            except Exception as err:
                self.error = F.translate(err)
                return

    def stop(self):
        self.stopping.set()
        self.join()
        if isinstance(self.error, InvalidState):
            return LeaseLost(str(self.error))
        return self.error


# ---------------------------------------------------------------------------------------------
# The SQL API, typed

def version(conn) -> str:
    """The version of idempo's SQL objects in conn's database; raises UnsupportedVersion if this
    library does not support it.  Checked once per connection by every other call."""
    return runner_for(conn).ensure_version()


def claim(conn, scope: str, key: str, params: Any = None, *, wait: bool = True, run_id: Optional[str] = None,
          intent_at: Optional[_dt.datetime] = None, fingerprint: Optional[bytes] = None, lease=None,
          complete_on_commit: bool = False) -> Claim:
    """idempo.claim in conn's current transaction -> Claim (every outcome; nothing raised for them)."""
    return runner_for(conn).run(F.claim_flow(scope, key, params, wait=wait, run_id=run_id, intent_at=intent_at,
                                         fingerprint=fingerprint, lease=lease,
                                         complete_on_commit=complete_on_commit))


def complete(conn, scope: str, key: str, *, attempt: Optional[int] = None, result: Any = None,
             target_ref: Optional[str] = None) -> Status:
    return runner_for(conn).run(F.status_flow(F.COMPLETE_SQL, (scope, key, attempt, F.to_json(result), target_ref)))


def fail(conn, scope: str, key: str, *, attempt: Optional[int] = None, error: Optional[str] = None,
         retryable: bool = True) -> Status:
    return runner_for(conn).run(F.status_flow(F.FAIL_SQL, (scope, key, attempt, error, retryable)))


def verify(conn, scope: str, key: str, attempt: int, found: bool, *, target_ref: Optional[str] = None,
           result: Any = None) -> Status:
    return runner_for(conn).run(F.status_flow(F.VERIFY_SQL, (scope, key, attempt, found, target_ref,
                                                         F.to_json(result))))


def heartbeat(conn, scope: str, key: str, attempt: int, extend=None) -> _dt.datetime:
    """Extends the running attempt's lease; -> the new lease_expires_at."""
    return runner_for(conn).run(F.heartbeat_flow(scope, key, attempt, extend))


def lookup(conn, scope: str, key: str) -> Optional[Operation]:
    return runner_for(conn).run(F.lookup_flow(scope, key))


# ---------------------------------------------------------------------------------------------
# One-transaction work

class Once:
    """The context manager of once(): claims on entry; the block runs only for the work's owner.

        with conn.transaction(), idempo.once(conn, 'stock.reserve', 'order-1001', params) as op:
            if op.acquired:
                ...write...
                op.result = {...}          # stored by complete() when the block ends
        return op.result                   # the new result, or the stored one on a replay

    acquired -> run, and complete(result) on a normal exit (an exception completes nothing: your
    transaction rolls back and takes the claim with it); replay -> .result is the stored result
    (.failed and .error for a recorded failure); conflict -> Conflict; busy -> Busy, or waits up
    to busy_timeout seconds with on_busy='wait'; unknown, in_review, stale, expired -> their
    exceptions (a person or a verifier decides)."""

    def __init__(self, runner, scope, key, params, on_busy, busy_timeout, claim_kw):
        if on_busy not in ('raise', 'wait'):
            raise ValueError("on_busy must be 'raise' or 'wait'")
        self._runner, self.scope, self.key, self.params = runner, scope, key, params
        self._conn = runner.conn        # held while this lives: the kept Runner holds it weakly
        self._on_busy, self._busy_timeout, self._claim_kw = on_busy, busy_timeout, claim_kw
        self._claim: Optional[Claim] = None
        self._outcome: Optional[Outcome] = None
        self._attempt: Optional[int] = None
        self.result: Any = None
        self.target_ref: Optional[str] = None
        self.status: Optional[Status] = None
        self._finished = False

    @property
    def claim(self) -> Optional[Claim]:
        """The claim's answer (made when first asked for: an acquired claim reads only its attempt)."""
        if self._claim is None and self._outcome is Outcome.ACQUIRED:
            self._claim = Claim(self.scope, self.key, Outcome.ACQUIRED, Status.IN_PROGRESS, self._attempt)
        return self._claim

    @property
    def acquired(self) -> bool:
        return self._outcome is Outcome.ACQUIRED

    @property
    def replayed(self) -> bool:
        return self._outcome is Outcome.REPLAY

    @property
    def failed(self) -> bool:
        return self._outcome is Outcome.REPLAY and self._claim.status is Status.FAILED

    @property
    def error(self) -> Optional[str]:
        return self._claim.error if self._claim is not None else None

    @property
    def attempt(self) -> Optional[int]:
        return self._attempt

    def _claim_flow(self):
        if self._on_busy == 'raise':
            # one statement, one column; an acquired claim reads its attempt only: the hot path
            claim = yield from F.lean_claim_flow(self.scope, self.key, self.params, **self._claim_kw)
        else:
            claim = yield from F.claim_until_decided(self.scope, self.key, self.params, on_busy=self._on_busy,
                                                     busy_timeout=self._busy_timeout, **self._claim_kw)
        if claim.outcome not in (Outcome.ACQUIRED, Outcome.REPLAY):
            raise (yield from F.refusal_flow(claim))
        return claim

    def _entered(self, claim):
        self._claim, self._outcome, self._attempt = claim, claim.outcome, claim.attempt
        if claim.outcome is Outcome.REPLAY:
            self.result, self.target_ref, self.status = claim.result, claim.target_ref, claim.status
        return self

    def complete(self, result: Any = None, target_ref: Optional[str] = None) -> Status:
        """Completes now (else the block's end does, with .result and .target_ref)."""
        return self._finish(self._runner.run(self._complete_flow(result, target_ref), check=False))

    def fail(self, error: str, retryable: bool = True) -> Status:
        """Records a failure in this transaction: retryable frees the key, final is replayed."""
        return self._finish(self._runner.run(self._fail_flow(error, retryable), check=False))

    # complete() and fail() of both APIs (idempo.aio.Once awaits the same flows)
    def _owner(self, what):
        if not self.acquired or self._finished:
            raise IdempoError(f'{what}: key "{self.key}" in scope "{self.scope}" was not acquired by this block'
                              if not self.acquired else f'{what}: the operation is finished already')

    def _complete_args(self, result, target_ref):
        self._owner('complete')
        self.result, self.target_ref = result if result is not None else self.result, target_ref or self.target_ref
        text = F.to_json(self.result)
        self.result = F.stored(self.result, text)       # what a replay will read: the first answer agrees with it
        if self.target_ref is None:
            return F.COMPLETE_NO_REF_SQL, (self.scope, self.key, self._attempt, text)
        return F.COMPLETE_SQL, (self.scope, self.key, self._attempt, text, self.target_ref)

    def _complete_flow(self, result, target_ref):
        sql, args = self._complete_args(result, target_ref)
        return F.status_flow(sql, args)

    def _fail_flow(self, error, retryable):
        self._owner('fail')
        return F.status_flow(F.FAIL_SQL, (self.scope, self.key, self._attempt, error, retryable))

    def _finish(self, status):
        self.status, self._finished = status, True
        return status

    def __enter__(self):
        runner = self._runner
        if getattr(runner.raw, 'autocommit', False) and not transaction_open(runner.raw):
            raise NoTransaction(f'once({self.scope!r}, {self.key!r}) runs in your transaction, and the connection '
                                'has none open: use conn.transaction() (psycopg), transaction.atomic() (Django), '
                                'session.begin() (SQLAlchemy), or turn autocommit off')
        if self._on_busy != 'raise':
            return self._entered(runner.run(self._claim_flow()))
        # The hot path, without the flow's generators: the same statement and answers as
        # _claim_flow (the asyncio API runs that one).
        runner.ensure_version()
        sql, args = F.lean_claim(self.scope, self.key, self.params, **self._claim_kw)
        answer = F.lean_answer(self.scope, self.key, runner.value(sql, args))
        if type(answer) is int:
            self._outcome, self._attempt = Outcome.ACQUIRED, answer
            return self
        if answer.outcome is not Outcome.REPLAY and answer.outcome is not Outcome.ACQUIRED:
            raise runner.run(F.refusal_flow(answer), check=False)
        return self._entered(answer)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None and self._outcome is Outcome.ACQUIRED and not self._finished:
            # _complete_args(None, None) without the checks it makes (acquired, not finished)
            result = self.result
            text = None if result is None else F.ENCODER.encode(result)
            self.result = F.stored(result, text)         # what a replay will read: the first answer agrees with it
            if self.target_ref is None:
                sql, args = F.COMPLETE_NO_REF_SQL, (self.scope, self.key, self._attempt, text)
            else:
                sql, args = F.COMPLETE_SQL, (self.scope, self.key, self._attempt, text, self.target_ref)
            self.status, self._finished = F.STATUSES[self._runner.value(sql, args)], True
        return False


def once(conn, scope: str, key: str, params: Any = None, *, on_busy: str = 'raise', busy_timeout: float = 30.0,
         run_id: Optional[str] = None, intent_at: Optional[_dt.datetime] = None, fingerprint: Optional[bytes] = None,
         wait: bool = True) -> Once:
    """One-transaction work: see Once."""
    return Once(runner_for(conn), scope, key, params, on_busy, busy_timeout,
                dict(run_id=run_id, intent_at=intent_at, fingerprint=fingerprint, wait=wait))


def _spec(spec, arguments, args, kwargs, what):
    if spec is None:
        return None
    if callable(spec):
        return spec(*args, **kwargs)
    if isinstance(spec, str):
        if spec not in arguments:
            raise TypeError(f'{what} names argument {spec!r}, which the function does not have')
        return arguments[spec]
    return {name: arguments[name] for name in spec}


def idempotent(scope: str, *, key, params=None, conn='conn', on_busy: str = 'raise', busy_timeout: float = 30.0,
               raise_failed: bool = True):
    """Decorator for one-transaction work.  key, params and conn name arguments of the function
    (params may be a tuple of names: those count for the fingerprint) or are callables taking the
    function's arguments.  The function runs in the caller's transaction only when the claim
    acquires; its return value (JSON-serialisable) is stored and returned, and a replay returns
    the stored one without running.  Coroutine functions get the asyncio version (idempo.aio)."""
    def decorate(fn):
        signature = inspect.signature(fn)

        def prepare(args, kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            return (_spec(conn, a, args, kwargs, 'conn'), _spec(key, a, args, kwargs, 'key'),
                    _spec(params, a, args, kwargs, 'params'))

        if inspect.iscoroutinefunction(fn):
            from . import aio

            @functools.wraps(fn)
            async def async_wrapper(*args, **kwargs):
                c, k, p = prepare(args, kwargs)
                async with aio.once(c, scope, k, p, on_busy=on_busy, busy_timeout=busy_timeout) as op:
                    if op.acquired:
                        op.result = await fn(*args, **kwargs)
                return _replayed_value(op, raise_failed)
            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            c, k, p = prepare(args, kwargs)
            with once(c, scope, k, p, on_busy=on_busy, busy_timeout=busy_timeout) as op:
                if op.acquired:
                    op.result = fn(*args, **kwargs)
            return _replayed_value(op, raise_failed)
        return wrapper
    return decorate


def _replayed_value(op, raise_failed):
    if op.failed and raise_failed:
        raise ActionFailed(Done(op.scope, op.key, Status.FAILED, op.attempt, op.result, op.target_ref, op.error,
                                replayed=True))
    return op.result


# ---------------------------------------------------------------------------------------------
# Work that calls another system

def call_once(conn, scope: str, key: str, call: Callable[[str], Any], *, params: Any = None,
              lookup: Optional[Callable[[str], Any]] = None, record: Optional[Callable[[Any, Any], Any]] = None,
              retryable: Optional[Callable[[BaseException], Optional[bool]]] = None, honours_key: bool = False,
              target_ref: Optional[Callable[[Any], Optional[str]]] = None,
              provider_key: Optional[Callable[[str, str], str]] = None, lease=None, heartbeat: Optional[float] = None,
              extend=None, on_busy: str = 'raise', busy_timeout: float = 30.0, run_id: Optional[str] = None,
              intent_at: Optional[_dt.datetime] = None, retries: int = 0) -> Done:
    """The two-system flow, whole:

    1. claim and commit (the attempt holds the key by its lease);
    2. call(provider_key) -- the other system, with our key -- while a heartbeat extends the
       lease every `heartbeat` seconds (default: a third of the lease);
    3. record(conn, value) -> result (your business write) and complete(attempt, result) commit
       together; -> Done.
    If the call raises, retryable(err) decides: True -> fail(retryable) (the key is free for the
    next attempt) and the error is raised; False -> fail(final): -> Done(status FAILED), replayed
    so from then on; None -> in doubt: nothing is written and the error is raised; the lease runs
    out and the key becomes unknown.  Without a rule: honours_key=True (the other system
    deduplicates by our key) -> True, else None.  If record (or complete) raises after a
    successful call: fail(retryable) with honours_key, else in doubt.
    On unknown (a lease that ran out): lookup(provider_key) -> the found value or None; found ->
    record and verify(found) in one transaction; not found -> verify(not found), and the next
    attempt runs once verify_settle allows it.  A verify refused because another verifier or a
    newer attempt won (the verify race) claims again.  retries=N: after an error (retryable or
    in doubt) claim again up to N times instead of raising -- with on_busy='wait' and a
    busy_timeout longer than the lease, an attempt in doubt is waited out and looked up.  replay -> Done(replayed=True); conflict ->
    Conflict; busy -> Busy or waits (on_busy='wait'); in_review, stale, expired -> raised."""
    runner = runner_for(conn)
    if transaction_open(runner.raw):
        raise InTransaction(f'call_once({scope!r}, {key!r}) commits its claim before the call; the connection '
                            'has a transaction open (commit it first, or use a connection of its own)')
    return runner.run(F.call_flow(conn, scope, key, call, params=params, lookup=lookup, record=record,
                                  retryable=retryable, honours_key=honours_key, target_ref=target_ref,
                                  provider_key=provider_key, lease=lease, heartbeat=heartbeat, extend=extend,
                                  on_busy=on_busy, busy_timeout=busy_timeout, run_id=run_id, intent_at=intent_at,
                                  retries=retries))
