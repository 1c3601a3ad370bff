'use strict';
// Idempotency keys for Fastify (4 and 5): a plugin whose hooks act on the routes that ask for it
// in their config.  Fastify validates the body (schema) before the claim, so an invalid request
// leaves its key unused.
//
//   await app.register(require('idempo/fastify'), { idem });
//   app.post('/orders', { config: { idempotency: { scope: 'http.orders' } } }, async (req, reply) => {
//     const { rows: [order] } = await req.idempotency.tx.query('INSERT ...');
//     return reply.code(201).send(order);
//   });
//
// Options given to register are defaults for every route; a route's config overrides them.
// mode 'transaction' and 'lease' as in express.js; the reply is stored and committed in onSend,
// before it is sent.
const { answerFor, beginRequest, checkOptions, isConnectionError, unavailable } = require('./lib/http');

// in the config of a route whose handler onRoute wrapped
const WRAPPED = Symbol('idempo.handlerWrapped');

function sendAnswer(reply, answer) {
  reply.code(answer.status);
  for (const [name, value] of Object.entries(answer.headers)) reply.header(name, value);
  // as bytes: Fastify adds "; charset=utf-8" to the content-type of a string (a problem's
  // application/problem+json, a replayed application/json), and a replay is the original's bytes
  return reply.send(Buffer.isBuffer(answer.body) ? answer.body : Buffer.from(answer.body, 'utf8'));
}

async function idempoPlugin(fastify, defaults) {
  const { idem, ...routeDefaults } = defaults;
  if (!idem || typeof idem.claim !== 'function') throw new TypeError('idempo/fastify: register it with { idem }');
  checkOptions(routeDefaults, 'idempo/fastify');
  fastify.decorateRequest('idempotency', null);
  // a route's options are checked when the route is added, not at its first request
  // and its handler is wrapped to say that it ran: a route's own preHandler (an auth check) runs
  // after the claim, and a refusal there, before the handler, called nothing (lease mode: the
  // key is freed, not left to its lease)
  fastify.addHook('onRoute', (route) => {
    const own = route.config && route.config.idempotency;
    if (!own) return;
    checkOptions({ ...routeDefaults, ...own }, `idempo/fastify (${route.method} ${route.url})`);
    const handler = route.handler;
    route.config = { ...route.config, [WRAPPED]: true };
    route.handler = function idempoHandler(request, reply) {
      if (request.idempoExchange) request.idempoExchange.handlerStarted = true;
      return handler.call(this, request, reply);
    };
  });

  fastify.addHook('preHandler', async (request, reply) => {
    const config = request.routeOptions ? request.routeOptions.config : reply.context.config;
    if (!config || !config.idempotency) return undefined;
    const options = { ...routeDefaults, ...config.idempotency };
    const begun = await beginRequest(idem, options, request, {
      headerValues: (name) => (request.raw.headersDistinct ? request.raw.headersDistinct[name] : request.headers[name]),
      body: request.body, rawBody: request.rawBody, method: request.method, path: request.url,
      contentType: request.headers['content-type'],
    });
    if (begun === null) return undefined;
    if (begun.answer) return sendAnswer(reply, begun.answer);
    request.idempotency = begun.acquired;
    request.idempoExchange = begun.exchange;
    // until the wrapped handler runs (onRoute); a route added before the plugin loaded
    // (register without await) was not wrapped: whether its handler ran is not known
    if (config[WRAPPED]) begun.exchange.handlerStarted = false;
    // a client that closes the connection before the reply changes nothing (see express.js)
    return undefined;
  });

  fastify.addHook('onSend', async (request, reply, payload) => {
    const exchange = request.idempoExchange;
    if (!exchange || exchange.finished) return payload;
    let body;
    if (payload === null || payload === undefined) body = Buffer.alloc(0);
    else if (Buffer.isBuffer(payload)) body = payload;
    else if (typeof payload === 'string') body = Buffer.from(payload, 'utf8');
    else if (typeof payload.pipe === 'function' || typeof payload[Symbol.asyncIterator] === 'function') {
      // a stream: read whole into the stored reply (as the Express middleware does with
      // res.write), so that it commits with the handler's writes like any reply; sending it
      // while they are rolled back would tell the client of writes that were not made
      try {
        const chunks = [];
        for await (const chunk of payload) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk));
        body = Buffer.concat(chunks);
      } catch (err) {
        await exchange.abandon(err);
        throw err;
      }
    } else {
      await exchange.abandon(new Error(`a reply payload of type ${typeof payload} cannot be stored`));
      return payload;
    }
    try {
      await exchange.finish(reply.statusCode, reply.getHeaders(), body);
    } catch (err) {
      if (!isConnectionError(err)) throw err;
      // the connection was lost before the reply committed: nothing stored, the client retries
      const answer = unavailable(exchange.options);
      for (const name of Object.keys(reply.getHeaders())) reply.removeHeader(name);
      reply.code(answer.status);
      for (const [name, value] of Object.entries(answer.headers)) reply.header(name, value);
      return answer.body;
    }
    return Buffer.isBuffer(payload) || typeof payload === 'string' || payload === null || payload === undefined ? payload : body;
  });

  // the request ended without onSend having stored it (a stream, a framework error): undo
  fastify.addHook('onResponse', async (request) => {
    const exchange = request.idempoExchange;
    if (exchange && !exchange.finished) await exchange.abandon();
  });
}
// Like fastify-plugin: the hooks apply to the routes of the context that registers it.
idempoPlugin[Symbol.for('skip-override')] = true;
idempoPlugin[Symbol.for('fastify.display-name')] = 'idempo';
idempoPlugin[Symbol.for('plugin-meta')] = { name: 'idempo', fastify: '>=4' };

module.exports = idempoPlugin;
module.exports.default = idempoPlugin;
module.exports.idempotency = idempoPlugin;
module.exports.answerFor = answerFor;
