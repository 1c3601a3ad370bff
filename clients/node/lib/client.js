'use strict';
// The Idempo class: idempo's SQL calls with typed answers, and the two helpers that dispatch
// every outcome of a claim, so that applications do not write that code again:
//   once(scope, key, options, fn)    the work is in this database: claim, fn, complete commit
//                                    together (one transaction)
//   callOnce(scope, key, options)     the work calls another system: the claim commits with a
//                                    lease (kept alive by a heartbeat while the call runs), then
//                                    complete or fail; an `unknown` outcome is looked up in the
//                                    other system and verified
const errors = require('./errors');
const adapters = require('./adapters');

const {
  fromDatabaseError, sqlstateOf, UnsupportedVersionError, ConflictError, BusyError, InReviewError,
  ExpiredError, UnknownOutcomeError, LeaseLostError, StateError, NotFoundError,
} = errors;

const LIBRARY_VERSION = '1.0.1';
// The versions of idempo's SQL objects this library works with: 0.3.x and 1.x (1.x keeps 0.3.0's API).
const SUPPORTED = /^(0\.3|1\.\d+)\.\d+$/;
const SUPPORTED_TEXT = '0.3.x or 1.x';

const Outcome = Object.freeze({
  ACQUIRED: 'acquired', REPLAY: 'replay', BUSY: 'busy', CONFLICT: 'conflict', UNKNOWN: 'unknown',
  IN_REVIEW: 'in_review', STALE: 'stale', EXPIRED: 'expired',
});
const Status = Object.freeze({
  IN_PROGRESS: 'in_progress', SUCCEEDED: 'succeeded', FAILED: 'failed', RETRYABLE: 'retryable',
  UNKNOWN: 'unknown', IN_REVIEW: 'in_review',
});

// A JSON text passed as it is (PostgreSQL parses it: big numbers keep every digit), for params
// and results that arrive as text, such as an HTTP body.
class RawJson {
  constructor(text) {
    if (typeof text !== 'string') throw new TypeError('idempo.rawJson(text): text must be a string');
    this.text = text;
  }
}
const rawJson = (text) => new RawJson(text);
function jsonText(value) {
  if (value === undefined || value === null) return null;
  if (value instanceof RawJson) return value.text;
  return JSON.stringify(value);
}

// A duration for an interval parameter: a number of milliseconds or PostgreSQL's text.
function intervalText(value) {
  if (value === undefined || value === null) return null;
  if (typeof value === 'number') {
    if (!Number.isFinite(value) || value <= 0) throw new RangeError(`idempo: a duration must be > 0 ms, got ${value}`);
    return `${value} milliseconds`;
  }
  return String(value);
}

const dateOf = (v) => (v === null || v === undefined ? null : v instanceof Date ? v : new Date(v));
// milliseconds since the epoch (a float8 column: a number, or a string from some drivers) -> Date;
// PostgreSQL's infinity is the latest (earliest) time a Date can hold
function dateOfMs(v) {
  if (v === null || v === undefined) return null;
  const ms = Number(v);
  if (ms === Infinity) return new Date(8.64e15);
  if (ms === -Infinity) return new Date(-8.64e15);
  return new Date(ms);
}
const numberOf = (v) => (v === null || v === undefined ? null : Number(v));

// The answer of a claim (idempo.claim_result), camelCased.
class Claim {
  constructor(row) {
    this.outcome = row.outcome;
    this.status = row.status;
    this.attempt = numberOf(row.attempt);
    this.result = row.result ?? null;
    this.targetRef = row.target_ref ?? null;
    this.error = row.error ?? null;
    // the lean answer of the helpers (once, the middleware) has no first_seen_at, completed_at
    const full = row.first_seen_ms !== undefined;
    this.firstSeenAt = full ? dateOfMs(row.first_seen_ms) : null;
    this.leaseExpiresAt = full ? dateOfMs(row.lease_expires_ms) : null;
    this.conflictId = numberOf(row.conflict_id);
    this.reviewId = numberOf(row.review_id);
    this.completedAt = full ? dateOfMs(row.completed_ms) : null;
    // how long the lease has left by idempo's clock (null without a lease)
    this.leaseLeftMs = numberOf(row.lease_left_ms);
  }

  // An acquired answer read by once() (its attempt only): what new Claim(row) makes of it.
  static acquired(attempt) {
    return new Claim({ outcome: Outcome.ACQUIRED, status: Status.IN_PROGRESS, attempt });
  }
}

// What a helper hands back: the result (the function's value, or the stored JSON on a replay).
class Done {
  constructor({ result, replayed, status, attempt, targetRef = null, error = null, verified = false }) {
    this.result = result === undefined ? null : result;
    this.replayed = replayed;
    this.status = status;
    this.attempt = attempt;
    this.targetRef = targetRef;
    this.error = error;
    this.verified = verified;
  }
}

