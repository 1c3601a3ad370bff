'use strict';
// Idempotency-Key for node:http services, on idempo's SQL API only.
//
// Follows the IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field" and Stripe:
//   first request                          -> the handler runs; its reply is stored with the key
//   the same request again                 -> the stored reply, with "Idempotent-Replayed: true"
//   again while the first is still running -> 409 (the claim does not wait: wait => false)
//   the same key, another method/path/body -> 422
//   missing or malformed key               -> 400
// Requests that fail validation are refused before the claim, so they use up no key (Stripe).
const crypto = require('node:crypto');

const MAX_KEY_LENGTH = 255;                   // Stripe's limit; idempo itself takes 1024 bytes
const MAX_BODY_BYTES = 1 << 20;
const DOCS = 'https://example.com/docs/idempotency';   // point problem types at your API docs

// A reply: status, headers and the body as text.  Stored verbatim as the claim's result, so a
// replay is byte-for-byte the original (a jsonb body would come back with its keys reordered).
function reply(status, headers, body) {
  return { status, headers, body };
}
function json(status, value, headers = {}) {
  return reply(status, { 'content-type': 'application/json', ...headers }, JSON.stringify(value));
}
// RFC 9457 problem details, as the draft's examples use.
function problem(status, slug, title, detail, headers = {}) {
  return reply(status, { 'content-type': 'application/problem+json', ...headers },
    JSON.stringify({ type: `${DOCS}#${slug}`, title, status, detail }));
}

// Thrown to answer at once with a reply that is not stored (bad key, bad body).
class Refusal extends Error {
  constructor(answer) {
    super(answer.body);
    this.reply = answer;
  }
}

