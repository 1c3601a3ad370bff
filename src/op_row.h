/*-------------------------------------------------------------------------
 *
 * op_row.h
 *	  One row of idempo.operations in C, and the statements that read and
 *	  write it whole.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPO_OP_ROW_H
#define IDEMPO_OP_ROW_H

#include "idempo.h"

#include "storage/itemptr.h"

/*
 * Timestamps use DT_NOBEGIN (-infinity) for SQL NULL; text columns use
 * (Datum) 0 and jsonb columns NULL pointers.
 */
typedef struct OpRow
{
	IdempoStatus status;
	int32		attempt;
	bool		has_fingerprint;
	uint8		fingerprint[IDEMPO_DIGEST_LEN];
	Datum		run_id;
	TimestampTz first_seen_at;
	TimestampTz last_attempt_at;
	TimestampTz lease_expires_at;
	TimestampTz completed_at;
	TimestampTz expires_at;
	TimestampTz sweep_at;
	Jsonb	   *result;
	Datum		target_ref;
	Datum		error;
	Jsonb	   *params;
	int32		attempt_base;
} OpRow;

/* The columns of an operation as statements read and write them whole, in OP_COLUMNS order. */
typedef enum OpCol
{
	COL_FINGERPRINT,
	COL_STATUS,
	COL_ATTEMPT,
	COL_RUN_ID,
	COL_FIRST_SEEN_AT,
	COL_LAST_ATTEMPT_AT,
	COL_LEASE_EXPIRES_AT,
	COL_COMPLETED_AT,
	COL_EXPIRES_AT,
	COL_SWEEP_AT,
	COL_RESULT,
	COL_TARGET_REF,
	COL_ERROR,
	COL_PARAMS,
	COL_ATTEMPT_BASE,
	NUM_OP_COLS
} OpCol;

#define OP_COLUMNS \
	"fingerprint, status, attempt, run_id, first_seen_at, last_attempt_at, lease_expires_at, " \
	"completed_at, expires_at, sweep_at, result, target_ref, error, params, attempt_base"

/*
 * The sweep's statements, but for the tables they name (plans.c: idempo's
 * tables; citus.c: one node's shards).  The due rows come locked, ctid
 * first; the changes name the rows by ctid (see sweep.c).
 */
#define SWEEP_DUE_COLUMNS "ctid, scope, key, " OP_COLUMNS
#define SWEEP_DUE_WHERE \
	"WHERE sweep_at OPERATOR(pg_catalog.<=) $1 ORDER BY sweep_at LIMIT $2 FOR UPDATE SKIP LOCKED"
#define SWEEP_PURGE_WHERE "WHERE o.ctid OPERATOR(pg_catalog.=) ANY ($1)"
/* a finished record shrunk to a remembered key: what recognises the key and its request stays */
#define SWEEP_SHRINK_REST \
	"SET result = NULL, params = NULL, error = NULL, run_id = NULL, sweep_at = d.sweep_at " \
	"FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS d(tid, sweep_at) " \
	"WHERE o.ctid OPERATOR(pg_catalog.=) d.tid"
#define SWEEP_REVIEW_WHERE "WHERE o.ctid OPERATOR(pg_catalog.=) ANY ($1)"
/* the detail of a retention_expired review; op_retention_detail() writes the same */
#define SWEEP_REVIEW_DETAIL \
	"pg_catalog.format('still %s at attempt %s when the scope''s retention ran out (first seen %s)', " \
	"o.status, o.attempt, o.first_seen_at)"
#define SWEEP_REVIEW_ON_CONFLICT "ON CONFLICT (scope, key) WHERE resolved_at IS NULL DO NOTHING"
#define SWEEP_TO_REVIEW_REST \
	"SET status = 'in_review', sweep_at = NULL, lease_expires_at = NULL " \
	"WHERE o.ctid OPERATOR(pg_catalog.=) ANY ($1)"
/* an attempt made unknown keeps its lease's end in last_attempt_at (op_row_make_unknown()) */
#define SWEEP_SET_REST \
	"SET status = d.status::idempo.status, sweep_at = d.sweep_at, " \
	"last_attempt_at = CASE WHEN d.clear_lease AND d.status OPERATOR(pg_catalog.=) 'unknown' " \
	"THEN o.lease_expires_at ELSE o.last_attempt_at END, " \
	"lease_expires_at = CASE WHEN d.clear_lease THEN NULL ELSE o.lease_expires_at END " \
	"FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), " \
	"pg_catalog.unnest($4)) AS d(tid, status, sweep_at, clear_lease) " \
	"WHERE o.ctid OPERATOR(pg_catalog.=) d.tid"

typedef enum OpReadMode
{
	OP_READ_PLAIN,
	OP_READ_FOR_UPDATE,
	OP_READ_SKIP_LOCKED
} OpReadMode;

