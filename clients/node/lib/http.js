'use strict';
// What the Express and Fastify middleware share: the Idempotency-Key (IETF HTTPAPI draft
// "The Idempotency-Key HTTP Header Field", and Stripe), the request fingerprint, the stored
// reply and the answer to every outcome of a claim:
//   first request                          -> the handler runs; its reply is stored with the key
//   the same request again                 -> the stored status, headers and body + Idempotent-Replayed: true
//   again while the first is still running -> 409 + Retry-After (busy; the claim does not wait)
//   the same key, another method/path/body -> 422 (conflict, recorded in idempo.conflicts)
//   missing or malformed key               -> 400, no claim
//   unknown, in_review, stale, expired     -> 409: a person or a verifier decides (the claim takes
//                                             no verification lease: claim(verify_unknown => false))
//   unknown, with options.lookup           -> this request looks the action up and verifies: found,
//                                             the reply it stores (or 409 settled-without-reply);
//                                             not found, the request runs as the next attempt;
//                                             too early to believe it, 409 key-in-doubt
//   settled by a person, no reply stored   -> 409 settled-without-reply (operation_status, target_ref)
// Which replies are stored is a rule (options.store; default: below 500 but for the 4xx that
// refuse the request: 400, 401, 403, 408, 409, 415, 422, 425, 429): in mode 'transaction' a
// reply that is not stored rolls the transaction back, so the retry runs afresh.  In mode 'lease'
// the other system may have acted before the reply went wrong (or never came): by default
// (options.onError 'doubt') the attempt is left to its lease (the key answers 409, then turns
// unknown: a person or a verifier decides); onError 'retry', for another system that
// deduplicates by the key the handler passes it, fails the attempt retryable and the retry calls
// it again.  The same rule as idempo's Python middleware (Route(calls_out=True, on_error=...)).
const crypto = require('node:crypto');
const { rawJson, Outcome, UNSETTLED } = require('./client');
const { sqlstateOf, isConnectionError } = require('./errors');

const MAX_KEY_LENGTH = 255;
// Arrays and objects nested deeper in a JSON body are refused (400 json-too-deep), nothing
// claimed: JSON.stringify of the parsed body threw RangeError (a 500) at some thousands of
// levels.  64 is System.Text.Json's default; the Python middleware has the same limit.
const MAX_JSON_DEPTH = 64;
const DEFAULT_TYPE_BASE = 'https://idempo.dev/problems';

class Refusal extends Error {
  constructor(reply) {
    super(reply.body);
    this.reply = reply;
  }
}

// RFC 9457 problem details: type typeBase#slug, and slug again as code (a client can test
// either); extra: extension members.  The titles are docs/http-contract.md's, the Python
// middleware's.
function problem(status, slug, title, detail, headers = {}, typeBase = DEFAULT_TYPE_BASE, extra = {}) {
  return {
    status,
    headers: { 'content-type': 'application/problem+json', ...headers },
    body: JSON.stringify({ type: `${typeBase ?? DEFAULT_TYPE_BASE}#${slug}`, title, status, detail, code: slug, ...extra }),
  };
}

