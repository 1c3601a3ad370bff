// Types of idempo for Node.js (hand-written beside the JavaScript, checked by `tsc --noEmit`
// in the tests: test/types/).  No types of pg, Knex, Prisma or Kysely are imported: the
// adapters take what those libraries pass, structurally.

export declare const LIBRARY_VERSION: string;
export declare const SUPPORTED_TEXT: string;

export type OutcomeName = 'acquired' | 'replay' | 'busy' | 'conflict' | 'unknown' | 'in_review' | 'stale' | 'expired';
export type StatusName = 'in_progress' | 'succeeded' | 'failed' | 'retryable' | 'unknown' | 'in_review';
export declare const Outcome: {
  readonly ACQUIRED: 'acquired'; readonly REPLAY: 'replay'; readonly BUSY: 'busy'; readonly CONFLICT: 'conflict';
  readonly UNKNOWN: 'unknown'; readonly IN_REVIEW: 'in_review'; readonly STALE: 'stale'; readonly EXPIRED: 'expired';
};
export declare const Status: {
  readonly IN_PROGRESS: 'in_progress'; readonly SUCCEEDED: 'succeeded'; readonly FAILED: 'failed';
  readonly RETRYABLE: 'retryable'; readonly UNKNOWN: 'unknown'; readonly IN_REVIEW: 'in_review';
};

export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
export declare class RawJson { readonly text: string; constructor(text: string); }
export declare function rawJson(text: string): RawJson;
/** A duration: milliseconds, or PostgreSQL's interval text ('30 seconds'). */
export type Duration = number | string;

/** The answer of a claim.  The claims once() and the middleware pass on are read lean: the
 *  times are null there but a busy answer's leaseExpiresAt and leaseLeftMs (idem.lookup has them). */
export declare class Claim {
  readonly outcome: OutcomeName;
  readonly status: StatusName | null;
  readonly attempt: number | null;
  readonly result: Json | null;
  readonly targetRef: string | null;
  readonly error: string | null;
  readonly firstSeenAt: Date | null;
  readonly leaseExpiresAt: Date | null;
  readonly conflictId: number | null;
  readonly reviewId: number | null;
  readonly completedAt: Date | null;
  readonly leaseLeftMs: number | null;
}

export declare class Done<T = Json> {
  /** The function's value (first run) or the stored JSON (replay). */
  readonly result: T | null;
  readonly replayed: boolean;
  readonly status: StatusName;
  readonly attempt: number | null;
  readonly targetRef: string | null;
  readonly error: string | null;
  /** callOnce: settled by a lookup in the target system and idempo.verify. */
  readonly verified: boolean;
}

export interface Operation {
  scope: string; key: string; status: StatusName; attempt: number; runId: string | null;
  firstSeenAt: Date; lastAttemptAt: Date | null; leaseExpiresAt: Date | null; completedAt: Date | null;
  expiresAt: Date | null; result: Json | null; targetRef: string | null; error: string | null;
}

export interface ClaimOptions {
  params?: unknown;
  /** A SHA-256 you computed (32 bytes, or 64 hex characters); give params or fingerprint, not both. */
  fingerprint?: Buffer | string;
  runId?: string;
  intentAt?: Date | string;
  wait?: boolean;
  completeOnCommit?: boolean;
  /** Overrides the scope's lease for this attempt. */
  lease?: Duration;
  /** false: this caller cannot look the action up; an unknown outcome is answered without
   *  taking the verification lease (claim(verify_unknown => false)).  Default true. */
  verifyUnknown?: boolean;
}

export interface OnceOptions extends Omit<ClaimOptions, 'wait' | 'completeOnCommit'> {
  /** 'raise' (default): throw BusyError at once; 'wait': ask again until busyTimeoutMs. */
  onBusy?: 'wait' | 'raise';
  busyTimeoutMs?: number;
  targetRef?: string | ((value: any) => string | undefined);
}

