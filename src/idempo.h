/*-------------------------------------------------------------------------
 *
 * idempo.h
 *	  Shared declarations of the idempo extension, and the state machine it
 *	  enforces.
 *
 * An operation is the processing record of one business action, identified
 * by (scope, key).  Its status moves only along these edges:
 *
 *	 (none) --claim--> in_progress --complete--> succeeded
 *	                        |      --fail(retryable)--> retryable --claim--> in_progress (attempt+1)
 *	                        |      --fail(final)--> failed
 *	                        +--lease runs out--> unknown   (scope on_lease_expiry = 'unknown')
 *	                        +--lease runs out--> in_progress, attempt+1 (on_lease_expiry = 'retry')
 *	 unknown/retryable --complete/fail of the current attempt (a late reply)--> succeeded/failed/retryable
 *	 unknown --verify(found)--> succeeded; --verify(not found, settle window passed)--> retryable
 *	 unknown --claim--> unknown with a verification lease (lease_expires_at set: one
 *	   caller at a time looks it up; other claims answer busy until it runs out, or
 *	   verify, complete/fail, review end it; claim.c)
 *	 in_progress/retryable/unknown --first_seen_at + retention passed--> in_review
 *	 retryable with max_attempts used --claim--> in_review
 *	 (none), claim with intent_at older than retention --> in_review (stale)
 *	 succeeded/failed --expires_at passed--> (absent: purged, or replaced by a new claim)
 *	   in scopes with remember > 0 instead: shrunk to a remembered key (status
 *	   kept; result, params, error, run_id dropped; sweep_at = expires_at +
 *	   remember), which claims answer 'expired', and which is purged (absent)
 *	   once sweep_at passes.  A finished row is remembered exactly when its
 *	   sweep_at is later than its expires_at (op_row_remembered()).
 *	 in_review --resolve--> succeeded/failed/retryable; nothing automatic touches it.
 *
 * Invariants kept by every writer (and checked by idempo.check_consistency):
 *	 - attempt grows by one with each acquisition and doubles as fencing token:
 *	   complete/fail/verify name an attempt, and a superseded one is refused;
 *	 - in_progress rows have lease_expires_at, unknown rows may (the
 *	   verification lease), no others; finished rows have completed_at and
 *	   expires_at; in_review rows have exactly one open review;
 *	 - sweep_at is never later than the first time the sweep has work on the
 *	   row (it may be earlier: the sweep then just moves it forward).
 *
 * Timestamps are computed here in C and passed to plain SQL statements as
 * parameters (no volatile functions in DML), so the same statements run on a
 * distributed (Citus) operations table.
 *
 * Copyright (c) 2026, idempo developers
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPO_H
#define IDEMPO_H

#include "postgres.h"

#include "compat.h"

#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

/* Mirrors the label order of the SQL enum idempo.status. */
typedef enum IdempoStatus
{
	STATUS_IN_PROGRESS,
	STATUS_SUCCEEDED,
	STATUS_FAILED,
	STATUS_RETRYABLE,
	STATUS_UNKNOWN,
	STATUS_IN_REVIEW,
	NUM_STATUSES
} IdempoStatus;

/* Mirrors the label order of the SQL enum idempo.outcome. */
typedef enum IdempoOutcome
{
	OUTCOME_ACQUIRED,
	OUTCOME_REPLAY,
	OUTCOME_BUSY,
	OUTCOME_CONFLICT,
	OUTCOME_UNKNOWN,
	OUTCOME_IN_REVIEW,
	OUTCOME_STALE,
	OUTCOME_EXPIRED,			/* a remembered key: finished, its result gone (0.3.0) */
	NUM_OUTCOMES
} IdempoOutcome;

#define IDEMPO_MAX_SCOPE_BYTES	128
#define IDEMPO_MAX_KEY_BYTES	1024
#define IDEMPO_DIGEST_LEN		32	/* SHA-256 */
#define IDEMPO_DIGEST_HEX_LEN	64

