// idempo/http: what the Express and Fastify middleware share (for other frameworks, and tests).
import type { RawJson } from './index';
import type { MiddlewareOptions } from './express';

export interface Answer { status: number; headers: Record<string, string | string[]>; body: string | Buffer; }
export interface StoredReply { status: number; headers: [string, string][]; body?: string; body_base64?: string; }

/** The fingerprint's input: method, path (with the query) and the body (JSON, or media type + SHA-256).
 *  Throws a Refusal (400 json-too-deep, its type under typeBase) for JSON nested more than MAX_JSON_DEPTH deep. */
export declare function paramsOf(request: {
  method: string; path: string; contentType?: string; body?: unknown; rawBody?: Buffer | string;
}, typeBase?: string): RawJson;
/** 64: arrays and objects nested deeper in a JSON body are refused (as the Python middleware does). */
export declare const MAX_JSON_DEPTH: number;
/** Whether a JSON text or a parsed value nests arrays and objects more than limit (MAX_JSON_DEPTH) deep. */
export declare function jsonTooDeep(value: unknown, limit?: number): boolean;
export declare function storedReply(status: number, headers: Record<string, unknown>, body: Buffer, keepHeaders?: string[]): StoredReply;
export declare function bodyOfStored(stored: StoredReply): string | Buffer;
export declare function headersOfStored(stored: StoredReply): Record<string, string | string[]>;
export declare function problem(status: number, slug: string, title: string, detail: string,
  headers?: Record<string, string>, typeBase?: string): Answer;
/** Replies stored by default: below 500, but not 400, 401, 403, 408, 409, 415, 422, 425, 429. */
export declare function defaultStore(status: number): boolean;
export declare const NOT_STORED: ReadonlySet<string>;
/** Per-client reply headers (set-cookie...): not stored unless options.keepHeaders names them. */
export declare const PER_CLIENT: ReadonlySet<string>;
/** A tenant or key field value with its '%' and '/' escaped (%25, %2F), as the Python middleware does. */
export declare function keyPart(value: string): string;
export declare const NOT_STORED_4XX: ReadonlySet<number>;
export declare class Refusal extends Error { readonly reply: Answer; }
/** The options' check every middleware makes when it is made: onError other than 'doubt' or
 *  'retry' is a TypeError (its message starts with `where`).  Returns the options. */
export declare function checkOptions<T extends Partial<MiddlewareOptions> | null | undefined>(options: T, where?: string): T;
/** The 503 (problem type #database-unavailable, Retry-After: 1) the middleware answers when the
 *  database could not be reached or the request's connection was lost before its outcome committed. */
export declare function unavailable(options: { problemTypeBase?: string }): Answer;
/** Whether an error means a lost connection, or none to be had (as idempo's isConnectionError). */
export declare function isConnectionError(err: unknown): boolean;
