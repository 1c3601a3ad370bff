'use strict';
// The errors of idempo as classes.  Two families:
//  - refusals of the database (a SQLSTATE, see docs/errors.md), mapped by fromDatabaseError();
//  - outcomes the helpers cannot turn into a result (conflict, busy, in review...), which carry
//    the claim they came from.
// Every class extends IdempoError, so `err instanceof IdempoError` catches all of idempo's.

class IdempoError extends Error {
  constructor(message, { code, detail, hint, cause, scope, key } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    if (code !== undefined) this.code = code;
    if (detail !== undefined) this.detail = detail;
    if (hint !== undefined) this.hint = hint;
    if (scope !== undefined) this.scope = scope;
    if (key !== undefined) this.key = key;
  }
}

// --- refusals: one class per SQLSTATE of docs/errors.md --------------------------------------
class InvalidArgumentError extends IdempoError {}      // 22004, 22023
class NotFoundError extends IdempoError {}             // 42704: unknown scope, no such operation
class AlreadyExistsError extends IdempoError {}        // 42710
class PermissionDeniedError extends IdempoError {}     // 42501: outside the scope's allowed_role
class StateError extends IdempoError {}                // 55000: superseded attempt, disabled scope...
class LockNotAvailableError extends IdempoError {}     // 55P03
class SerializationError extends IdempoError {}        // 40001: retry the transaction
class ReadOnlyError extends IdempoError {}             // 25006: read-only transaction, standby
class NotReplicatedError extends IdempoError {}        // ID001: durability => 'replicated'
class UndefinedFunctionError extends IdempoError {}    // 42883
class FeatureNotSupportedError extends IdempoError {}  // 0A000
class DependentObjectsError extends IdempoError {}     // 2BP01
// The database's idempo is missing, or of a version this library does not support.
class UnsupportedVersionError extends IdempoError {}
// The connection to the database was lost, or none could be had (a restart, a terminated
// backend, a server not accepting connections yet): the transaction it held did not commit
// (unless it was lost during COMMIT, when nobody can tell: a retry with the same key replays
// what did).  The driver's error is its cause.
class ConnectionLostError extends IdempoError {
  // err (the driver's) as a ConnectionLostError, its cause
  static of(err, scope, key) {
    if (err instanceof ConnectionLostError) return err;
    const message = err && err.message ? err.message : String(err);
    return new ConnectionLostError(`the connection to the database was lost or could not be had (${message}): its `
      + 'transaction did not commit, unless it was lost during COMMIT; retry with the same key (a replay answers if it did)',
    { code: databaseErrorOf(err).code, cause: err, scope, key });
  }
}

const BY_SQLSTATE = {
  '22004': InvalidArgumentError,
  '22023': InvalidArgumentError,
  '42704': NotFoundError,
  '42710': AlreadyExistsError,
  '42501': PermissionDeniedError,
  '55000': StateError,
  '55P03': LockNotAvailableError,
  '40001': SerializationError,
  '25006': ReadOnlyError,
  'ID001': NotReplicatedError,
  '42883': UndefinedFunctionError,
  '0A000': FeatureNotSupportedError,
  '2BP01': DependentObjectsError,
};

// An error of the driver (pg, Knex over pg, Prisma's raw queries) as idempo's class for its
// SQLSTATE, a lost connection as ConnectionLostError; anything else (an unrelated SQLSTATE) is
// returned unchanged.
function fromDatabaseError(err, scope, key) {
  if (err instanceof IdempoError || err === null || typeof err !== 'object') return err;
  if (isConnectionError(err)) return ConnectionLostError.of(err, scope, key);
  const found = databaseErrorOf(err);
  const Class = found.code && BY_SQLSTATE[found.code];
  if (!Class) return err;
  return new Class(found.message, { code: found.code, detail: found.detail, hint: found.hint, cause: err, scope, key });
}

// Where each driver puts the database's error: pg and Knex on the error itself (.code, .detail,
// .hint); Prisma's raw queries in .meta, under an error whose own .code is Prisma's P2010 ("raw
// query failed", which looks like a SQLSTATE): .meta.code with its query engine (Prisma 5, 6),
// .meta.driverAdapterError.cause with a driver adapter (Prisma 7, @prisma/adapter-pg).
const SQLSTATE = /^[0-9A-Z]{5}$/;
function databaseErrorOf(err) {
  if (err === null || typeof err !== 'object') return {};
  const meta = err.meta !== null && typeof err.meta === 'object' ? err.meta : null;
  const cause = meta && meta.driverAdapterError && meta.driverAdapterError.cause;
  if (cause && typeof cause === 'object') {
    const code = [cause.originalCode, cause.code].find((c) => typeof c === 'string' && SQLSTATE.test(c));
    if (code) return { code, message: cause.originalMessage ?? cause.message ?? err.message, detail: cause.detail, hint: cause.hint };
  }
  if (meta && typeof meta.code === 'string' && SQLSTATE.test(meta.code)) {
    return { code: meta.code, message: meta.message ?? err.message, detail: meta.detail, hint: meta.hint };
  }
  if (typeof err.code === 'string' && SQLSTATE.test(err.code)) {
    return { code: err.code, message: err.message, detail: err.detail, hint: err.hint };
  }
  return {};
}
const sqlstateOf = (err) => databaseErrorOf(err).code;