extern void op_row_init(OpRow *r);
extern void op_row_values(const OpRow *r, Datum *values, bool *isnull);
extern void op_row_from_values(const Datum *v, const bool *n, OpRow *r);
extern void op_row_from_tuple(HeapTuple tuple, TupleDesc desc, int first_col, OpRow *r);
extern bool op_row_read(const char *scope, const char *key, OpRow *r, OpReadMode mode);
extern bool op_row_insert(const char *scope, const char *key, const OpRow *r, ItemPointer tid);
extern void op_row_write(const char *scope, const char *key, const OpRow *r);
extern void op_row_copy_out(OpRow *r);
extern void op_row_check_attempt(const char *verb, const char *scope, const char *key,
								 int32 given, int32 current);
extern void op_row_refuse_missing(const char *verb, const char *scope, const char *key);
extern void op_row_refuse_not_acquired(const char *verb, const char *scope, const char *key,
									   const char *hint);

/* expiry.c */
typedef enum OpExpiry
{
	EXPIRY_NONE,				/* nothing due yet */
	EXPIRY_ABSENT,				/* finished, past expires_at (and not remembered): counts as absent */
	EXPIRY_REMEMBER,			/* finished, past expires_at, in a scope that remembers: shrink it */
	EXPIRY_REVIEW,				/* unfinished, past first_seen_at + retention */
	EXPIRY_LEASE_UNKNOWN,		/* in_progress, lease over: becomes unknown */
	EXPIRY_LEASE_RETRY			/* in_progress, lease over, 'retry' scope */
} OpExpiry;

extern TimestampTz op_review_at(const OpRow *r, const IdempoScope *s);
extern bool op_row_remembered(const OpRow *r);
extern void op_row_shrink(OpRow *r, const IdempoScope *s);
extern OpExpiry op_expiry(const OpRow *r, const IdempoScope *s, TimestampTz now,
						  TimestampTz *next_due);
extern void op_row_make_unknown(OpRow *r, const IdempoScope *s);
extern char *op_retention_detail(const OpRow *r);

/* direct.c: the hot writes through the access methods */
typedef enum OpDirectResult
{
	OP_DIRECT_UNAVAILABLE,		/* nothing done: use the SQL statement */
	OP_DIRECT_INSERTED,
	OP_DIRECT_EXISTS
} OpDirectResult;

typedef struct OpDirectFinish
{
	const char *scope;
	const char *key;
	int32		attempt;
	bool		on_commit;		/* admit a row this transaction made 'succeeded' */
	IdempoStatus to;
	Datum		result;			/* jsonb or 0 */
	Datum		target_ref;		/* text or 0 */
	Datum		error;			/* text or 0 */
	TimestampTz completed_at;	/* DT_NOBEGIN: NULL */
	TimestampTz expires_at;		/* DT_NOBEGIN: NULL */
} OpDirectFinish;

extern OpDirectResult op_direct_insert(const char *scope, const char *key, const OpRow *r,
									   ItemPointer tid);
extern bool op_direct_finish(const OpDirectFinish *f, ItemPointer tid);

/* direct.c: the inserts of claim_batch's new keys, through one open table */
typedef struct OpDirectBatch OpDirectBatch;
extern OpDirectBatch *op_direct_batch_begin(void);
extern OpDirectResult op_direct_batch_insert(OpDirectBatch *b, const char *scope, const char *key,
											 const OpRow *r, ItemPointer tid);
extern void op_direct_batch_end(OpDirectBatch *b);
extern bool op_direct_read_many(const char *scope, ArrayType *keys,
								void (*found) (const char *key, OpRow *r, bool in_flux, void *arg),
								void *arg);

/* claim.c: the record of a new key as a claim acquires it (attempt 1) */
/* the fingerprint claim() computes from params (claim.c): claim_batch uses it too */
extern void idempo_claim_fingerprint(const IdempoScope *scope, Jsonb *params, uint8 *digest_out);
extern void idempo_claim_new_record(OpRow *r, const IdempoScope *scope, TimestampTz now,
									Datum run_id, const uint8 *fingerprint, Jsonb *params,
									bool complete_on_commit);
/* claim.c: what claim_batch takes from the claim rather than restating it */
extern bool idempo_claim_read_only(void);
extern bool idempo_claim_lock(bool wait);
extern bool idempo_claim_answer_from_read(const IdempoScope *scope, const char *key,
										  const uint8 *fingerprint, const OpRow *r,
										  TimestampTz now, IdempoOutcome *outcome);
/* the columns of idempo.claim_result for an answer (claim.c): claim_batch's answers too */
#define IDEMPO_CLAIM_RESULT_COLS 11
extern void idempo_claim_result_values(IdempoOutcome outcome, const OpRow *r, int64 conflict_id,
									   int64 review_id, int natts, Datum *values, bool *nulls);
typedef enum OpKeyState
{
	KEY_QUIET,					/* no other transaction is changing the record */
	KEY_IN_FLUX,				/* another running transaction inserts, updates or deletes it */
	KEY_TABLE_LOCKED,			/* the primary key is locked by DDL: cannot look without waiting */
	KEY_CANNOT_TELL
} OpKeyState;

extern OpKeyState op_key_in_flux(const char *scope, const char *key);

#endif							/* IDEMPO_OP_ROW_H */
