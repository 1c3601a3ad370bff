"""Outcomes, statuses, results and errors of idempo, as Python types.

Everything the SQL API answers as a string or a SQLSTATE arrives here as an enum member, a frozen
dataclass or an exception class, so that callers dispatch with `is`, `match` and `except`, and a
misspelt outcome is an AttributeError instead of a branch that never runs.
"""
from __future__ import annotations

import datetime as _dt
import enum
from dataclasses import dataclass
from typing import Any, Optional

__all__ = [
    'Outcome', 'Status', 'Claim', 'Done', 'Operation',
    'IdempoError', 'NotAcquired', 'Busy', 'Conflict', 'Unknown', 'InReview', 'Stale', 'Expired',
    'ActionFailed', 'Superseded', 'LeaseLost',
    'DatabaseRefusal', 'NotFound', 'InvalidState', 'PermissionDenied', 'InvalidArgument',
    'LockNotAvailable', 'SerializationFailure', 'ReadOnly', 'ClaimNotReplicated',
    'UndefinedFunction', 'UnsupportedVersion', 'from_database_error', 'sqlstate_of',
]


class Outcome(str, enum.Enum):
    """What a claim answered (idempo.outcome)."""
    ACQUIRED = 'acquired'
    REPLAY = 'replay'
    BUSY = 'busy'
    CONFLICT = 'conflict'
    UNKNOWN = 'unknown'
    IN_REVIEW = 'in_review'
    STALE = 'stale'
    EXPIRED = 'expired'


class Status(str, enum.Enum):
    """The status of an operation (idempo.status)."""
    IN_PROGRESS = 'in_progress'
    SUCCEEDED = 'succeeded'
    FAILED = 'failed'
    RETRYABLE = 'retryable'
    UNKNOWN = 'unknown'
    IN_REVIEW = 'in_review'


@dataclass(frozen=True)
class Claim:
    """One answer of idempo.claim (idempo.claim_result) with the scope and key it was for.
    first_seen_at and completed_at are read by claim() only (None in once, call_once and the
    middleware, which do not use them)."""
    scope: str
    key: str
    outcome: Outcome
    status: Optional[Status]
    attempt: Optional[int]
    result: Any = None
    target_ref: Optional[str] = None
    error: Optional[str] = None
    first_seen_at: Optional[_dt.datetime] = None
    lease_expires_at: Optional[_dt.datetime] = None
    conflict_id: Optional[int] = None
    review_id: Optional[int] = None
    completed_at: Optional[_dt.datetime] = None
    now: Optional[_dt.datetime] = None          # idempo.now() when the claim answered (where asked)

    @property
    def acquired(self) -> bool:
        return self.outcome is Outcome.ACQUIRED

    @property
    def replayed(self) -> bool:
        return self.outcome is Outcome.REPLAY

    def retry_after(self, default: float = 1.0) -> float:
        """Seconds until a busy key's lease ends (at least 0.05), or default if not known.  By
        idempo's clock where the claim asked for it, else by this machine's."""
        if self.lease_expires_at is None:
            return default
        now = self.now or _dt.datetime.now(_dt.timezone.utc)
        return max(0.05, (self.lease_expires_at - now).total_seconds())


@dataclass(frozen=True)
class Done:
    """How a unit of work ended: run now, replayed, or settled by a lookup (verify)."""
    scope: str
    key: str
    status: Status
    attempt: Optional[int]
    result: Any = None
    target_ref: Optional[str] = None
    error: Optional[str] = None
    replayed: bool = False
    verified: bool = False

    @property
    def succeeded(self) -> bool:
        return self.status is Status.SUCCEEDED

    @property
    def failed(self) -> bool:
        return self.status is Status.FAILED


@dataclass(frozen=True)
class Operation:
    """A row of idempo.operations, as idempo.lookup returns it (the columns this library reads)."""
    scope: str
    key: str
    status: Status
    attempt: int
    result: Any = None
    target_ref: Optional[str] = None
    error: Optional[str] = None
    first_seen_at: Optional[_dt.datetime] = None
    last_attempt_at: Optional[_dt.datetime] = None
    lease_expires_at: Optional[_dt.datetime] = None
    completed_at: Optional[_dt.datetime] = None