export interface CallContext {
  scope: string;
  key: string;
  attempt: number;
  /** Aborted when the attempt lost its lease (another worker took the key over). */
  signal: AbortSignal;
  stage?: 'call' | 'record';
}

export type ErrorKind = 'retryable' | 'failed' | 'unknown';

export interface CallOnceOptions<V, R, H> extends Omit<ClaimOptions, 'wait' | 'completeOnCommit'> {
  call: (ctx: CallContext) => Promise<V>;
  lookup?: (ctx: CallContext) => Promise<V | null | undefined>;
  record?: (tx: H, value: V, ctx: CallContext) => Promise<R>;
  targetRef?: (value: V) => string | undefined;
  /** Default: () => 'unknown' (the call may have taken effect). */
  classifyError?: (err: unknown, ctx: CallContext) => ErrorKind;
  onBusy?: 'wait' | 'raise';
  busyTimeoutMs?: number;
  /** true (default): every third of the lease; false: none; or when and by how much. */
  heartbeat?: boolean | { everyMs?: number; extend?: Duration };
  maxRounds?: number;
}

/** How idempo reaches the database; see idempo.pg/knex/prisma/kysely. */
export interface Adapter<H = unknown> {
  readonly kind: string;
  readonly handle: H;
  readonly inTransaction: boolean;
  query(text: string, values: unknown[]): Promise<any[]>;
  transaction<T>(fn: (tx: Adapter<H>) => Promise<T>): Promise<T>;
  bind(handle: H): Adapter<H>;
}

/** The parts of pg's Pool, Client and PoolClient that idempo uses. */
export interface PgQueryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
}
export interface PgPoolLike extends PgQueryable { connect(): Promise<PgClientLike>; totalCount: number; }
export interface PgClientLike extends PgQueryable { release?(err?: unknown): void; }

export interface LogLike { error(message: string): void; }
export interface IdempoOptions { log?: LogLike; }

export declare class Idempo<H = any> {
  constructor(db: PgPoolLike | PgClientLike | Adapter<H>, options?: IdempoOptions);
  readonly db: Adapter<H>;
  /** The same library in a transaction the caller opened; helpers never commit or roll it back. */
  within(handle: H): Idempo<H>;
  /** Resolves with idempo's version; rejects with UnsupportedVersionError. Called by every method. */
  ensureVersion(): Promise<string>;

  claim(scope: string, key: string, options?: ClaimOptions): Promise<Claim>;
  complete(scope: string, key: string, options?: { attempt?: number; result?: unknown; targetRef?: string }): Promise<StatusName>;
  fail(scope: string, key: string, options?: { attempt?: number; error?: string; retryable?: boolean }): Promise<StatusName>;
  verify(scope: string, key: string, attempt: number, found: boolean,
    options?: { targetRef?: string; result?: unknown }): Promise<StatusName>;
  heartbeat(scope: string, key: string, attempt: number, options?: { extend?: Duration }): Promise<Date>;
  lookup(scope: string, key: string): Promise<Operation | null>;
  changedFields(conflictId: number | null): Promise<ChangedField[] | null>;

  once<T>(scope: string, key: string, fn: (tx: H, claim: Claim) => Promise<T>): Promise<Done<T>>;
  once<T>(scope: string, key: string, options: OnceOptions, fn: (tx: H, claim: Claim) => Promise<T>): Promise<Done<T>>;
  callOnce<V, R = V>(scope: string, key: string, options: CallOnceOptions<V, R, H>): Promise<Done<R>>;
}

export interface ChangedField { field: string; stored: Json; incoming: Json; }

// --- adapters -----------------------------------------------------------------------------------
export declare function pg<H extends PgQueryable>(db: H, options?: { inTransaction?: boolean }): Adapter<any>;
/** A knex instance or transaction (structural: raw() and transaction()). */
export declare function knex<K extends { raw(sql: string, bindings: unknown[]): any; transaction: any }>(db: K, options?: { inTransaction?: boolean }): Adapter<K>;
/** What Prisma's interactive transaction hands over: the client without the methods it denies
 *  there (Prisma.TransactionClient).  The handle of the functions, and what within() takes. */