// Times come as milliseconds since the epoch (float8): cheaper for every driver to read than
// timestamptz text, and the same whatever the session's DateStyle and TimeZone.
const CLAIM_COLUMNS = `c.outcome::text AS outcome, c.status::text AS status, c.attempt, c.result,
  c.target_ref, c.error, (extract(epoch FROM c.first_seen_at) * 1000)::float8 AS first_seen_ms,
  (extract(epoch FROM c.lease_expires_at) * 1000)::float8 AS lease_expires_ms,
  c.conflict_id::text AS conflict_id, c.review_id::text AS review_id,
  (extract(epoch FROM c.completed_at) * 1000)::float8 AS completed_ms,
  (extract(epoch FROM c.lease_expires_at - idempo.now()) * 1000)::float8 AS lease_left_ms`;

// What the helpers read of a claim: no more than they use, so that a claim through the library
// costs what the same claim by hand costs (bench/overhead.js).  A busy answer's time left is
// asked for separately (the rare case).
const LEAN_COLUMNS = `c.outcome::text AS outcome, c.status::text AS status, c.attempt, c.result, c.target_ref,
  c.error, c.conflict_id, c.review_id`;
// once()'s claim: two columns.  Acquired, the attempt as text in \`a\`; any other answer the rest
// in one JSON array there.  result stays a jsonb column, read by the driver's own parser as
// before.  The driver's cost is per column (a parser looked up for each, every statement).
const ONCE_COLUMNS = `CASE WHEN c.outcome = 'acquired' AND c.status = 'in_progress' AND c.target_ref IS NULL
  AND c.error IS NULL AND c.conflict_id IS NULL AND c.review_id IS NULL THEN c.attempt::text ELSE json_build_array(c.outcome, c.status,
  c.attempt, c.target_ref, c.error, c.conflict_id, c.review_id)::text END AS a, c.result`;
const ONCE_CLAIM = `SELECT ${ONCE_COLUMNS} FROM idempo.claim($1, $2, $3::jsonb) AS c`;
const ONCE_CLAIM_NO_PARAMS = `SELECT ${ONCE_COLUMNS} FROM idempo.claim($1, $2) AS c`;
const ONCE_COMPLETE = 'SELECT idempo.complete($1, $2, result => $3::jsonb)::text AS status';

// Builds "fn(a => $1, b => $2, ...)" from the arguments that are set, numbering them in order
// (the text is made once per function and set of arguments).
const callTexts = new Map();
const claimTexts = new Map();
function call(fn, args) {
  const values = [];
  let shape = fn;
  for (const [name, value] of args) {
    if (value === undefined) continue;
    values.push(value);
    shape += `,${name}`;
  }
  let text = callTexts.get(shape);
  if (text === undefined) {
    // positional while no argument was left out, then named: PostgreSQL resolves a positional
    // call with less work than a named one (measurably, on every unprepared statement)
    const parts = [];
    let positional = true;
    for (const [name, value, cast, wrap] of args) {
      if (value === undefined) { positional = false; continue; }
      const raw = `$${parts.length + 1}${cast ? `::${cast}` : ''}`;
      const param = wrap ? wrap(raw) : raw;
      parts.push(positional ? param : `${name} => ${param}`);
    }
    text = `${fn}(${parts.join(', ')})`;
    callTexts.set(shape, text);
  }
  return { text, values };
}

// idempo.claim(...) with the options that are set: {text, values}.
function claimCall(scope, key, options) {
  const { params, fingerprint, runId, intentAt, wait, completeOnCommit, lease, verifyUnknown } = options;
  return call('idempo.claim', [
    ['scope', scope, null], ['key', key, null],
    ['params', params === undefined ? undefined : jsonText(params), 'jsonb'],
    ['fingerprint', fingerprint === undefined ? undefined
      : (Buffer.isBuffer(fingerprint) ? fingerprint.toString('hex') : fingerprint), 'text', (p) => `decode(${p}, 'hex')`],
    ['run_id', runId, 'text'],
    ['intent_at', intentAt === undefined ? undefined : dateOf(intentAt).toISOString(), 'timestamptz'],
    ['wait', wait, 'boolean'],
    ['complete_on_commit', completeOnCommit, 'boolean'],
    ['lease', lease === undefined ? undefined : intervalText(lease), 'interval'],
    // false: a caller that cannot look the action up (the HTTP middleware's retry without a
    // lookup) is answered unknown without taking the verification lease
    ['verify_unknown', verifyUnknown === false ? false : undefined, 'boolean'],
  ]);
}