/* idempo's own SQLSTATE (class ID: implementation-defined, per the SQL standard) */
#define ERRCODE_IDEMPO_NOT_REPLICATED	MAKE_SQLSTATE('I','D','0','0','1')

extern const char *const idempo_status_names[NUM_STATUSES];
extern const char *const idempo_outcome_names[NUM_OUTCOMES];
extern const char *idempo_status_phrase(IdempoStatus s);

static inline bool
idempo_status_finished(IdempoStatus s)
{
	return s == STATUS_SUCCEEDED || s == STATUS_FAILED;
}

static inline bool
idempo_status_unfinished(IdempoStatus s)
{
	return s == STATUS_IN_PROGRESS || s == STATUS_RETRYABLE || s == STATUS_UNKNOWN;
}

/* ---- catalog.c: OIDs of the extension's objects in this database ---- */

typedef struct IdempoCatalog
{
	Oid			namespace_oid;
	Oid			scopes_relid;
	Oid			operations_relid;
	Oid			owner;			/* owner of idempo.operations: runs our SQL */
	bool		scope_rules;	/* idempo.scopes has durability, remember, fingerprint_ignore (0.3.0) */
	Oid			status_typid;
	Oid			outcome_typid;
	Oid			status_label[NUM_STATUSES];	/* pg_enum OIDs */
	Oid			outcome_label[NUM_OUTCOMES];	/* InvalidOid: not in this version */
} IdempoCatalog;

extern const IdempoCatalog *idempo_catalog(void);
extern IdempoStatus idempo_status_from_datum(Datum d);
extern Datum idempo_status_datum(IdempoStatus s);
extern Datum idempo_outcome_datum(IdempoOutcome o);
extern void idempo_catalog_register_callbacks(void);
typedef void (*idempo_relcache_watcher) (Oid relid);
extern void idempo_catalog_watch_relcache(idempo_relcache_watcher watcher);

/* ---- plans.c: kept SPI plans, prepared on first use ---- */

typedef enum IdempoPlanId
{
	PLAN_SCOPE_GET,
	PLAN_SCOPE_GET_0_2,
	PLAN_OP_INSERT,
	PLAN_OP_SELECT_FOR_UPDATE,
	PLAN_OP_SELECT_SKIP_LOCKED,
	PLAN_OP_SELECT,
	PLAN_OP_WRITE,
	PLAN_OP_FINISH,
	PLAN_OP_LOOKUP,
	PLAN_REVIEW_OPEN,
	PLAN_REVIEW_FIND_OPEN,
	PLAN_REVIEW_CLOSE,
	PLAN_EVENT_LOG,
	PLAN_SWEEP_DUE,
	PLAN_SWEEP_PURGE,
	PLAN_SWEEP_SHRINK,
	PLAN_SWEEP_REVIEW,
	PLAN_SWEEP_REVIEW_SAFE,
	PLAN_SWEEP_TO_REVIEW,
	PLAN_SWEEP_SET,
	PLAN_CONFLICT_RECORD,
	PLAN_CONFLICT_RECORD_0_2,
	PLAN_CONFLICT_NEXT_ID,
	PLAN_OP_PROBE_BATCH,		/* claim_batch's read of many keys (claim_batch.c) */
	NUM_PLANS
} IdempoPlanId;

extern SPIPlanPtr idempo_plan(IdempoPlanId id);
extern int	idempo_plan_arg_types(IdempoPlanId id, Oid *types);

/* Runs SPI as the extension owner between these two calls. */
typedef struct IdempoSpiSession
{
	Oid			save_userid;
	int			save_sec_context;
} IdempoSpiSession;

extern void idempo_spi_begin(IdempoSpiSession *session);
extern void idempo_spi_end(IdempoSpiSession *session);
extern MemoryContext idempo_spi_outermost_context(void);
extern int	idempo_spi_execute(IdempoPlanId id, Datum *values, const char *nulls, long tcount);
extern int	idempo_spi_read_latest(IdempoPlanId id, Datum *values, const char *nulls, long tcount);