export type PrismaTransaction<P> = Omit<P, '$connect' | '$disconnect' | '$on' | '$transaction' | '$use' | '$extends'>;
/** A PrismaClient or the tx of $transaction (structural: $queryRawUnsafe). */
export declare function prisma<P extends { $queryRawUnsafe(query: string, ...values: unknown[]): Promise<unknown> }>(
  db: P, options?: { inTransaction?: boolean; transaction?: { timeout?: number; maxWait?: number; isolationLevel?: string } }): Adapter<PrismaTransaction<P>>;
/** A Kysely instance or transaction, with Kysely's CompiledQuery class. */
export declare function kysely<D extends { executeQuery(q: any): Promise<{ rows: any[] }> }>(
  db: D, options: { CompiledQuery: { raw(sql: string, parameters?: readonly unknown[]): any }; inTransaction?: boolean }): Adapter<D>;

// --- errors -------------------------------------------------------------------------------------
export declare class IdempoError extends Error {
  /** The SQLSTATE (refusals of the database). */
  code?: string; detail?: string; hint?: string; scope?: string; key?: string;
}
export declare class InvalidArgumentError extends IdempoError {}
export declare class NotFoundError extends IdempoError {}
export declare class AlreadyExistsError extends IdempoError {}
export declare class PermissionDeniedError extends IdempoError {}
export declare class StateError extends IdempoError {}
export declare class LockNotAvailableError extends IdempoError {}
export declare class SerializationError extends IdempoError {}
export declare class ReadOnlyError extends IdempoError {}
export declare class NotReplicatedError extends IdempoError {}
export declare class UndefinedFunctionError extends IdempoError {}
export declare class FeatureNotSupportedError extends IdempoError {}
export declare class DependentObjectsError extends IdempoError {}
export declare class UnsupportedVersionError extends IdempoError {}
export declare class LeaseLostError extends IdempoError {}
/** The connection to the database was lost, or none could be had (a restart, a terminated backend):
 *  the transaction did not commit, unless it was lost during COMMIT. The driver's error is its cause. */
export declare class ConnectionLostError extends IdempoError {}
export declare class OutcomeError extends IdempoError {
  readonly outcome?: OutcomeName; readonly status?: StatusName | null; readonly claim: Claim | null;
}
export declare class ConflictError extends OutcomeError {
  readonly conflictId: number | null; readonly changedFields: ChangedField[] | null;
}
export declare class BusyError extends OutcomeError {
  readonly leaseExpiresAt: Date | null; readonly retryAfterMs: number | null;
}
export declare class InReviewError extends OutcomeError { readonly reviewId: number | null; }
/** stale (an InReviewError too). */
export declare class StaleError extends InReviewError {}
export declare class ExpiredError extends OutcomeError {}
export declare class UnknownOutcomeError extends OutcomeError {
  readonly attempt: number | null;
  /** Not found inside the settle window: when it ends (the attempt's lease end + the scope's
   *  verify_settle; null if this role cannot read idempo.scopes).  Call again after it. */
  readonly settlesAt?: Date | null;
}
export declare const BY_SQLSTATE: Readonly<Record<string, new (...args: any[]) => IdempoError>>;
export declare function fromDatabaseError(err: unknown, scope?: string, key?: string): unknown;
/** The SQLSTATE of a driver's error (pg, Knex, Prisma's raw queries with its engine or a driver adapter), if any. */
export declare function sqlstateOf(err: unknown): string | undefined;
/** Whether a driver's error means a lost connection, or none to be had (SQLSTATE class 08, 57P01-57P03,
 *  a socket error, node-postgres' "Connection terminated..."). */
export declare function isConnectionError(err: unknown): boolean;