const UNSETTLED = Symbol('unsettled');
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// How long to wait before asking again: until the holder's lease ends (idempo's clock), but
// at least 20 ms and growing with each round, never past the deadline.
function backoff(round, claim, deadline) {
  const grow = Math.min(1000, 25 * 2 ** round);
  const lease = claim && claim.leaseLeftMs !== null && claim.leaseLeftMs > 0 ? claim.leaseLeftMs + 5 : grow;
  return Math.max(20, Math.min(grow, lease, deadline - Date.now()));
}

function outcomeError(claim, scope, key, extra = {}) {
  const where = `key "${key}" in scope "${scope}"`;
  switch (claim.outcome) {
    case Outcome.CONFLICT:
      return new ConflictError(`${where} was claimed with other parameters (${claim.conflictId === null
        ? 'recorded in this transaction only' : `conflict ${claim.conflictId}`})`,
        claim, { scope, key, changedFields: extra.changedFields });
    case Outcome.BUSY: {
      const hasLease = claim.leaseLeftMs !== null && claim.leaseLeftMs > 0;
      const retryAfterMs = hasLease ? Math.ceil(claim.leaseLeftMs) : 1000;
      // Not "another worker": after a call in doubt the key is held by this caller's own attempt,
      // which nobody runs any more, until its lease runs out and the next claim looks it up.
      const message = claim.status === null || claim.status === undefined
        ? `${where} is being claimed in another transaction that has not committed yet`
        : `${where} is held by attempt ${claim.attempt ?? '?'} (status ${claim.status}) until its lease runs out`
          + `${hasLease ? ` in ${Math.ceil(claim.leaseLeftMs / 1000)} s` : ''}: a worker is running it, or its `
          + 'outcome is in doubt and the next claim after the lease looks it up';
      return new BusyError(message, claim, { scope, key, retryAfterMs });
    }
    case Outcome.IN_REVIEW:
      return new InReviewError(`${where} is in review: a person decides`, claim, { scope, key });
    case Outcome.STALE:
      return new errors.StaleError(`${where} is stale (its intent is older than the scope's retention): `
        + 'it went to review, a person decides', claim, { scope, key });
    case Outcome.EXPIRED:
      return new ExpiredError(`${where} finished long ago and its result has expired`, claim, { scope, key });
    case Outcome.UNKNOWN:
      return new UnknownOutcomeError(`the outcome of attempt ${claim.attempt} of ${where} is unknown: `
        + 'look it up in the target system and verify', claim, { scope, key });
    default:
      return new errors.OutcomeError(`${where}: unexpected outcome ${claim.outcome}`, claim, { scope, key });
  }
}

class Idempo {
  // db: a pg Pool/Client/PoolClient or an adapter (idempo.knex(knex), idempo.prisma(prisma),
  // idempo.kysely(db, {CompiledQuery})).  options.log: where helpers report what they could not
  // throw (a refused heartbeat); default console.
  constructor(db, options = {}, root = null) {
    this.db = adapters.toAdapter(db);
    this.options = options;
    this.log = options.log ?? console;
    this.root = root ?? this;
    if (!root) {
      this.versionChecked = null;
      this.versionOk = false;
    }
  }

  // The same library on a transaction the caller opened (a pg client after BEGIN, a Knex trx,
  // a Prisma tx, a Kysely trx): helpers run in it and never commit or roll it back.
  within(handle) {
    return this._on(this.db.bind(handle));
  }

  // The same library (options, log, the version check of its pool) on another adapter: a
  // transaction's, that this library or the middleware opened.
  _on(db) {
    return new Idempo(db, this.options, this.root);
  }

  // Checks once per Idempo (a pool) that the database has idempo's SQL objects of a supported
  // version; every call below waits for it.
  ensureVersion() {
    const root = this.root;
    if (!root.versionChecked) {
      root.versionChecked = this._checkVersion().catch((err) => {
        if (!(err instanceof UnsupportedVersionError)) root.versionChecked = null;   // ask again next time
        throw err;
      });
    }
    return root.versionChecked;
  }

  async _checkVersion() {
    let found;
    try {
      const rows = await this.db.query('SELECT idempo.version()::text AS version', []);
      found = rows[0].version;
    } catch (err) {
      const code = sqlstateOf(err);
      if (code === '42883' || code === '3F000') {
        throw new UnsupportedVersionError(
          'this database has no function idempo.version(): idempo is not installed in it, or its SQL objects '
          + `are older than 0.3.0; idempo for Node.js ${LIBRARY_VERSION} needs idempo ${SUPPORTED_TEXT}`,
          { code: '55000', cause: err, hint: 'CREATE EXTENSION idempo (or ALTER EXTENSION idempo UPDATE) in this database.' });
      }
      throw fromDatabaseError(err);
    }
    if (!SUPPORTED.test(found)) {
      throw new UnsupportedVersionError(
        `idempo ${found} is installed in this database; idempo for Node.js ${LIBRARY_VERSION} needs idempo ${SUPPORTED_TEXT}`,
        { code: '55000', hint: 'Install the library of the same version as the extension (clients/node of its release).' });
    }
    this.root.versionOk = true;       // from now on no call waits for the check
    return found;
  }