# ---------------------------------------------------------------------------------------------
# Errors

class IdempoError(Exception):
    """Base of every exception this library raises."""


class NotAcquired(IdempoError):
    """The claim did not hand this caller the work, and the helper was told not to answer it
    itself.  .claim is the whole answer."""
    outcome: Outcome

    def __init__(self, claim: Claim, message: Optional[str] = None):
        self.claim = claim
        super().__init__(message or f'key "{claim.key}" in scope "{claim.scope}": {claim.outcome.value}'
                         + (f' (status {claim.status.value})' if claim.status else ''))


class Busy(NotAcquired):
    """Another caller holds the key (an uncommitted claim, a running lease, a verifier)."""
    outcome = Outcome.BUSY

    def __init__(self, claim: Claim, message: Optional[str] = None):
        if message is None and claim.lease_expires_at is not None:
            # say what to do: after a lost reply the key stays busy until the attempt's lease ends
            message = (f'key "{claim.key}" in scope "{claim.scope}": busy (status '
                       f'{claim.status.value if claim.status else "?"}) until its lease ends at '
                       f'{claim.lease_expires_at.isoformat()}; retry after {claim.retry_after():.1f} s with the '
                       "same key, or pass on_busy='wait' with a busy_timeout longer than that")
        super().__init__(claim, message)

    @property
    def retry_after(self) -> float:
        return self.claim.retry_after()


class Conflict(NotAcquired):
    """The key was first used with other parameters.  conflict_id names the row in
    idempo.conflicts, kept whatever this transaction does next; None where the conflict is
    recorded in this transaction only (the server's WARNING says why: no sweeper serves the
    database), so a rollback does not keep it.  changed_fields lists [{"field", "stored",
    "incoming"}] in scopes with store_params (None elsewhere)."""
    outcome = Outcome.CONFLICT

    def __init__(self, claim: Claim, changed_fields: Optional[list] = None):
        self.conflict_id = claim.conflict_id
        self.changed_fields = changed_fields
        names = ', '.join(f['field'] for f in changed_fields or [] if isinstance(f, dict) and 'field' in f)
        super().__init__(claim, f'key "{claim.key}" in scope "{claim.scope}" was first used with other parameters'
                         + (f' (changed: {names})' if names else '')
                         + (f'; conflict {claim.conflict_id}' if claim.conflict_id is not None
                            else '; recorded in this transaction only'))


class Unknown(NotAcquired):
    """The key's attempt may or may not have taken effect: look it up and verify.  .settles_at:
    when a lookup found nothing too early to believe it, the end of the settle window (the end of
    the attempt's lease + the scope's verify_settle; None if unknown): call again after it."""
    outcome = Outcome.UNKNOWN
    settles_at = None


class InReview(NotAcquired):
    """The key waits for a person (idempo.review_queue)."""
    outcome = Outcome.IN_REVIEW


class Stale(NotAcquired):
    """intent_at is older than the retention: "new" cannot be proven; a review was opened."""
    outcome = Outcome.STALE


class Expired(NotAcquired):
    """Done long ago (a scope with remember): the result is gone; do not run again."""
    outcome = Outcome.EXPIRED


_NOT_ACQUIRED = {Outcome.BUSY: Busy, Outcome.UNKNOWN: Unknown, Outcome.IN_REVIEW: InReview,
                 Outcome.STALE: Stale, Outcome.EXPIRED: Expired}


def not_acquired(claim: Claim) -> NotAcquired:
    return _NOT_ACQUIRED[claim.outcome](claim)


class ActionFailed(IdempoError):
    """The action ended as a final failure (fail(retryable => false)), now or in a replay."""

    def __init__(self, done: Done):
        self.done = done
        super().__init__(f'key "{done.key}" in scope "{done.scope}" failed: {done.error}')


class Superseded(IdempoError):
    """This attempt's write was refused because a newer attempt exists (fencing): its lease ran
    out while it worked.  What it did is not recorded; the newer attempt decides."""


class LeaseLost(Superseded):
    """The heartbeat was refused: the lease had run out and the key moved on."""


