'use strict';
// Idempotency keys for Express (4 and 5): a middleware per route, after the body parser and the
// request's validation (a request refused before the claim leaves its key unused):
//
//   app.post('/orders', express.json(), validateOrder,
//     idempotency(idem, { scope: 'http.orders' }),
//     async (req, res) => {
//       const { rows: [order] } = await req.idempotency.tx.query('INSERT ...');
//       res.status(201).json(order);
//     });
//
// mode 'transaction' (default): claim, the handler's writes (req.idempotency.tx) and the
// stored reply commit together before the reply is sent.  mode 'lease': the claim commits with a
// lease (kept by a heartbeat) for handlers that call another system; the business write goes
// in `await req.idempotency.transaction()`, which commits with the stored reply.  A reply not
// stored (a 5xx) leaves that attempt to its lease (onError 'doubt', the default: the other system
// may have acted) or fails it retryable (onError 'retry': it deduplicates by the key).
// The rules of every answer: lib/http.js and docs/node.md.
const { beginRequest, checkOptions, isConnectionError, unavailable } = require('./lib/http');

function send(res, answer) {
  const body = Buffer.isBuffer(answer.body) ? answer.body : Buffer.from(answer.body ?? '', 'utf8');
  res.writeHead(answer.status, { ...answer.headers, 'content-length': body.length });
  return res.end(body);
}

function idempotency(idem, options = {}) {
  if (!idem || typeof idem.claim !== 'function') throw new TypeError('idempotency(idem, options): idem must be an Idempo');
  checkOptions(options, 'idempotency(idem, options)');
  return async function idempotencyMiddleware(req, res, next) {
    let begun;
    try {
      begun = await beginRequest(idem, options, req, {
        headerValues: (name) => (req.headersDistinct ? req.headersDistinct[name] : req.headers[name]),
        body: req.body, rawBody: req.rawBody, method: req.method, path: req.originalUrl ?? req.url,
        contentType: req.headers['content-type'],
      });
    } catch (err) {
      return next(err);
    }
    if (begun === null) return next();          // required: false and no key: not idempotent
    if (begun.answer) return send(res, begun.answer);
    req.idempotency = begun.acquired;
    capture(res, begun.exchange);
    // A client that goes away before the reply changes nothing: the handler still holds the
    // transaction (tx) or is still in the other system's call, so its reply is stored and
    // committed (a retry replays it) and the heartbeat runs until it returns.  Rolling back or
    // stopping here let a slow handler's writes run on a released pool client (review).
    return next();
  };
}

// Holds the reply back (writeHead/write/end) until it is stored and committed, then sends it.
// If the commit fails, the client gets a 500 and nothing is stored.
function capture(res, exchange) {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end };
  const chunks = [];
  const toBuffer = (chunk, encoding) => (Buffer.isBuffer(chunk) ? chunk
    : chunk instanceof Uint8Array ? Buffer.from(chunk) : Buffer.from(String(chunk), typeof encoding === 'string' ? encoding : 'utf8'));
  res.writeHead = function writeHead(status, reason, headers) {
    const h = typeof reason === 'object' && reason !== null ? reason : headers;
    res.statusCode = status;
    if (typeof reason === 'string') res.statusMessage = reason;
    if (Array.isArray(h)) for (let i = 0; i + 1 < h.length; i += 2) res.setHeader(h[i], h[i + 1]);
    else if (h) for (const [name, value] of Object.entries(h)) res.setHeader(name, value);
    return res;
  };
  res.write = function write(chunk, encoding, cb) {
    if (chunk !== undefined && chunk !== null) chunks.push(toBuffer(chunk, encoding));
    const done = typeof encoding === 'function' ? encoding : cb;
    if (done) process.nextTick(done);
    return true;
  };
  const held = {
    writeHead: () => res,
    write: (chunk, encoding, cb) => { const done = typeof encoding === 'function' ? encoding : cb; if (done) process.nextTick(done); return true; },
    end: (chunk, encoding, cb) => { const done = [chunk, encoding, cb].find((f) => typeof f === 'function'); if (done) process.nextTick(done); return res; },
  };
  res.end = function end(chunk, encoding, cb) {
    if (typeof chunk === 'function') { cb = chunk; chunk = undefined; }
    if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
    if (chunk !== undefined && chunk !== null) chunks.push(toBuffer(chunk, encoding));
    const body = Buffer.concat(chunks);
    const status = res.statusCode;
    const headers = res.getHeaders();
    // Until this reply is stored and sent, a second one is dropped: an error handler run because
    // the handler threw after replying (Express 5) would otherwise send its 500 while this reply
    // commits (the client told of a failure that was committed), and this reply's send would then
    // throw ERR_HTTP_HEADERS_SENT outside any handler (an unhandled rejection ends the process).
    Object.assign(res, held);
    exchange.finish(status, headers, body).then(
      () => {
        Object.assign(res, original);
        if (res.headersSent) return res.end(cb);     // written past the middleware (res.socket): too late
        for (const name of res.getHeaderNames()) res.removeHeader(name);   // what a second reply set
        res.statusCode = status;
        for (const [name, value] of Object.entries(headers)) res.setHeader(name, value);
        if (res.getHeader('transfer-encoding') === undefined) res.setHeader('content-length', body.length);
        return res.end(body, cb);
      },
      (err) => {
        Object.assign(res, original);
        if (res.headersSent) return res.end();
        // not committed: the key stays free; say so rather than send a reply that was not kept
        for (const name of res.getHeaderNames()) res.removeHeader(name);
        if (isConnectionError(err)) return send(res, unavailable(exchange.options));
        res.statusCode = 500;
        res.setHeader('content-type', 'application/problem+json');
        return res.end(JSON.stringify({ title: 'The reply could not be stored', status: 500, detail: String(err.message) }));
      });
    return res;
  };
}

module.exports = { idempotency, send };