  async _query(text, values, scope, key) {
    if (!this.root.versionOk) await this.ensureVersion();
    try {
      return await this.db.query(text, values);
    } catch (err) {
      throw fromDatabaseError(err, scope, key);
    }
  }

  // --- idempo's functions -------------------------------------------------------------------
  claim(scope, key, options = {}) {
    return this._claim(scope, key, options, false);
  }

  async _claim(scope, key, options, lean) {
    const { text, values } = claimCall(scope, key, options);
    const cacheKey = lean ? `lean:${text}` : text;
    let sql = claimTexts.get(cacheKey);
    if (sql === undefined) {
      sql = `SELECT ${lean ? LEAN_COLUMNS : CLAIM_COLUMNS} FROM `
        + `${text} AS c`;
      claimTexts.set(cacheKey, sql);
    }
    const rows = await this._query(sql, values, scope, key);
    const claim = new Claim(rows[0]);
    if (lean && claim.outcome === Outcome.BUSY) await this._busyLease(claim, scope, key);
    return claim;
  }

  // once()'s claim: the statement of _claim(..., true) and the same Claim, read from two
  // columns; the text made once for a claim with no option but params (the usual one).
  async _onceClaim(scope, key, options) {
    const { params } = options;
    let sql;
    let values;
    if (options.fingerprint === undefined && options.runId === undefined && options.intentAt === undefined
      && options.wait === undefined && options.completeOnCommit === undefined && options.lease === undefined
      && options.verifyUnknown === undefined) {
      sql = params === undefined ? ONCE_CLAIM_NO_PARAMS : ONCE_CLAIM;
      values = params === undefined ? [scope, key] : [scope, key, jsonText(params)];
    } else {
      const built = claimCall(scope, key, options);
      values = built.values;
      const cacheKey = `once:${built.text}`;
      sql = claimTexts.get(cacheKey);
      if (sql === undefined) {
        sql = `SELECT ${ONCE_COLUMNS} FROM ${built.text} AS c`;
        claimTexts.set(cacheKey, sql);
      }
    }
    const [row] = await this._query(sql, values, scope, key);
    const a = row.a;
    if (a.charCodeAt(0) !== 91) return Claim.acquired(Number(a));       // not '[': the attempt
    const [outcome, status, attempt, targetRef, error, conflictId, reviewId] = JSON.parse(a);
    const claim = new Claim({
      outcome, status, attempt, result: row.result, target_ref: targetRef, error, conflict_id: conflictId, review_id: reviewId,
    });
    if (claim.outcome === Outcome.BUSY) await this._busyLease(claim, scope, key);
    return claim;
  }

  async _busyLease(claim, scope, key) {
    // the holder's lease, if it committed one (a holder still in its transaction has none)
    const [row] = await this._query(`SELECT (extract(epoch FROM o.lease_expires_at) * 1000)::float8 AS expires_ms,
        (extract(epoch FROM o.lease_expires_at - idempo.now()) * 1000)::float8 AS left_ms
      FROM idempo.lookup($1, $2) AS o WHERE o.scope IS NOT NULL`, [scope, key], scope, key);
    if (row) {
      claim.leaseExpiresAt = dateOfMs(row.expires_ms);
      claim.leaseLeftMs = numberOf(row.left_ms);
    }
  }

  async complete(scope, key, { attempt, result, targetRef } = {}) {
    const { text, values } = call('idempo.complete', [
      ['scope', scope, null], ['key', key, null], ['attempt', attempt ?? undefined, 'integer'],
      ['result', result === undefined ? undefined : jsonText(result), 'jsonb'], ['target_ref', targetRef ?? undefined, 'text'],
    ]);
    return (await this._query(`SELECT ${text}::text AS status`, values, scope, key))[0].status;
  }

  async fail(scope, key, { attempt, error, retryable = true } = {}) {
    const { text, values } = call('idempo.fail', [
      ['scope', scope, null], ['key', key, null], ['attempt', attempt ?? undefined, 'integer'],
      ['error', error === undefined || error === null ? undefined : String(error).slice(0, 2000), 'text'],
      ['retryable', retryable, 'boolean'],
    ]);
    return (await this._query(`SELECT ${text}::text AS status`, values, scope, key))[0].status;
  }