/* subxact.c */
extern bool idempo_try_in_subxact(void (*body) (void *arg), void *arg, int expected);
extern void idempo_in_undone_subxact(void (*body) (void *arg), void *arg);

/* ---- fingerprint_rules.c: fields left out of the fingerprint ---- */

#define IDEMPO_IGNORE_MAX_PATHS			256
#define IDEMPO_IGNORE_MAX_PATH_BYTES	1024

typedef struct IdempoIgnore IdempoIgnore;	/* a compiled list of paths; NULL: none */

/*
 * A compiled list of paths is a tree of object keys (fingerprint_rules.c,
 * fingerprint_include.c): a node per key a path goes through, terminal where
 * one ends; each is include's [*] (every element of an array).
 */
typedef struct IdempoPathNode
{
	char	   *key;			/* the key this node is reached by; NULL: the root or [*] */
	int			keylen;
	bool		terminal;		/* a path ends here */
	int			nkeys;
	struct IdempoPathNode **keys;	/* the object members paths continue in */
	struct IdempoPathNode *each;	/* [*]: every element of an array (include only) */
} IdempoPathNode;

extern IdempoPathNode *idempo_path_key(const IdempoPathNode *n, const char *key, int len);
extern IdempoPathNode *idempo_path_add_key(MemoryContext cxt, IdempoPathNode *n, const char *key,
										   int len);

/* How a list of fingerprint paths is named in its errors (fingerprint_ignore, fingerprint_include). */
typedef struct IdempoPathList
{
	const char *rule;			/* "ignore", "include": fingerprint_<rule>, fingerprint <rule> path */
	const char *example;		/* the hint for a list of several dimensions */
	const char *many_hint;		/* for a list over IDEMPO_IGNORE_MAX_PATHS */
	const char *empty_hint;		/* for an empty path */
} IdempoPathList;

extern int	idempo_path_list(ArrayType *paths, const IdempoPathList *list, const char *scope,
							 text ***paths_out);
extern void idempo_path_refuse(const IdempoPathList *list, const char *scope, int index,
							   const char *what, const char *hint);

extern IdempoIgnore *idempo_ignore_compile(ArrayType *paths, MemoryContext cxt, const char *scope);
extern Jsonb *idempo_ignore_apply(Jsonb *jb, const IdempoIgnore *ignore);
extern void idempo_fingerprint_ignoring_jsonb(Jsonb *jb, const IdempoIgnore *ignore, uint8 *digest_out);

/* ---- fingerprint_include.c: the only fields that count (same limits as the ignore list) ---- */

typedef struct IdempoInclude IdempoInclude;	/* a compiled list of paths; NULL: every field counts */

extern IdempoInclude *idempo_include_compile(ArrayType *paths, MemoryContext cxt, const char *scope);
extern Jsonb *idempo_include_apply(Jsonb *jb, const IdempoInclude *include);
extern Jsonb *idempo_fingerprint_view(Jsonb *jb, const IdempoInclude *include, const IdempoIgnore *ignore);

/* ---- scope_cache.c: the scopes, cached per backend (valid until the caller's SPI session ends) ---- */

