"""The asyncio API, for psycopg 3's AsyncConnection: the same functions and flows as the blocking
API (idempo._flow), awaited.  User callbacks (call, lookup, record) may be coroutine functions
or plain functions."""
from __future__ import annotations

import asyncio
import datetime as _dt
import inspect
import time
import weakref
from typing import Any, Callable, Optional

from . import _flow as F
from ._sync import InTransaction, NoTransaction, Once as _SyncOnce, transaction_open
from ._types import Claim, Done, InvalidState, LeaseLost, Operation, Status

_checked: 'weakref.WeakKeyDictionary[Any, str]' = weakref.WeakKeyDictionary()


class Runner:
    def __init__(self, conn):
        self.conn = self.raw = conn
        self.lock = asyncio.Lock()
        self.beat = None
        self.version = None

    async def execute(self, sql, args, locked=False, fetch=True):
        if not locked:
            async with self.lock:
                return await self.execute(sql, args, True, fetch)
        cur = await self.raw.execute(sql, args)
        return (await cur.fetchone()) if fetch else None

    async def begin(self, locked=False):
        if self.raw.autocommit:
            await self.execute('BEGIN', None, locked, False)

    async def commit(self, locked=False):
        if self.raw.autocommit:
            await self.execute('COMMIT', None, locked, False)
        else:
            await self.raw.commit()

    async def rollback(self, locked=False):
        try:
            if self.raw.autocommit:
                await self.execute('ROLLBACK', None, locked, False)
            else:
                await self.raw.rollback()
        except Exception:
            pass

    async def ensure_version(self):
        if self.version is not None:
            return self.version
        if self.raw in _checked:
            self.version = _checked[self.raw]
            return self.version
        found = await self.run(F.version_flow(), check=False)
        _checked[self.raw] = self.version = found
        return found

    async def run(self, gen, check=True):
        if check:
            await self.ensure_version()
        send, throw = None, None
        while True:
            try:
                op = gen.throw(throw) if throw is not None else gen.send(send)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            try:
                send = await self.do(op)
            except BaseException as err:      # noqa: B902 -- thrown into the flow, which re-raises
                throw = err

    async def do(self, op):
        if isinstance(op, F.Sql):
            try:
                return await self.execute(op.sql, op.args, fetch=op.fetch)
            except Exception as err:
                typed = F.translate(err)
                if typed is err:
                    raise
                raise typed from err
        if isinstance(op, F.Call):
            if op.outside and not inspect.iscoroutinefunction(op.fn):
                # a plain function calling another system blocks: run in the loop, it would stop
                # every other task and the heartbeat with them (the lease runs out under it)
                value = await asyncio.to_thread(op.fn, *op.args)
            else:
                value = op.fn(*op.args)
            return (await value) if inspect.isawaitable(value) else value
        if isinstance(op, F.Begin):
            return await self.begin()
        if isinstance(op, F.Commit):
            return await self.commit()
        if isinstance(op, F.Rollback):
            return await self.rollback()
        if isinstance(op, F.Sleep):
            return await asyncio.sleep(op.seconds)
        if isinstance(op, F.Clock):
            return time.monotonic()
        if isinstance(op, F.HeartbeatStart):
            self.beat = Heartbeat(self, op)
            return None
        if isinstance(op, F.HeartbeatStop):
            beat, self.beat = self.beat, None
            return (await beat.stop()) if beat else None
        raise TypeError(f'unknown operation {op!r}')


class Heartbeat:
    """An asyncio task extending the lease while the call is awaited."""

    def __init__(self, runner: Runner, op: F.HeartbeatStart):
        self.runner, self.op, self.error = runner, op, None
        self.stopping = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self.loop())

    async def loop(self):
        op = self.op
        while True:
            try:
                await asyncio.wait_for(self.stopping.wait(), op.every)
                return
            except asyncio.TimeoutError:
                pass
            try:
                async with self.runner.lock:
                    await self.runner.begin(True)
                    try:
                        await self.runner.execute(F.HEARTBEAT_SQL, (op.scope, op.key, op.attempt, op.extend), True)
                    except BaseException:
                        await self.runner.rollback(True)
                        raise
                    await self.runner.commit(True)
            except Exception as err:
                self.error = F.translate(err)
                return

    async def stop(self):
        """Ends the loop between two beats (a statement in flight is never cancelled)."""
        self.stopping.set()
        await self.task
        if isinstance(self.error, InvalidState):
            return LeaseLost(str(self.error))
        return self.error


async def version(conn) -> str:
    return await Runner(conn).ensure_version()