  async verify(scope, key, attempt, found, { targetRef, result } = {}) {
    const { text, values } = call('idempo.verify', [
      ['scope', scope, null], ['key', key, null], ['attempt', attempt, 'integer'], ['found', found, 'boolean'],
      ['target_ref', targetRef ?? undefined, 'text'], ['result', result === undefined ? undefined : jsonText(result), 'jsonb'],
    ]);
    return (await this._query(`SELECT ${text}::text AS status`, values, scope, key))[0].status;
  }

  // Extends the lease of the running attempt; resolves with the new end of the lease.
  async heartbeat(scope, key, attempt, { extend } = {}) {
    const { text, values } = call('idempo.heartbeat', [
      ['scope', scope, null], ['key', key, null], ['attempt', attempt, 'integer'],
      ['extend', extend === undefined ? undefined : intervalText(extend), 'interval'],
    ]);
    return dateOf((await this._query(`SELECT ${text} AS lease_expires_at`, values, scope, key))[0].lease_expires_at);
  }

  // The record of a key (idempo.operations, camelCased), or null.
  async lookup(scope, key) {
    const rows = await this._query(`SELECT o.scope, o.key, o.status::text AS status, o.attempt, o.run_id,
        o.first_seen_at, o.last_attempt_at, o.lease_expires_at, o.completed_at, o.expires_at, o.result,
        o.target_ref, o.error
      FROM idempo.lookup($1::text, $2::text) AS o WHERE o.scope IS NOT NULL`, [scope, key], scope, key);
    if (rows.length === 0) return null;
    const r = rows[0];
    return {
      scope: r.scope, key: r.key, status: r.status, attempt: numberOf(r.attempt), runId: r.run_id,
      firstSeenAt: dateOf(r.first_seen_at), lastAttemptAt: dateOf(r.last_attempt_at),
      leaseExpiresAt: dateOf(r.lease_expires_at), completedAt: dateOf(r.completed_at),
      expiresAt: dateOf(r.expires_at), result: r.result ?? null, targetRef: r.target_ref ?? null, error: r.error ?? null,
    };
  }

  // The fields that differ in a conflict ([{field, stored, incoming}], store_params scopes), or
  // null when idempo.conflict_queue does not show it (not recorded yet, resolved, no params).
  async changedFields(conflictId) {
    if (conflictId === null || conflictId === undefined) return null;
    try {
      const rows = await this._query('SELECT changed_fields FROM idempo.conflict_queue WHERE id = $1::bigint',
        [String(conflictId)]);
      return rows.length ? rows[0].changed_fields ?? null : null;
    } catch (err) {
      return null;     // a role that may claim may not read the queue: the error still names the conflict
    }
  }

  // Runs fn in a transaction of its own, or in the caller's (within()).
  _transaction(fn) {
    if (this.db.inTransaction) return fn(this);
    return this.db.transaction((db) => fn(this._on(db)));
  }

  async _outcomeError(claim, scope, key, inTransaction) {
    const changedFields = claim.outcome === Outcome.CONFLICT && !inTransaction
      ? await this.root.changedFields(claim.conflictId) : null;
    return outcomeError(claim, scope, key, { changedFields });
  }

  // One transaction: claim; if acquired, fn(tx, claim) does the work with the transaction's
  // handle and its value is stored by complete(), all committed together.  A throw rolls all
  // back (the key is free again).  replay: the stored result, fn is not called.  conflict,
  // in_review, stale, expired, unknown: thrown as errors.  busy (a committed holder: its lease,
  // or with wait: false also a transaction still open): onBusy 'raise' (default) throws
  // BusyError at once, 'wait' asks again until busyTimeoutMs.
  async once(scope, key, options, fn) {
    if (typeof options === 'function') { fn = options; options = {}; }
    if (typeof fn !== 'function') throw new TypeError('idempo.once(scope, key, options, fn): fn must be a function');
    const { onBusy = 'raise', busyTimeoutMs = 30000, targetRef, ...claimOptions } = options;
    if (onBusy !== 'wait' && onBusy !== 'raise') throw new TypeError(`idempo: onBusy must be 'wait' or 'raise', got ${onBusy}`);
    if (!this.root.versionOk) await this.ensureVersion();
    const deadline = Date.now() + busyTimeoutMs;
    for (let round = 0; ; round += 1) {
      const answer = await this._transaction(async (tx) => {
        // wait (default true): a claim of the same key in a transaction still open is waited for
        // (it ends soon: one transaction); busy is then a committed holder, which onBusy decides
        const claim = await tx._onceClaim(scope, key, claimOptions);
        if (claim.outcome !== Outcome.ACQUIRED) return { claim };
        const value = await fn(tx.db.handle, claim);
        const ref = typeof targetRef === 'function' ? targetRef(value) : targetRef;
        if (ref === undefined || ref === null) {
          // complete(scope, key, {result}) with its text made once
          await tx._query(ONCE_COMPLETE, [scope, key, value === undefined || value === null ? null : jsonText(value)],
            scope, key);
        } else {
          await tx.complete(scope, key, { result: value === undefined ? null : value, targetRef: ref });
        }
        return {
          done: new Done({ result: value, replayed: false, status: Status.SUCCEEDED, attempt: claim.attempt, targetRef: ref ?? null }),
        };
      });
      if (answer.done) return answer.done;
      const { claim } = answer;
      if (claim.outcome === Outcome.REPLAY) return replayOf(claim);
      if (claim.outcome === Outcome.BUSY && onBusy === 'wait' && Date.now() < deadline) {
        await sleep(backoff(round, claim, deadline));
        continue;
      }
      throw await this._outcomeError(claim, scope, key, this.db.inTransaction);
    }
  }