typedef struct IdempoScope
{
	char		name[IDEMPO_MAX_SCOPE_BYTES + 1];
	bool		enabled;
	/* the timings, added to times with idempo_time_plus() (the UTC calendar, clock.c) */
	Interval	retention;
	Interval	lease;
	Interval	verify_settle;
	bool		retry_on_lease_expiry;
	int32		max_attempts;	/* 0: no limit */
	bool		require_fingerprint;
	bool		hash_keys;
	bool		store_params;
	bool		audit;
	bool		replicated;		/* durability 'replicated': acquisitions commit only with a synchronous standby */
	Interval	remember;
	bool		remembers;		/* remember > 0; else finished records are purged at expires_at */
	ArrayType  *fingerprint_ignore_paths;	/* the column; NULL or empty: every field counts */
	IdempoIgnore *fingerprint_ignore;	/* compiled from it when first needed */
	bool		fingerprint_ignore_compiled;
	ArrayType  *fingerprint_include_paths;	/* the column; NULL or empty: every field counts */
	IdempoInclude *fingerprint_include;	/* compiled from it when first needed */
	bool		fingerprint_include_compiled;
	char	   *allowed_role_name;	/* NULL: anyone with EXECUTE; looked up at each use */
	char	   *review_role_name;	/* NULL: allowed_role's members review (review_rights.c) */
	char	   *owner;			/* may be NULL */
	MemoryContext cxt;			/* where the strings, lists and compiled list live */
} IdempoScope;

extern const IdempoScope *idempo_scope_get(const char *name);
extern const IdempoScope *idempo_scope_get_for_write(const char *name);
extern const IdempoScope *idempo_scope_find(const char *name);
extern void idempo_scope_cache_register_callbacks(void);
extern void idempo_scope_check_use(const IdempoScope *scope, const char *key, Oid user);
extern void idempo_scope_check_read(const IdempoScope *scope, const char *key, Oid user);
extern void idempo_scope_check_verify(const IdempoScope *scope, const char *key, Oid user);

/* ---- review_rights.c: who may review a scope, whom a decision names ---- */

extern bool idempo_scope_may_review(const IdempoScope *scope, Oid user);
extern void idempo_scope_check_review(const IdempoScope *scope, const char *key, Oid user,
									  const char *what);
extern char *idempo_reviewer_name(const char *reviewer, Oid user);
extern const IdempoIgnore *idempo_scope_ignore(const IdempoScope *scope);
extern const IdempoInclude *idempo_scope_include(const IdempoScope *scope);
extern void idempo_scope_values(const IdempoScope *scope, IdempoScope *out);

/* ---- keys.c: argument checks and the stored form of keys ---- */

extern char *idempo_scope_arg(FunctionCallInfo fcinfo, int argno);
extern char *idempo_key_arg(FunctionCallInfo fcinfo, int argno, const IdempoScope *scope);
extern void idempo_hex_digest(const uint8 *data, size_t len, char *hex_out);
extern char *idempo_bytea_arg_text(bytea *b);

/* ---- fingerprint.c ---- */

extern void idempo_fingerprint_jsonb(Jsonb *jb, uint8 *digest_out);
extern void idempo_sha256(const uint8 *data, size_t len, uint8 *digest_out);

/* ---- clock.c ---- */

extern char *idempo_clock_offset;
extern bool idempo_clock_offset_check(char **newval, void **extra, GucSource source);
extern void idempo_clock_offset_assign(const char *newval, void *extra);
extern TimestampTz idempo_now(void);
extern TimestampTz idempo_time_add(TimestampTz t, int64 usecs);
extern TimestampTz idempo_time_plus(TimestampTz t, const Interval *iv);
extern int64 idempo_interval_usecs(const Interval *iv);
struct IdempoScope;
extern void idempo_lease_check(const Interval *iv, const struct IdempoScope *scope, const char *key,
							   const char *name, const char *call);

/* ---- txn_attempts.c: the attempts this transaction acquired ---- */

extern void idempo_txn_remember(const IdempoScope *scope, const char *key, int32 attempt,
								bool on_commit, ItemPointer tid);
extern bool idempo_txn_lookup(const char *scope, const char *key, int32 *attempt,
							  bool *on_commit, ItemPointer tid);
extern void idempo_txn_moved(const char *scope, const char *key, ItemPointer tid);
extern bool idempo_txn_holds(const char *scope, const char *key, int32 *attempt, bool *on_commit);
extern void idempo_txn_finished(const char *scope, const char *key, int32 attempt);
extern void idempo_txn_register_callbacks(void);

/* ---- durability.c: scopes with durability 'replicated' ---- */