// Whether an error means that the connection was lost or could not be had.  The server's
// SQLSTATEs (class 08; 57P01-57P03: terminated by an administrator or a shutdown, not accepting
// connections yet), the socket's errors, and node-postgres' own messages for a connection that
// ended (they carry no code).
const CONNECTION_SQLSTATES = new Set(['57P01', '57P02', '57P03']);
const SOCKET_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ENOENT', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH',
  'ENETUNREACH', 'EAI_AGAIN']);
const PG_CONNECTION_MESSAGES = /^(Connection terminated|Client has encountered a connection error|Client was closed and is not queryable|timeout exceeded when trying to connect)/;
function isConnectionError(err) {
  if (err instanceof ConnectionLostError) return true;
  if (err === null || typeof err !== 'object') return false;
  const code = databaseErrorOf(err).code;
  if (code) return code.startsWith('08') || CONNECTION_SQLSTATES.has(code);
  if (typeof err.code === 'string' && SOCKET_CODES.has(err.code)) return true;
  return typeof err.message === 'string' && PG_CONNECTION_MESSAGES.test(err.message);
}

// --- outcomes the helpers raise ---------------------------------------------------------------
class OutcomeError extends IdempoError {
  constructor(message, claim, extra = {}) {
    super(message, { scope: extra.scope, key: extra.key });
    this.outcome = claim ? claim.outcome : undefined;
    this.status = claim ? claim.status : undefined;
    this.claim = claim;
  }
}
// The same key with other parameters.  conflictId names the row of idempo.conflicts, kept
// whatever the transaction does next; null where the conflict is recorded in this transaction
// only (the server's WARNING says why), so that a rollback does not keep it;
// changedFields is [{field, stored, incoming}] in store_params scopes, else null.
class ConflictError extends OutcomeError {
  constructor(message, claim, extra = {}) {
    super(message, claim, extra);
    this.conflictId = claim ? claim.conflictId : null;
    this.changedFields = extra.changedFields ?? null;
  }
}
// Another worker holds the key (its transaction, its lease, or its verification of an unknown
// outcome).  retryAfterMs: when it is worth asking again.
class BusyError extends OutcomeError {
  constructor(message, claim, extra = {}) {
    super(message, claim, extra);
    this.leaseExpiresAt = claim ? claim.leaseExpiresAt : null;
    this.retryAfterMs = extra.retryAfterMs ?? null;
  }
}
// in_review or stale: nothing automatic may run it; a person decides (idempo.resolve).
class InReviewError extends OutcomeError {
  constructor(message, claim, extra = {}) {
    super(message, claim, extra);
    this.reviewId = claim ? claim.reviewId : null;
  }
}
// stale: no record, and the intent is older than the scope's retention (claim's intent_at): the
// record may have been purged, so "new" cannot be proven; a review was opened.
class StaleError extends InReviewError {}
// expired: a remembered key whose result is gone (scopes with `remember`).
class ExpiredError extends OutcomeError {}
// The outcome of an attempt is in doubt and could not be settled now: the key is `unknown`
// (or will be when the lease runs out) until a lookup in the target system verifies it.
class UnknownOutcomeError extends OutcomeError {
  constructor(message, claim, extra = {}) {
    super(message, claim, extra);
    this.attempt = extra.attempt ?? (claim ? claim.attempt : null);
    if (extra.cause !== undefined) this.cause = extra.cause;
  }
}
// The attempt lost its key while it ran (its lease ran out and another worker took the key
// over, or a person resolved it): this worker's result was not recorded.
class LeaseLostError extends IdempoError {}

module.exports = {
  IdempoError, InvalidArgumentError, NotFoundError, AlreadyExistsError, PermissionDeniedError,
  StateError, LockNotAvailableError, SerializationError, ReadOnlyError, NotReplicatedError,
  UndefinedFunctionError, FeatureNotSupportedError, DependentObjectsError, UnsupportedVersionError, ConnectionLostError,
  OutcomeError, ConflictError, BusyError, InReviewError, StaleError, ExpiredError, UnknownOutcomeError,
  LeaseLostError, fromDatabaseError, BY_SQLSTATE, sqlstateOf, isConnectionError,
};