// The draft sends the key as a Structured Field String ("..."); Stripe's clients send it bare.
// Accept both, and only visible ASCII, so that keys log and compare plainly.
function parseKey(values) {
  const malformed = (why) => new Refusal(problem(400, 'malformed-key', 'Malformed Idempotency-Key', why));
  if (!values || values.length === 0) {
    throw new Refusal(problem(400, 'missing-key', 'Idempotency-Key is missing',
      'This operation requires an Idempotency-Key header: a new unique value (a UUID) per operation, ' +
      'the same value when retrying it.'));
  }
  if (values.length > 1) throw malformed('Send one Idempotency-Key header.');
  let key = values[0].trim();
  if (key.startsWith('"')) {
    const quoted = /^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"$/.exec(key);
    if (!quoted) throw malformed('Not a valid Structured Field String.');
    key = quoted[1].replace(/\\(["\\])/g, '$1');
  }
  if (key.length === 0 || key.length > MAX_KEY_LENGTH) {
    throw malformed(`The key must have 1 to ${MAX_KEY_LENGTH} characters.`);
  }
  if (!/^[\x20-\x7e]+$/.test(key)) throw malformed('The key must be visible ASCII.');
  return key;
}

function mediaTypeOf(req) {
  return (req.headers['content-type'] ?? '').split(';')[0].trim().toLowerCase();
}
function isJson(mediaType) {
  return mediaType === 'application/json' || mediaType.endsWith('+json');
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    let size = 0;
    req.on('data', (chunk) => {
      size += chunk.length;
      if (size <= MAX_BODY_BYTES) chunks.push(chunk);   // keep draining, to be able to answer
    });
    req.on('end', () => (size > MAX_BODY_BYTES
      ? reject(new Refusal(problem(413, 'too-large', 'Request body too large', `At most ${MAX_BODY_BYTES} bytes.`)))
      : resolve(Buffer.concat(chunks))));
    req.on('error', reject);
  });
}

// Everything the middleware and the handler need from a request: key, method, path, body.
// In a multi-tenant API, prefix the key with the authenticated client (`${account}/${key}`):
// keys are unique per client, not across clients.
async function prepare(req) {
  const key = parseKey(req.headersDistinct['idempotency-key']);
  const raw = await readBody(req);
  const mediaType = mediaTypeOf(req);
  const request = { key, method: req.method, path: req.url, mediaType, raw, json: undefined };
  if (raw.length > 0 && isJson(mediaType)) {
    try {
      request.json = JSON.parse(raw.toString('utf8'));
    } catch (err) {
      throw new Refusal(problem(400, 'invalid-json', 'The body is not valid JSON', err.message));
    }
  }
  return request;
}

// The request fingerprint covers method, path (with the query) and body.  A JSON body goes in
// as its raw text for PostgreSQL to parse, so key order, whitespace and 1 vs 1.0 do not matter
// and big numbers keep every digit (JSON.parse would round them).  Any other body goes in as
// its media type and SHA-256: jsonb cannot hold arbitrary bytes, and the fingerprint needs
// only the digest.
const PARAMS_SQL = `jsonb_build_object('method', $3::text, 'path', $4::text, 'json', $5::jsonb,
                                       'media_type', $6::text, 'sha256', $7::text)`;
function paramsArgs(request) {
  if (request.json !== undefined) return [request.method, request.path, request.raw.toString('utf8'), null, null];
  if (request.raw.length === 0) return [request.method, request.path, null, null, null];
  const sha256 = crypto.createHash('sha256').update(request.raw).digest('hex');
  return [request.method, request.path, null, request.mediaType, sha256];
}

async function claimKey(db, scope, request) {
  try {
    const { rows: [claim] } = await db.query(
      `SELECT outcome::text, attempt, result FROM idempo.claim($1, $2, params => ${PARAMS_SQL}, wait => false)`,
      [scope, request.key, ...paramsArgs(request)]);
    return claim;
  } catch (err) {
    // JSON that JavaScript accepts but jsonb does not (a \u0000 escape, a lone surrogate)
    if (err.code === '22P02' || err.code === '22P05') {
      throw new Refusal(problem(400, 'invalid-json', 'The body is not valid JSON', err.message));
    }
    throw err;
  }
}

// What to answer when the claim did not hand us the work.
function answerFor(claim) {
  switch (claim.outcome) {
    case 'replay': {
      const stored = claim.result;
      return reply(stored.status, { ...stored.headers, 'idempotent-replayed': 'true' }, stored.body);
    }
    case 'busy':
      return problem(409, 'key-in-use', 'A request with this Idempotency-Key is being processed',
        'Retry later with the same key.', { 'retry-after': '1' });
    case 'conflict':
      return problem(422, 'key-reused', 'This Idempotency-Key was used for a different request',
        'The key was first used with another method, path or body. Use a new key for a new operation.');
    default:   // unknown, in_review, stale, expired: nothing automatic may run it again; a person decides
      return problem(409, 'key-in-review', 'The request with this Idempotency-Key needs attention',
        `Its outcome is ${claim.outcome}; do not retry it under a new key, contact support.`);
  }
}

// One transaction: claim, the handler's writes and complete() commit together or not at all.
// If the handler throws, the rollback takes the claim with it: the key is free again and a
// retry runs the handler afresh.  Use this when the handler only writes to this database.
async function inOneTransaction(pool, scope, request, handler) {
  const db = await pool.connect();
  let broken;
  try {
    await db.query('BEGIN');
    const claim = await claimKey(db, scope, request);
    let answer;
    if (claim.outcome === 'acquired') {
      answer = await handler(db, request);
      await db.query('SELECT idempo.complete($1, $2, result => $3::jsonb)', [scope, request.key, JSON.stringify(answer)]);
    } else {
      answer = answerFor(claim);
    }
    // Commit also when not acquired: a claim may have written in this transaction (a review it
    // opened; a conflict row when idempo's conflict recorder could not run).
    await db.query('COMMIT');
    return answer;
  } catch (err) {
    await db.query('ROLLBACK').catch((e) => { broken = e; });
    throw err;
  } finally {
    db.release(broken);
  }
}

// Two transactions, for a handler that calls an outside system (which cannot join our
// transaction; and no transaction should stay open across a network call):
//   1. the claim commits at once: the key is held by a lease (the scope's "lease");
//   2. callOut() calls the outside system, with no transaction open;
//   3. record() writes the business row, and complete(attempt) commits with it.
// If 2 or 3 fails, fail(retryable) frees the key at once for a retry.  That is right here only
// because callOut passes our key on and the outside system honours it: a retry cannot act
// twice there.  (Without that, do not call fail after an unclear call: let the lease run out
// to 'unknown' and verify.)  If the process dies before fail, the lease runs out and, in a
// scope with on_lease_expiry => 'retry', the next retry takes the key over as the next attempt.
async function withLease(pool, scope, request, { callOut, record }) {
  const claim = await claimKey(pool, scope, request);
  if (claim.outcome !== 'acquired') return answerFor(claim);
  let outside;
  try {
    outside = await callOut(request, `${scope}/${request.key}`);
  } catch (err) {
    await release(pool, scope, request.key, claim.attempt, err);
    return problem(502, 'upstream-failed', 'The payment provider did not answer',
      'Nothing was recorded; retry with the same Idempotency-Key.');
  }
  const db = await pool.connect();
  let broken;
  try {
    await db.query('BEGIN');
    const answer = await record(db, request, outside);
    await db.query('SELECT idempo.complete($1, $2, attempt => $3, result => $4::jsonb)',
      [scope, request.key, claim.attempt, JSON.stringify(answer)]);
    await db.query('COMMIT');
    return answer;
  } catch (err) {
    await db.query('ROLLBACK').catch((e) => { broken = e; });
    await release(pool, scope, request.key, claim.attempt, err);
    throw err;
  } finally {
    db.release(broken);
  }
}

// fail(retryable): this attempt left nothing behind here.  Refused (and only logged) when the
// attempt was superseded after its lease ran out: then the key is not ours to release.
async function release(pool, scope, key, attempt, err) {
  await pool.query('SELECT idempo.fail($1, $2, attempt => $3, error => $4, retryable => true)',
    [scope, key, attempt, String(err.message).slice(0, 500)])
    .catch((e) => console.error(`idempo.fail(${scope}, ${key}, attempt ${attempt}) refused: ${e.message}`));
}

// The whole middleware for one route: {scope, validate, handler} for the one-transaction form,
// {scope, validate, callOut, record} for the two-transaction form.  validate(request) returns a
// problem reply or nothing; it runs before the claim.
async function serve(pool, route, req) {
  const request = await prepare(req);
  const invalid = route.validate(request);
  if (invalid) return invalid;
  return route.callOut
    ? withLease(pool, route.scope, request, route)
    : inOneTransaction(pool, route.scope, request, route.handler);
}

function send(res, answer) {
  res.writeHead(answer.status, { ...answer.headers, 'content-length': Buffer.byteLength(answer.body) });
  res.end(answer.body);
}

module.exports = { serve, send, json, problem, Refusal, PARAMS_SQL, paramsArgs };
