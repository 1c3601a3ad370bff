import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Idempo, Claim, Duration, CallContext } from './index';

/** A reply options.lookup found, stored and answered as the handler's would have been. */
export interface FoundReply {
  status: number;
  headers?: Record<string, string | string[]>;
  body?: string | Buffer | unknown;
}

/** What an acquired request carries as req.idempotency. */
export interface IdempotencyContext<H = any> {
  scope: string;
  /** The key as stored (with the tenant prefix). */
  key: string;
  attempt: number | null;
  claim: Claim;
  /** mode 'transaction': the transaction of the claim; the handler's writes commit with the reply. */
  tx?: H;
  /** mode 'lease': aborted when the attempt lost its lease. */
  signal?: AbortSignal;
  /** mode 'lease': opens (once) the transaction that commits with the stored reply. */
  transaction?: () => Promise<H>;
}

export interface MiddlewareOptions<Req = any> {
  scope: string | ((req: Req) => string);
  /** Default: the Idempotency-Key header. */
  key?: { header: string } | { fields: string[] } | ((req: Req) => string | undefined | null);
  /** false: a request without a key passes through, not idempotent.  Default true (400). */
  required?: boolean;
  /** Keys are unique per tenant: the key is stored as `${tenant}/${key}`, '%' and '/' in the
   *  tenant (and in key field values) escaped as %25 and %2F, as idempo's Python middleware does.
   *  A request whose tenant is undefined or null is refused (401). */
  tenant?: (req: Req) => string | undefined | null;
  /** Per-client reply headers to store and replay anyway (e.g. ['set-cookie']).  Default none:
   *  Set-Cookie, Set-Cookie2, Authorization, Proxy-Authorization, Authentication-Info and
   *  Proxy-Authentication-Info go to the client that made the request but are not replayed. */
  keepHeaders?: string[];
  /** Which replies are stored (and replayed).  Default: below 500, but not 400, 401, 403, 408, 409, 415, 422, 425, 429. */
  store?: (status: number) => boolean;
  mode?: 'transaction' | 'lease';
  /** mode 'lease', when the reply is not stored (a 5xx...) or there is none (the request failed):
   *  'doubt' (default) leaves the attempt to its lease: the key answers 409, then turns unknown
   *  and a person or a verifier decides (the other system may have acted; a second call could
   *  do it twice).  'retry' fails the attempt retryable, so a retry calls the other system
   *  again: only for one that deduplicates by the key the handler passes it.  Any other value
   *  is a TypeError when the middleware is made. */
  onError?: 'doubt' | 'retry';
  /** Overrides the scope's lease for each attempt. */
  lease?: Duration;
  /** mode 'lease': the heartbeat (default true: every third of the lease). */
  heartbeat?: boolean | { everyMs?: number; extend?: Duration };
  /** What the other system has for the key (null or undefined: nothing), as callOnce's lookup.
   *  A retry that meets an unknown outcome takes the verification lease, looks it up and
   *  verifies: a reply found ({status, headers?, body?}) is stored and answered; nothing found,
   *  once the scope's verify_settle has passed, runs the request as the next attempt (before
   *  that: 409 key-in-doubt).  Without it a retry is answered 409 and takes no lease. */
  lookup?: (ctx: CallContext) => Promise<FoundReply | unknown | null | undefined>;
  /** The base of the problem types (RFC 9457) of the middleware's own answers. */
  problemTypeBase?: string;
}

export type ExpressLikeMiddleware = (req: IncomingMessage & { body?: unknown; originalUrl?: string },
  res: ServerResponse, next: (err?: unknown) => void) => Promise<void>;

export declare function idempotency(idem: Idempo, options: MiddlewareOptions): ExpressLikeMiddleware;
export declare function send(res: ServerResponse, answer: { status: number; headers: Record<string, string | string[]>; body: string | Buffer }): void;

declare global {
  namespace Express {
    interface Request { idempotency?: IdempotencyContext; }
  }
}