  // Work that calls another system (which cannot join this database's transaction):
  //   call(ctx)                the outside call; ctx = {scope, key, attempt, signal}: pass the key on
  //                            as the target system's idempotency key; signal aborts when the
  //                            attempt lost its lease
  //   lookup(ctx)              finds the action in the target system by the key: its value, or
  //                            null/undefined if it is not there (for `unknown` outcomes)
  //   record(tx, value, ctx)   optional: the business write; its value is the stored result
  //                            (default: call's value), committed with complete()/verify()
  //   targetRef(value)         optional: the action's reference in the target system
  //   classifyError(err, ctx)  'retryable' (it had no effect: the key is freed for a retry, and
  //                            the error is thrown), 'failed' (final: resolves with a Done of
  //                            status 'failed', replayed so from then on), or 'unknown' (default:
  //                            in doubt; the key stays held until the lease runs out, then is
  //                            verified by lookup)
  async callOnce(scope, key, options = {}) {
    const {
      call: callFn, lookup, record, targetRef, classifyError = () => 'unknown', onBusy = 'raise',
      busyTimeoutMs = 30000, heartbeat = true, maxRounds = 10, ...claimOptions
    } = options;
    if (typeof callFn !== 'function') throw new TypeError('idempo.callOnce: options.call must be a function');
    if (this.db.inTransaction) {
      throw new TypeError('idempo.callOnce commits its claim before the call: use it outside a transaction, not within()');
    }
    await this.ensureVersion();
    const deadline = Date.now() + busyTimeoutMs;
    let lastBusy = null;
    let waits = 0;
    for (let round = 0; round < maxRounds; round += 1) {
      const claim = await this.claim(scope, key, { ...claimOptions, wait: true });
      switch (claim.outcome) {
        case Outcome.REPLAY:
          return replayOf(claim);
        case Outcome.ACQUIRED: {
          const done = await this._attempt(scope, key, claim, { callFn, lookup, record, targetRef, classifyError, heartbeat, lease: claimOptions.lease });
          return done;
        }
        case Outcome.UNKNOWN: {
          const settled = await this._settle(scope, key, claim, { lookup, record, targetRef });
          if (settled === UNSETTLED) {
            // not found, but too early to believe it (verify_settle): wait or say so
            if (onBusy === 'wait' && Date.now() < deadline) {
              await sleep(backoff(waits, null, deadline));
              waits += 1;
              round -= 1;
              continue;
            }
            const { lastAttemptAt, settlesAt } = await this._settleWindow(scope, key);
            const when = settlesAt ? `the settle window ends at ${settlesAt.toISOString()} (the end of attempt ${claim.attempt}'s `
              + `lease, ${lastAttemptAt.toISOString()}, + the scope's verify_settle)`
              : lastAttemptAt ? `the settle window ends the scope's verify_settle after ${lastAttemptAt.toISOString()} (the end `
              + `of attempt ${claim.attempt}'s lease; this role cannot read idempo.scopes)`
              : "the settle window (verify_settle after the attempt's lease ended) has not passed";
            const err = new UnknownOutcomeError(`attempt ${claim.attempt} of key "${key}" in scope "${scope}" was not found `
              + `in the target system, but too early to believe it (a lagging replica, a request still in flight): ${when}; `
              + 'call callOnce again with the same key after then: it looks the action up again', claim, { scope, key });
            err.settlesAt = settlesAt;
            throw err;
          }
          if (settled) return settled;
          continue;      // not found, verified retryable (or refused: another verifier won): ask again
        }
        case Outcome.BUSY:
          lastBusy = claim;
          if (onBusy === 'wait' && Date.now() < deadline) {
            await sleep(backoff(waits, claim, deadline));
            waits += 1;
            round -= 1;          // waiting is not a round
            continue;
          }
          throw outcomeError(claim, scope, key);
        default:
          throw await this._outcomeError(claim, scope, key, false);
      }
    }
    throw lastBusy ? outcomeError(lastBusy, scope, key)
      : new UnknownOutcomeError(`key "${key}" in scope "${scope}" was not settled in ${maxRounds} rounds`, null, { scope, key });
  }