async def claim(conn, scope: str, key: str, params: Any = None, *, wait: bool = True, run_id: Optional[str] = None,
                intent_at: Optional[_dt.datetime] = None, fingerprint: Optional[bytes] = None, lease=None,
                complete_on_commit: bool = False) -> Claim:
    return await Runner(conn).run(F.claim_flow(scope, key, params, wait=wait, run_id=run_id, intent_at=intent_at,
                                               fingerprint=fingerprint, lease=lease,
                                               complete_on_commit=complete_on_commit))


async def complete(conn, scope: str, key: str, *, attempt: Optional[int] = None, result: Any = None,
                   target_ref: Optional[str] = None) -> Status:
    return await Runner(conn).run(F.status_flow(F.COMPLETE_SQL, (scope, key, attempt, F.to_json(result), target_ref)))


async def fail(conn, scope: str, key: str, *, attempt: Optional[int] = None, error: Optional[str] = None,
               retryable: bool = True) -> Status:
    return await Runner(conn).run(F.status_flow(F.FAIL_SQL, (scope, key, attempt, error, retryable)))


async def verify(conn, scope: str, key: str, attempt: int, found: bool, *, target_ref: Optional[str] = None,
                 result: Any = None) -> Status:
    return await Runner(conn).run(F.status_flow(F.VERIFY_SQL, (scope, key, attempt, found, target_ref,
                                                               F.to_json(result))))


async def heartbeat(conn, scope: str, key: str, attempt: int, extend=None) -> _dt.datetime:
    return await Runner(conn).run(F.heartbeat_flow(scope, key, attempt, extend))


async def lookup(conn, scope: str, key: str) -> Optional[Operation]:
    return await Runner(conn).run(F.lookup_flow(scope, key))


class Once(_SyncOnce):
    """async with idempo.aio.once(conn, scope, key, params) as op: ... (see idempo.Once)"""

    async def complete(self, result: Any = None, target_ref: Optional[str] = None) -> Status:
        return self._finish(await self._runner.run(self._complete_flow(result, target_ref), check=False))

    async def fail(self, error: str, retryable: bool = True) -> Status:
        return self._finish(await self._runner.run(self._fail_flow(error, retryable), check=False))

    def __enter__(self):
        raise TypeError('use "async with" with idempo.aio.once')

    async def __aenter__(self):
        if self._runner.raw.autocommit and not transaction_open(self._runner.raw):
            raise NoTransaction(f'once({self.scope!r}, {self.key!r}) runs in your transaction, and the connection '
                                'has none open: use "async with conn.transaction()"')
        return self._entered(await self._runner.run(self._claim_flow()))

    async def __aexit__(self, exc_type, exc, tb):
        if exc_type is None and self.acquired and not self._finished:
            self._finish(await self._runner.run(self._complete_flow(None, None), check=False))
        return False


def once(conn, scope: str, key: str, params: Any = None, *, on_busy: str = 'raise', busy_timeout: float = 30.0,
         run_id: Optional[str] = None, intent_at: Optional[_dt.datetime] = None, fingerprint: Optional[bytes] = None,
         wait: bool = True) -> Once:
    return Once(Runner(conn), scope, key, params, on_busy, busy_timeout,
                dict(run_id=run_id, intent_at=intent_at, fingerprint=fingerprint, wait=wait))


async def call_once(conn, scope: str, key: str, call: Callable[[str], Any], *, params: Any = None,
                    lookup: Optional[Callable[[str], Any]] = None, record: Optional[Callable[[Any, Any], Any]] = None,
                    retryable: Optional[Callable[[BaseException], Optional[bool]]] = None, honours_key: bool = False,
                    target_ref: Optional[Callable[[Any], Optional[str]]] = None,
                    provider_key: Optional[Callable[[str, str], str]] = None, lease=None,
                    heartbeat: Optional[float] = None, extend=None, on_busy: str = 'raise',
                    busy_timeout: float = 30.0, run_id: Optional[str] = None,
                    intent_at: Optional[_dt.datetime] = None, retries: int = 0) -> Done:
    """The two-system flow (see idempo.call_once), awaited."""
    if transaction_open(conn):
        raise InTransaction(f'call_once({scope!r}, {key!r}) commits its claim before the call; the connection '
                            'has a transaction open')
    return await Runner(conn).run(F.call_flow(conn, scope, key, call, params=params, lookup=lookup, record=record,
                                              retryable=retryable, honours_key=honours_key, target_ref=target_ref,
                                              provider_key=provider_key, lease=lease, heartbeat=heartbeat,
                                              extend=extend, on_busy=on_busy, busy_timeout=busy_timeout,
                                              run_id=run_id, intent_at=intent_at, retries=retries))