extern void idempo_durability_check_commit(const char *scope, const char *key);

/* ---- sweep.c ---- */

typedef struct IdempoSweepCounts
{
	int64		lease_expired;
	int64		moved_to_review;
	int64		purged;
	int64		remembered;		/* shrunk to a remembered key */
	int64		rows_seen;		/* rows examined, including those only rescheduled */
} IdempoSweepCounts;

typedef void (*idempo_sweep_tally_fn) (const char *scope, const IdempoSweepCounts *counts,
									   void *arg);

extern void idempo_sweep_batch(int batch, TimestampTz now, Oid actor, IdempoSweepCounts *total,
							   idempo_sweep_tally_fn tally, void *tally_arg);

/* ---- shmem.c: counters, present only with shared_preload_libraries = 'idempo' ---- */

typedef enum IdempoCounter
{
	COUNTER_CLAIMS = 0,			/* + IdempoOutcome */
	COUNTER_SWEEPS = NUM_OUTCOMES,
	COUNTER_LEASE_EXPIRED,
	COUNTER_MOVED_TO_REVIEW,
	COUNTER_PURGED,
	COUNTER_WORKER_ERRORS,
	COUNTER_REMEMBERED,			/* finished records shrunk to remembered keys */
	NUM_COUNTERS
} IdempoCounter;

/* Sets up idempo's shared memory (the counters, the workers' slots, the conflict queue). */
extern void idempo_shmem_install_hooks(void);
/* Adds n to a counter of idempo.counters(); nothing without the shared memory. */
extern void idempo_count(IdempoCounter counter, uint64 n);

/*
 * The rest of the shared memory, the launcher, the sweepers and the
 * conflict queue are the worker layer's own: worker.h.
 */

/* ---- guc.c ---- */

extern char *idempo_databases;
extern int	idempo_sweep_interval_ms;
extern int	idempo_sweep_batch_size;
extern bool idempo_worker_enabled;
extern bool idempo_direct_writes;
extern bool idempo_allow_drop_with_records;

extern void idempo_define_gucs(void);
extern bool idempo_database_listed(const char *name);

/* ---- drop_guard.c ---- */

extern void idempo_install_drop_hook(void);

/* ---- launcher.c, db_guard.c: set up by _PG_init ---- */

/* Defines the launcher's background worker (postmaster only, at load). */
extern void idempo_register_launcher_worker(void);
/* Makes DROP/ALTER DATABASE stop the database's sweeper first, and CREATE EXTENSION wake the launcher. */
extern void idempo_install_utility_hook(void);

/* ---- replication.c: databases that receive idempo's tables by logical replication ---- */

extern const char *idempo_records_subscription(void);
extern const char *idempo_scopes_subscription(void);
extern void idempo_refuse_on_subscriber(const char *scope, const char *key, const char *why);
extern void idempo_refuse_sweep_on_subscriber(void);
extern void idempo_refuse_scope_change_on_subscriber(void);

/* ---- conflicts.c ---- */

typedef struct IdempoConflict
{
	const char *scope;
	const char *key;
	const uint8 *stored_fingerprint;
	const uint8 *incoming_fingerprint;
	Jsonb	   *stored_params;	/* may be NULL */
	Jsonb	   *incoming_params;	/* may be NULL */
	const char *run_id;			/* may be NULL */
	TimestampTz detected_at;
} IdempoConflict;

extern int64 idempo_record_conflict(const IdempoConflict *conflict);

/* ---- audit.c ---- */

extern void idempo_log_event(const IdempoScope *scope, const char *key, const char *run_id,
							 int32 attempt, int from_status, int to_status, int outcome,
							 const char *action, TimestampTz at, Oid actor);
extern int64 idempo_open_review(const char *scope, const char *key, const char *reason,
								const char *detail, TimestampTz at);
extern void idempo_close_review(const char *scope, const char *key, const char *reviewer,
								const char *resolution, const char *note, TimestampTz at);

#endif							/* IDEMPO_H */