class DatabaseRefusal(IdempoError):
    """idempo refused a call: .sqlstate, .message, .detail, .hint from the server."""
    sqlstate: Optional[str] = None

    def __init__(self, message: str, sqlstate: Optional[str] = None, detail: Optional[str] = None,
                 hint: Optional[str] = None):
        super().__init__(message + (f'\nHINT: {hint}' if hint else ''))
        self.message, self.detail, self.hint = message, detail, hint
        if sqlstate:
            self.sqlstate = sqlstate


class NotFound(DatabaseRefusal):
    """42704: unknown scope, no such operation, unknown conflict."""
    sqlstate = '42704'


class InvalidState(DatabaseRefusal):
    """55000: disabled scope; record not in_progress; superseded attempt; ..."""
    sqlstate = '55000'


class PermissionDenied(DatabaseRefusal):
    """42501: a role outside the scope's allowed_role."""
    sqlstate = '42501'


class InvalidArgument(DatabaseRefusal):
    """22023 / 22004: empty or too long scope or key, bad settings, NULL where not allowed."""
    sqlstate = '22023'


class LockNotAvailable(DatabaseRefusal):
    """55P03: wait => false met a table lock (CREATE INDEX, LOCK TABLE...)."""
    sqlstate = '55P03'


class SerializationFailure(DatabaseRefusal):
    """40001: REPEATABLE READ / SERIALIZABLE met a concurrent change: retry the transaction."""
    sqlstate = '40001'


class ReadOnly(DatabaseRefusal):
    """25006: the claim must write, and the transaction is read-only (or a standby)."""
    sqlstate = '25006'


class ClaimNotReplicated(DatabaseRefusal):
    """ID001: a durability => 'replicated' scope, and the commit would not wait for a standby."""
    sqlstate = 'ID001'


class UndefinedFunction(DatabaseRefusal):
    """42883: a function of this library's SQL API is missing (an older idempo)."""
    sqlstate = '42883'


class UnsupportedVersion(IdempoError):
    """The database's idempo SQL objects are of a version this library does not support."""

    def __init__(self, found: Optional[str], needed: str, library: str, no_version_function: bool = False):
        self.found, self.needed = found, needed
        where = ('idempo is not installed in this database' if found is None
                 else f'the database has idempo {found} without idempo.version() (older SQL objects)'
                 if no_version_function else f'the database has idempo {found}')
        super().__init__(f'{where}; this library (idempo for Python {library}) needs idempo {needed}: '
                         f'CREATE EXTENSION idempo, ALTER EXTENSION idempo UPDATE, or the library of '
                         f'the database\'s version (docs/upgrading.md)')


# Each refusal's class by its sqlstate (written once, on the class), and 22004 (a NULL where
# none is allowed) as InvalidArgument too.
_BY_SQLSTATE = {cls.sqlstate: cls for cls in DatabaseRefusal.__subclasses__()}
_BY_SQLSTATE['22004'] = InvalidArgument


def sqlstate_of(err: BaseException) -> Optional[str]:
    """The SQLSTATE of a driver's error: psycopg's .sqlstate, psycopg2's .pgcode, or that of the
    error it wraps (Django's and SQLAlchemy's wrappers keep the driver's as the cause)."""
    seen = 0
    while err is not None and seen < 5:
        for attr in ('sqlstate', 'pgcode'):
            code = getattr(err, attr, None)
            if isinstance(code, str) and code:
                return code
        err = getattr(err, 'orig', None) or err.__cause__
        seen += 1
    return None


def _diag(err: BaseException):
    """(message, detail, hint) of a driver's error, as far as it tells."""
    while err is not None:
        diag = getattr(err, 'diag', None)
        if diag is not None and getattr(diag, 'message_primary', None):
            return diag.message_primary, diag.message_detail, diag.message_hint
        nxt = getattr(err, 'orig', None) or err.__cause__
        if nxt is None:
            break
        err = nxt
    return str(err).strip().split('\n')[0], None, None


def from_database_error(err: BaseException) -> Optional[DatabaseRefusal]:
    """The typed exception for a database error raised by an idempo call, or None if err is not
    a database error with a SQLSTATE."""
    code = sqlstate_of(err)
    if code is None:
        return None
    message, detail, hint = _diag(err)
    return _BY_SQLSTATE.get(code, DatabaseRefusal)(message, code, detail, hint)