  // An acquired attempt: heartbeat, call, then complete or fail.
  async _attempt(scope, key, claim, { callFn, lookup, record, targetRef, classifyError, heartbeat, lease }) {
    const attempt = claim.attempt;
    const abort = new AbortController();
    const ctx = { scope, key, attempt, signal: abort.signal };
    const beat = heartbeat ? this._heartbeat(scope, key, claim, heartbeat, abort, lease) : null;
    let value;
    try {
      value = await callFn(ctx);
    } catch (err) {
      if (beat) await beat.stop();
      const kind = classifyError(err, { ...ctx, stage: 'call' });
      const message = err && err.message ? err.message : String(err);
      if (kind === 'retryable') {
        await this.fail(scope, key, { attempt, error: message, retryable: true })
          .catch((e) => this.log.error(`idempo: fail(${scope}, ${key}, attempt ${attempt}) refused: ${e.message}`));
        throw err;
      }
      if (kind === 'failed') {
        // a final answer, replayed from now on: the same Done as its replays
        const status = await this.fail(scope, key, { attempt, error: message, retryable: false });
        return new Done({ result: null, replayed: false, status, attempt, error: message });
      }
      // in doubt: settle it now if the target system shows the action, else leave it held
      if (lookup) {
        const settled = await this._completeFromLookup(scope, key, attempt, { lookup, record, targetRef, ctx }).catch(() => null);
        if (settled) return settled;
      }
      throw new UnknownOutcomeError(`the call of attempt ${attempt} of key "${key}" in scope "${scope}" failed `
        + `and its effect is unknown: ${err && err.message}`, claim, { scope, key, attempt, cause: err });
    }
    try {
      const done = await this._record(scope, key, attempt, value, { record, targetRef, ctx, how: 'complete' });
      if (beat) await beat.stop();
      return done;
    } catch (err) {
      if (beat) await beat.stop();
      if (err instanceof LeaseLostError) throw err;
      const kind = classifyError(err, { ...ctx, stage: 'record' });
      if (kind === 'retryable' || kind === 'failed') {
        await this.fail(scope, key, { attempt, error: err.message, retryable: kind === 'retryable' })
          .catch((e) => this.log.error(`idempo: fail(${scope}, ${key}, attempt ${attempt}) refused: ${e.message}`));
      }
      throw err;
    }
  }

  // The business write and complete(attempt) or verify(attempt, found) in one transaction.
  async _record(scope, key, attempt, value, { record, targetRef, ctx, how }) {
    return this._transaction(async (tx) => {
      const result = record ? await record(tx.db.handle, value, ctx) : value;
      const ref = typeof targetRef === 'function' ? (targetRef(value) ?? undefined) : undefined;
      try {
        if (how === 'complete') await tx.complete(scope, key, { attempt, result: result ?? null, targetRef: ref });
        else await tx.verify(scope, key, attempt, true, { result: result ?? null, targetRef: ref });
      } catch (err) {
        if (err instanceof StateError || err instanceof NotFoundError) {
          throw new LeaseLostError(`attempt ${attempt} of key "${key}" in scope "${scope}" no longer holds the key `
            + `(its lease ran out and another worker took it over, or it was resolved): ${err.message}`,
          { code: err.code, cause: err, scope, key });
        }
        throw err;
      }
      return new Done({ result, replayed: false, status: Status.SUCCEEDED, attempt, targetRef: ref ?? null, verified: how === 'verify' });
    });
  }

  async _completeFromLookup(scope, key, attempt, { lookup, record, targetRef, ctx }) {
    const found = await lookup(ctx);
    if (found === null || found === undefined) return null;
    return this._record(scope, key, attempt, found, { record, targetRef, ctx, how: 'complete' });
  }