// The header's value(s) -> the key.  Bare (Stripe) or a Structured Field String (the draft).
function parseHeaderKey(values, header, typeBase) {
  const malformed = (why) => new Refusal(problem(400, 'malformed-key', 'Malformed idempotency key', why, {}, typeBase));
  if (values === undefined || values === null || (Array.isArray(values) && values.length === 0)) return undefined;
  // Two headers arrive as two values, or joined by ", " (a proxy, HTTP's own rule for repeated
  // fields): so a comma outside a quoted string means two keys, refused alike (as Python does).
  const list = (Array.isArray(values) ? values : [values]).flatMap((v) => splitList(String(v)));
  if (list.length !== 1) throw malformed(`Send one ${header} header, with one key.`);
  let key = list[0].trim();
  if (key.startsWith('"')) {
    const quoted = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/.exec(key);
    if (!quoted) throw malformed('Not a valid Structured Field String.');
    key = quoted[1].replace(/\\(["\\])/g, '$1');
  }
  if (key.length === 0 || key.length > MAX_KEY_LENGTH) throw malformed(`The key must have 1 to ${MAX_KEY_LENGTH} characters.`);
  // visible ASCII: no space, no control character, nothing beyond ASCII
  if (!/^[\x21-\x7e]+$/.test(key)) throw malformed('The key must be visible ASCII.');
  return key;
}

// A field value split at the commas outside quoted strings.
function splitList(value) {
  const items = [];
  let start = 0;
  let quoted = false;
  for (let i = 0; i < value.length; i += 1) {
    const ch = value[i];
    if (quoted && ch === '\\') i += 1;
    else if (ch === '"') quoted = !quoted;
    else if (ch === ',' && !quoted) { items.push(value.slice(start, i)); start = i + 1; }
  }
  items.push(value.slice(start));
  return items;
}

// options.key: undefined (the Idempotency-Key header), {header: 'X-Request-Key'},
// {fields: ['order_id', 'line']} (values of the JSON body's top-level fields, joined by '/'),
// or a function (req) -> string | undefined.
function keyOf(req, options, { headerValues, body }) {
  const spec = options.key;
  const typeBase = options.problemTypeBase;
  let key;
  let what;
  if (typeof spec === 'function') {
    key = spec(req);
    what = 'an idempotency key';
    if (key !== undefined && key !== null) key = String(key);
  } else if (spec && Array.isArray(spec.fields)) {
    what = `the fields ${spec.fields.join(', ')} in the body (strings or numbers)`;
    const values = spec.fields.map((path) => fieldOf(body, path));
    if (values.every((v) => v !== undefined)) key = values.map(keyPart).join('/');
  } else {
    const header = (spec && spec.header) || 'Idempotency-Key';
    what = `an ${header} header: a new unique value (a UUID) per operation, the same value when retrying it`;
    key = parseHeaderKey(headerValues(header.toLowerCase()), header, typeBase);
  }
  if (key === undefined || key === null) {
    if (options.required === false) return null;
    throw new Refusal(problem(400, 'missing-key', 'Idempotency key is missing', `This operation requires ${what}.`, {}, typeBase));
  }
  if (typeof options.tenant !== 'function') return key;
  // keys are unique per client: the tenant prefixes the key (its '/' and '%' escaped).  A request
  // that names no tenant is refused: its bare key "a/x" would be tenant "a"'s key "x".
  const tenant = options.tenant(req);
  if (tenant === undefined || tenant === null) {
    throw new Refusal(problem(401, 'no-tenant', 'Who is asking?', 'Idempotency keys are per client; this request names none.', {}, typeBase));
  }
  return `${keyPart(String(tenant))}/${key}`;
}

// A part of a composed key (the tenant, a key field's value) with its '%' and '/' escaped, so
// that parts cannot be shifted into each other: tenant "acme" + key "eu/x" and tenant "acme/eu" +
// key "x" would both be "acme/eu/x".  The same derivation as idempo's Python middleware
// (clients/key-vectors.json is read by both test suites).
function keyPart(value) {
  return value.replace(/%/g, '%25').replace(/\//g, '%2F');
}

// A key field's value ("order.id" for nested ones) as text: a string as it is, a number or a
// boolean as JSON (as Python's json.dumps writes it); missing, null, '', an object or an array:
// undefined.
function fieldOf(body, path) {
  let value = body;
  for (const name of path.split('.')) {
    value = value !== null && typeof value === 'object' && !Array.isArray(value) ? value[name] : undefined;
  }
  if (typeof value === 'string') return value === '' ? undefined : value;
  if ((typeof value === 'number' && Number.isFinite(value)) || typeof value === 'boolean') return JSON.stringify(value);
  return undefined;
}

function mediaTypeOf(contentType) {
  return String(contentType ?? '').split(';')[0].trim().toLowerCase();
}
const isJson = (mediaType) => mediaType === 'application/json' || mediaType.endsWith('+json');

// Whether a JSON text, or a parsed value, nests arrays and objects more than limit deep.  Without
// recursion, so that no depth makes it fail.
function jsonTooDeep(value, limit = MAX_JSON_DEPTH) {
  if (typeof value === 'string') {
    let depth = 0;
    let inString = false;
    for (let i = 0; i < value.length; i += 1) {
      const c = value.charCodeAt(i);
      if (inString) {
        if (c === 0x5c) i += 1;                     // a backslash: skip the escaped character
        else if (c === 0x22) inString = false;
      } else if (c === 0x22) inString = true;
      else if (c === 0x5b || c === 0x7b) { depth += 1; if (depth > limit) return true; }
      else if (c === 0x5d || c === 0x7d) depth -= 1;
    }
    return false;
  }
  const stack = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop();
    if (v === null || typeof v !== 'object') continue;
    if (depth > limit) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v)) {
      if (child !== null && typeof child === 'object') stack.push([child, depth + 1]);
    }
  }
  return false;
}

// The fingerprint's input: method, path (with the query) and body.  A JSON body goes in as JSON
// (the raw text when the application kept it, so big numbers keep every digit), any other body
// as its media type and SHA-256.  Key order, whitespace and 2 vs 2.0 do not matter (jsonb).
function paramsOf({ method, path, contentType, body, rawBody }, typeBase) {
  const head = `{"method":${JSON.stringify(method)},"path":${JSON.stringify(path)}`;
  const mediaType = mediaTypeOf(contentType);
  if (body === undefined || body === null || (Buffer.isBuffer(body) && body.length === 0) || body === '') {
    if (rawBody === undefined || rawBody === null || rawBody.length === 0) return rawJson(`${head}}`);
  }
  if (isJson(mediaType) || (body !== null && typeof body === 'object' && !Buffer.isBuffer(body))) {
    const raw = rawBody !== undefined && rawBody !== null && rawBody.length > 0
      ? (Buffer.isBuffer(rawBody) ? rawBody.toString('utf8') : String(rawBody)) : null;
    if (jsonTooDeep(raw ?? (Buffer.isBuffer(body) ? body.toString('utf8') : body))) {
      throw new Refusal(problem(400, 'json-too-deep', 'The JSON body is nested too deeply',
        `At most ${MAX_JSON_DEPTH} levels of nested arrays and objects.`, {}, typeBase));
    }
    const text = raw ?? JSON.stringify(body);
    return rawJson(`${head},"json":${text}}`);
  }
  const bytes = Buffer.isBuffer(rawBody) ? rawBody : Buffer.isBuffer(body) ? body : Buffer.from(String(rawBody ?? body), 'utf8');
  const sha256 = crypto.createHash('sha256').update(bytes).digest('hex');
  return rawJson(`${head},"media_type":${JSON.stringify(mediaType)},"sha256":"${sha256}"}`);
}

// Headers that belong to a connection, not to the reply: never stored or replayed.
const NOT_STORED = new Set(['connection', 'keep-alive', 'transfer-encoding', 'content-length', 'date', 'server',
  'upgrade', 'te', 'trailer', 'proxy-authenticate', 'proxy-connection', 'idempotent-replayed']);
// Not stored unless options.keepHeaders names them: they belong to the client that made the
// request, and a replay goes to whoever presents the same key (a session cookie replayed to
// another client is a login handed over).  The same list as idempo's Python middleware.
const PER_CLIENT = new Set(['set-cookie', 'set-cookie2', 'authorization', 'proxy-authorization',
  'authentication-info', 'proxy-authentication-info']);

// A reply as stored in the claim's result, the same as idempo's Python middleware stores it (a
// service in either language replays the other's): {status, headers: [[name, value], ...] (names
// lower case, repeated names kept), body} with the body as text, or body_base64 when it is not
// UTF-8, so a replay is byte-for-byte the original.
function storedReply(status, headers, bodyBuffer, keepHeaders = []) {
  const kept = [];
  const keep = new Set(keepHeaders.map((n) => String(n).toLowerCase()));
  for (const [name, value] of Object.entries(headers)) {
    const n = name.toLowerCase();
    if (value === undefined || NOT_STORED.has(n) || (PER_CLIENT.has(n) && !keep.has(n))) continue;
    for (const v of Array.isArray(value) ? value : [value]) kept.push([name.toLowerCase(), String(v)]);
  }
  const text = bodyBuffer.toString('utf8');
  if (Buffer.from(text, 'utf8').equals(bodyBuffer)) return { status, headers: kept, body: text };
  return { status, headers: kept, body_base64: bodyBuffer.toString('base64') };
}
function bodyOfStored(stored) {
  return typeof stored.body_base64 === 'string' ? Buffer.from(stored.body_base64, 'base64') : (stored.body ?? '');
}
// stored headers (pairs, or an object) -> an object for writeHead (repeated names as arrays)
function headersOfStored(stored) {
  const out = {};
  const pairs = Array.isArray(stored.headers) ? stored.headers : Object.entries(stored.headers ?? {});
  for (const [name, value] of pairs) {
    const n = String(name).toLowerCase();
    if (out[n] === undefined) out[n] = value;
    else out[n] = [].concat(out[n], value);
  }
  return out;
}

// The 4xx that say the request was not taken up (bad request, timeout, conflict, media type,
// validation, too early, too many requests) or was refused to this caller (401, 403: its
// credentials, not the operation): not stored, like 5xx, so the retry runs again.
const NOT_STORED_4XX = new Set([400, 401, 403, 408, 409, 415, 422, 425, 429]);
// Which replies are stored by default: 2xx, 3xx and the 4xx a handler decided (404, 402...).
const defaultStore = (status) => status < 500 && !NOT_STORED_4XX.has(status);

// Whether a claim's result is a reply the middleware stored (status, headers, body), rather than
// nothing or what a person or a verifier recorded (resolve, verify).  The Python middleware's
// test (Reply.is_stored) is the same.
function isStoredReply(stored) {
  if (stored === null || typeof stored !== 'object' || Array.isArray(stored)) return false;
  const { status, headers = [], body = '', body_base64: base64 = '' } = stored;
  return Number.isInteger(status) && status >= 100 && status <= 599 && headers !== null && typeof headers === 'object'
    && typeof body === 'string' && typeof base64 === 'string';
}

// options.retryAfter: the seconds of Retry-After in a 503, a key-in-doubt 409 and a busy 409
// whose lease is not known (1); the Python middleware's Route(retry_after=).
function retryAfterOf(options) {
  const seconds = options && options.retryAfter;
  return Number.isInteger(seconds) && seconds >= 1 ? seconds : 1;
}

// The reply for an outcome that did not hand the work to this request.
function answerFor(claimOrError, options) {
  const typeBase = options.problemTypeBase;
  const claim = claimOrError.claim ?? claimOrError;
  switch (claim.outcome) {
    case Outcome.REPLAY: {
      const stored = claim.result;
      if (!isStoredReply(stored)) {
        // settled by a person or a verifier (resolve, verify) with no reply to replay: what is known
        return problem(409, 'settled-without-reply', 'This idempotency key was settled outside this API',
          'Its outcome was recorded by a person or a verifier, with no reply to replay; do not retry it under a new key.',
          {}, typeBase, { operation_status: claim.status ?? null, target_ref: claim.targetRef ?? null });
      }
      return { status: stored.status, headers: { ...headersOfStored(stored), 'idempotent-replayed': 'true' }, body: bodyOfStored(stored) };
    }
    case Outcome.BUSY: {
      const ms = claim.leaseLeftMs !== null && claim.leaseLeftMs > 0 ? claim.leaseLeftMs : retryAfterOf(options) * 1000;
      return problem(409, 'key-in-use', 'A request with this idempotency key is being processed',
        'Retry later with the same key.', { 'retry-after': String(Math.max(1, Math.ceil(ms / 1000))) }, typeBase);
    }
    case Outcome.CONFLICT:
      return problem(422, 'key-reused', 'This idempotency key was used for a different request',
        'The key was first used with another method, path or body. Use a new key for a new operation.', {}, typeBase);
    default:
      return problem(409, 'key-in-review', 'The request with this idempotency key needs attention',
        `Its outcome is ${claim.outcome}; do not retry it under a new key, contact support.`, {}, typeBase);
  }
}

// 409 key-in-doubt: options.lookup found nothing, too early to believe it (the scope's
// verify_settle after the attempt's lease has not passed).  The Python middleware answers the same.
function inDoubt(options, settlesAt) {
  return problem(409, 'key-in-doubt', 'The outcome of the request with this idempotency key is not known yet',
    'It was looked up and not found, too early to be sure that it did not happen; retry later with the same key.',
    { 'retry-after': String(retryAfterOf(options)) }, options.problemTypeBase,
    { settles_at: settlesAt ? settlesAt.toISOString() : null });
}

// What options.lookup found, as verify records it: a reply ({status, headers, body}: body a
// string, a Buffer or a JSON value) is stored as the middleware stores one, and replayed; any
// other value is recorded as it is (answered 409 settled-without-reply).
function foundResult(found, keepHeaders) {
  if (found !== null && typeof found === 'object' && Number.isInteger(found.status)) {
    const { status, headers = {}, body = '' } = found;
    const buffer = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    return storedReply(status, headers, buffer, keepHeaders);
  }
  return found;
}

// With options.lookup, a claim answered unknown (it took no verification lease, as every claim
// first) is claimed again taking the verification lease, with the short options.lookupLease: a
// lookup that fails (the other system down) then locks the retries and the verifier out for that
// long, not for the attempt's lease (the claim's lease applies to the verification lease).  A
// retry that verified and found nothing claims again (the next attempt); a verify race claims
// again too.  Twice at most: the claim after that takes no verification lease, it is answered.
// The Python middleware does the same (Route(lookup_lease=30), in seconds).
const VERIFIES = 2;
const LOOKUP_LEASE_MS = 30000;

class LookupFailed extends Error {}

// 503 lookup-failed: options.lookup threw; nothing decided, the verification lease (lookupLease)
// runs out and the next retry looks again.  The Python middleware answers the same.
function lookupFailed(options) {
  const ms = typeof options.lookupLease === 'number' ? options.lookupLease : LOOKUP_LEASE_MS;
  return problem(503, 'lookup-failed', 'The outcome of the request with this idempotency key could not be looked up',
    'Nothing was decided; retry later with the same key.', { 'retry-after': String(Math.max(1, Math.ceil(ms / 1000))) },
    options.problemTypeBase);
}

// The database could not be reached or the connection was lost before the request's outcome
// committed: nothing is stored for the key (lost during COMMIT, nobody can tell; the retry with
// the same key replays what did commit).  A 503 the client retries, never a 500.
function unavailable(options) {
  return problem(503, 'database-unavailable', 'The database could not be reached',
    'The request was not completed; retry it with the same idempotency key.', { 'retry-after': String(retryAfterOf(options)) },
    options.problemTypeBase);
}

// A promise and its resolve/reject, to keep a transaction open across a framework's callbacks.
function deferred() {
  let resolve;
  let reject;
  const promise = new Promise((res, rej) => { resolve = res; reject = rej; });
  return { promise, resolve, reject };
}

class NotStored extends Error {}

const ON_ERROR = ['doubt', 'retry'];
// The options every middleware checks when it is made (not at the first request): an onError
// that is neither 'doubt' nor 'retry' is refused rather than taken for either (a typo of
// 'retry' read as 'doubt' leaves keys to their lease; the other way round charges twice).
function checkOptions(options, where = 'idempo middleware') {
  if (options && options.onError !== undefined && !ON_ERROR.includes(options.onError)) {
    throw new TypeError(`${where}: options.onError must be 'doubt' (the default: a failed attempt is left to its lease) `
      + `or 'retry' (fail it retryable: only for another system that deduplicates by the key), not ${JSON.stringify(options.onError)}`);
  }
  return options;
}

// One request's life with idempo, whatever the framework: begin() claims and, when acquired,
// gives the transaction (mode 'transaction') or the attempt with its lease (mode 'lease');
// finish(status, headers, body) stores the reply or not, commits or rolls back.
class Exchange {
  constructor(idem, options, scope, key, params) {
    this.idem = idem;
    this.options = options;
    this.scope = scope;
    this.key = key;
    this.params = params;
    this.mode = options.mode ?? 'transaction';
    this.onError = checkOptions(options).onError ?? 'doubt';
    this.finished = false;
    // whether the route's handler ran: undefined where the framework cannot tell (Express: a
    // later middleware may refuse), false then true where it can (Fastify: the plugin wraps the
    // handler).  Known not to have run, nothing was called: the attempt is failed retryable
    // whatever onError says, rather than left to its lease and a person.
    this.handlerStarted = undefined;
  }

  // mode 'lease': a reply not stored or no reply frees the key (fail retryable) with onError
  // 'retry', or when the handler is known never to have run
  _releases() {
    return this.onError === 'retry' || this.handlerStarted === false;
  }

  // the error a released attempt records: why, and that nothing ran where that is known
  _releaseError(why) {
    return this.handlerStarted === false ? `${why} before the handler ran` : why;
  }

  // -> {answer} (replay, busy, conflict...) or {acquired: context for the handler}
  async begin() {
    await this.idem.ensureVersion();
    let verify = false;
    let verifies = VERIFIES;
    for (;;) {
      const begun = this.mode === 'lease' ? await this._beginLease(verify) : await this._beginTransaction(verify);
      if (!begun.unknown) return begun;
      if (!verify && verifies > 0) {         // again, taking the verification lease
        verify = true;
        verifies -= 1;
        continue;
      }
      if (!verify) return { answer: answerFor(begun.unknown, this.options) };
      const answer = await this._verifyUnknown(begun.unknown);
      if (answer) return { answer };
      verify = false;
    }
  }

  // The claim answered unknown and this request holds the verification lease (options.lookup;
  // the claim committed): look the action up and verify.  -> the answer, or null when the key
  // is to be claimed again (not found and retryable now, or another verifier won the race).
  async _verifyUnknown(claim) {
    const keep = this.options.keepHeaders;
    const { lookup } = this.options;
    let settled;
    try {
      settled = await this.idem._settle(this.scope, this.key, claim, {
        lookup: async (ctx) => {
          try {
            return await lookup(ctx);
          } catch (err) {
            throw new LookupFailed(String(err && err.message), { cause: err });
          }
        },
        record: (tx, found) => foundResult(found, keep),
      });
    } catch (err) {
      if (err && err.cause instanceof LookupFailed) return lookupFailed(this.options);
      throw err;
    }
    if (settled === null) return null;
    if (settled === UNSETTLED) return inDoubt(this.options, (await this.idem._settleWindow(this.scope, this.key)).settlesAt);
    return answerFor({ outcome: Outcome.REPLAY, status: settled.status, result: settled.result, targetRef: settled.targetRef },
      this.options);
  }

  // the claim's lease: a claim taking the verification lease takes the short lookupLease
  _leaseFor(verify) {
    return verify ? (this.options.lookupLease ?? LOOKUP_LEASE_MS) : this.options.lease;
  }

  async _beginTransaction(verify) {
    const claimed = deferred();
    this.reply = deferred();
    this.txDone = this.idem.db.transaction(async (db) => {
      const claim = await this._claim(db, verify);
      claimed.resolve({ claim, db });
      if (claim.outcome !== Outcome.ACQUIRED) return null;
      return this._commitReply(db);
    }).catch((err) => {
      if (err instanceof NotStored) return null;
      claimed.resolve({ error: err });     // a failed claim (or BEGIN) answers begin()
      throw err;
    });
    this.txDone.catch(() => {});
    const { claim, db, error } = await claimed.promise;
    if (error) throw translate(error, this.options);
    if (claim.outcome !== Outcome.ACQUIRED) {
      await this.txDone;
      if (claim.outcome === Outcome.UNKNOWN && typeof this.options.lookup === 'function') return { unknown: claim };
      return { answer: answerFor(claim, this.options) };
    }
    this.claim = claim;
    return { acquired: { scope: this.scope, key: this.key, attempt: claim.attempt, tx: db.handle, claim } };
  }

  async _claim(db, verify) {
    try {
      return await this.idem._on(db)._claim(this.scope, this.key,
        { params: this.params, wait: false, lease: this._leaseFor(verify), verifyUnknown: verify }, true);
    } catch (err) {
      throw translate(err, this.options);
    }
  }

  async _beginLease(verify) {
    let claim;
    try {
      claim = await this.idem.claim(this.scope, this.key,
        { params: this.params, wait: false, lease: this._leaseFor(verify), verifyUnknown: verify });
    } catch (err) {
      throw translate(err, this.options);
    }
    if (claim.outcome !== Outcome.ACQUIRED) {
      if (claim.outcome === Outcome.UNKNOWN && typeof this.options.lookup === 'function') return { unknown: claim };
      return { answer: answerFor(claim, this.options) };
    }
    this.claim = claim;
    const abort = new AbortController();
    this.beat = this.options.heartbeat === false ? null
      : this.idem._heartbeat(this.scope, this.key, claim, this.options.heartbeat ?? true, abort, this.options.lease);
    // the business write's transaction, opened when the handler asks for it
    this.transaction = async () => {
      if (this.txHandle) return this.txHandle;
      // the reply was already stored or abandoned: a transaction now would wait for a reply
      // that never comes, holding a pool client
      if (this.finished) throw new Error('idempo: the request is over (its reply was already stored or abandoned); nothing is stored');
      const opened = deferred();
      this.reply = deferred();
      this.txDone = this.idem.db.transaction(async (db) => {
        opened.resolve(db.handle);
        return this._commitReply(db, claim.attempt);
      });
      this.txDone.catch((err) => opened.reject(err));
      this.txHandle = await opened.promise;
      return this.txHandle;
    };
    return {
      acquired: {
        scope: this.scope, key: this.key, attempt: claim.attempt, claim, signal: abort.signal, transaction: this.transaction,
      },
    };
  }

  store(status) {
    return (this.options.store ?? defaultStore)(status);
  }

  // The reply as the stored result (its per-client headers left out unless keepHeaders names them).
  _result({ status, headers, body }) {
    return storedReply(status, headers, body, this.options.keepHeaders);
  }

  // In the transaction db: waits for the handler's reply and stores it with complete() (attempt:
  // the lease's, in mode 'lease'), or throws NotStored to roll back a reply not to be stored.
  async _commitReply(db, attempt) {
    const reply = await this.reply.promise;
    if (!this.store(reply.status)) throw new NotStored();
    await this.idem._on(db).complete(this.scope, this.key, { attempt, result: this._result(reply) });
    return null;
  }

  // The handler's reply: stored and committed (resolves) or not (rolled back; with a lease the
  // attempt is left to its lease, or failed as retryable with onError 'retry' or when the
  // handler never ran).  Rejects if the
  // commit failed: the reply must not be sent.
  async finish(status, headers, body) {
    if (this.finished) return;
    this.finished = true;
    if (this.mode !== 'lease') {
      this.reply.resolve({ status, headers, body });
      await this.txDone;
      return;
    }
    try {
      if (this.txDone) {
        this.reply.resolve({ status, headers, body });
        await this.txDone.catch((err) => { if (!(err instanceof NotStored)) throw err; });
      } else if (this.store(status)) {
        await this.idem.complete(this.scope, this.key, { attempt: this.claim.attempt, result: this._result({ status, headers, body }) });
      }
      if (!this.store(status) && this._releases()) {
        await this.idem.fail(this.scope, this.key, { attempt: this.claim.attempt, error: this._releaseError(`HTTP ${status}`), retryable: true })
          .catch((e) => this.idem.log.error(`idempo: fail(${this.scope}, ${this.key}) refused: ${e.message}`));
      }
    } finally {
      if (this.beat) await this.beat.stop();
    }
  }

  // The request ended without a reply the middleware saw (the framework failed): undo.  The
  // transaction rolls back (mode 'transaction': the claim with it, the key is free again); mode
  // 'lease': the heartbeat stops and the attempt is left to its lease (the handler may have
  // called the other system), or failed as retryable with onError 'retry' or when the handler
  // never ran.
  async abandon(err) {
    if (this.finished) return;
    this.finished = true;
    if (this.reply) {
      // nobody waits for the reply when the transaction failed before it (a claim that could not
      // reach the database): unhandled, the rejection would end the process
      this.reply.promise.catch(() => {});
      this.reply.reject(err ?? new NotStored());
    }
    if (this.txDone) await this.txDone.catch(() => {});
    if (this.mode === 'lease' && this.claim) {
      if (this.beat) await this.beat.stop();
      if (this._releases()) {
        await this.idem.fail(this.scope, this.key, { attempt: this.claim.attempt, error: this._releaseError('no reply'), retryable: true }).catch(() => {});
      }
    }
  }
}

// What both middlewares do before the handler, given the request as the framework shows it
// (view: headerValues(name), body, method, path, contentType, rawBody): the scope, the key, the
// params, the claim.  -> null (no key and required: false: not idempotent, the request goes on
// untouched), {answer} (a refusal, a replay, busy...: send it), or {acquired, exchange} (the
// handler runs; exchange.finish stores its reply).  A failed claim is undone and thrown.
async function beginRequest(idem, options, req, view) {
  let exchange;
  try {
    const scope = scopeOf(options, req);
    const key = keyOf(req, options, view);
    if (key === null) return null;
    exchange = new Exchange(idem, options, scope, key, paramsOf(view, options.problemTypeBase));
    const begun = await exchange.begin();
    return begun.answer ? { answer: begun.answer } : { acquired: begun.acquired, exchange };
  } catch (err) {
    if (err instanceof Refusal) return { answer: err.reply };
    if (exchange) await exchange.abandon(err);
    if (isConnectionError(err)) return { answer: unavailable(options) };
    throw err;
  }
}

// A claim's error that is the client's fault: JSON that JavaScript accepts but jsonb does not
// (a \u0000 escape, a lone surrogate) -> 400.
function translate(err, options) {
  const code = err && (sqlstateOf(err) ?? sqlstateOf(err.cause));
  if (code === '22P02' || code === '22P05') {
    return new Refusal(problem(400, 'invalid-json', 'The body is not valid JSON', err.message, {}, options.problemTypeBase));
  }
  return err;
}

function scopeOf(options, req) {
  const scope = typeof options.scope === 'function' ? options.scope(req) : options.scope;
  if (typeof scope !== 'string' || scope === '') throw new TypeError('idempo middleware: options.scope must name a scope');
  return scope;
}

module.exports = {
  Refusal, problem, keyOf, paramsOf, storedReply, bodyOfStored, answerFor, Exchange, scopeOf, defaultStore, beginRequest,
  checkOptions, mediaTypeOf, NOT_STORED, NOT_STORED_4XX, headersOfStored, PER_CLIENT, keyPart, unavailable,
  isConnectionError, jsonTooDeep, MAX_JSON_DEPTH, isStoredReply,
};
