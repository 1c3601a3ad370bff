import type { Idempo } from './index';
import type { MiddlewareOptions as MiddlewareOptions_, IdempotencyContext as IdempotencyContext_ } from './express';
import type { Answer } from './http';

// fastify.js sets module.exports to the plugin (with .default, .idempotency and .answerFor on
// it): declared with `export =`, so that an ES module's default import (what Node gives it:
// module.exports) and a CommonJS require() both get the plugin's type.
declare function idempoPlugin(fastify: any, options: idempoPlugin.IdempoPluginOptions): Promise<void>;
declare namespace idempoPlugin {
  export type MiddlewareOptions<Req = any> = MiddlewareOptions_<Req>;
  export type IdempotencyContext<H = any> = IdempotencyContext_<H>;
  export interface IdempoPluginOptions extends Partial<MiddlewareOptions> {
    idem: Idempo;
  }
  /** The reply for an outcome that did not hand the work to this request (replay, busy, conflict...). */
  export function answerFor(claimOrError: unknown, options: Partial<MiddlewareOptions>): Answer;
  export { idempoPlugin as default, idempoPlugin as idempotency };
}
/** Register once; routes opt in with `config: { idempotency: { scope } }`. */
export = idempoPlugin;

declare module 'fastify' {
  interface FastifyRequest { idempotency: IdempotencyContext_ | null; }
  interface FastifyContextConfig { idempotency?: Partial<MiddlewareOptions_> & { scope: MiddlewareOptions_['scope'] }; }
}
