import type { Idempo } from './index';
import type { MiddlewareOptions, IdempotencyContext } from './express';

export interface IdempoPluginOptions extends Partial<MiddlewareOptions> {
  idem: Idempo;
}
/** Register once; routes opt in with `config: { idempotency: { scope } }`. */
declare function idempoPlugin(fastify: any, options: IdempoPluginOptions): Promise<void>;
export default idempoPlugin;
export { idempoPlugin as idempotency, MiddlewareOptions, IdempotencyContext };

declare module 'fastify' {
  interface FastifyRequest { idempotency: IdempotencyContext | null; }
  interface FastifyContextConfig { idempotency?: Partial<MiddlewareOptions> & { scope: MiddlewareOptions['scope'] }; }
}