  // When an empty lookup may be believed: verify_settle after the end of the attempt's lease,
  // which an unknown record keeps in last_attempt_at (docs/time-and-doubt.md).  The scope's
  // verify_settle only when this role may read idempo.scopes (settlesAt null otherwise).
  async _settleWindow(scope, key) {
    try {
      const [row] = await this._query(`SELECT last_attempt_at, has_table_privilege('idempo.scopes', 'SELECT') AS can
        FROM idempo.lookup($1::text, $2::text) WHERE scope IS NOT NULL`, [scope, key], scope, key);
      if (!row || row.last_attempt_at === null) return { lastAttemptAt: null, settlesAt: null };
      const lastAttemptAt = dateOf(row.last_attempt_at);
      if (!row.can) return { lastAttemptAt, settlesAt: null };
      const [ends] = await this._query('SELECT $1::timestamptz + verify_settle AS t FROM idempo.scopes WHERE name = $2',
        [row.last_attempt_at, scope], scope, key);
      return { lastAttemptAt, settlesAt: ends ? dateOf(ends.t) : null };
    } catch (err) {
      return { lastAttemptAt: null, settlesAt: null };
    }
  }

  // claim answered `unknown` (this worker holds the verification lease): look the action up
  // and verify.  Returns Done when found, null when the key should be claimed again, UNSETTLED
  // when it was not found but verify_settle has not passed yet.
  async _settle(scope, key, claim, { lookup, record, targetRef }) {
    if (typeof lookup !== 'function') throw outcomeError(claim, scope, key);
    const ctx = { scope, key, attempt: claim.attempt, signal: new AbortController().signal };
    let found;
    try {
      found = await lookup(ctx);
    } catch (err) {
      throw new UnknownOutcomeError(`the lookup for attempt ${claim.attempt} of key "${key}" in scope "${scope}" `
        + `failed: ${err && err.message}`, claim, { scope, key, cause: err });
    }
    try {
      if (found !== null && found !== undefined) {
        return await this._record(scope, key, claim.attempt, found, { record, targetRef, ctx, how: 'verify' });
      }
      const status = await this.verify(scope, key, claim.attempt, false);
      return status === Status.UNKNOWN ? UNSETTLED : null;
    } catch (err) {
      // the verify race: a newer attempt or another verifier got there first; claim again
      if (err instanceof LeaseLostError || err instanceof StateError) return null;
      throw err;
    }
  }

  // Keeps the lease of a running attempt: idempo.heartbeat when a third of the lease it holds is
  // left (options.everyMs: at that fixed period).  extend: options.extend, else `lease`, the lease
  // the attempt was claimed with: idempo.heartbeat(extend => NULL) extends by the SCOPE's lease
  // and never shortens one, so an attempt claimed with a longer lease would lose it at its end.
  // Each beat is timed from what the database says is left (its clock), not from the claim.
  // A refusal (superseded, not in_progress, the lease ran out) aborts ctx.signal.
  _heartbeat(scope, key, claim, options, abort, lease) {
    const opts = typeof options === 'object' ? options : {};
    const extend = opts.extend ?? lease;
    const { text, values } = call('idempo.heartbeat', [
      ['scope', scope, null], ['key', key, null], ['attempt', claim.attempt, 'integer'],
      ['extend', extend === undefined || extend === null ? undefined : intervalText(extend), 'interval'],
    ]);
    const sql = `SELECT (extract(epoch FROM ${text} - idempo.now()) * 1000)::float8 AS left_ms`;
    const nextIn = (leftMs) => opts.everyMs ?? Math.max(50, Math.floor((leftMs ?? 30000) / 3));
    let stopped = false;
    let timer = null;
    let inFlight = Promise.resolve();
    const beat = async () => {
      let leftMs = null;
      try {
        leftMs = numberOf((await this._query(sql, values, scope, key))[0].left_ms);
      } catch (err) {
        if (stopped) return;
        if (err instanceof StateError || err instanceof NotFoundError) {
          stopped = true;
          abort.abort(new LeaseLostError(`attempt ${claim.attempt} of key "${key}" in scope "${scope}" lost its lease: ${err.message}`,
            { code: err.code, cause: err, scope, key }));
          return;
        }
        this.log.error(`idempo: heartbeat(${scope}, ${key}, ${claim.attempt}) failed: ${err.message}`);
      }
      if (!stopped) schedule(leftMs);
    };
    const schedule = (leftMs) => {
      timer = setTimeout(() => { inFlight = beat(); }, nextIn(leftMs));
    };
    schedule(claim.leaseLeftMs);
    return {
      async stop() {
        stopped = true;
        clearTimeout(timer);
        await inFlight;
      },
    };
  }
}

function replayOf(claim) {
  return new Done({
    result: claim.result, replayed: true, status: claim.status, attempt: claim.attempt,
    targetRef: claim.targetRef, error: claim.error,
  });
}

module.exports = { Idempo, Claim, Done, Outcome, Status, RawJson, rawJson, LIBRARY_VERSION, SUPPORTED_TEXT, UNSETTLED };
