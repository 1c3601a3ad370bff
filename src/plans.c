/*-------------------------------------------------------------------------
 *
 * plans.c
 *	  Every SQL statement idempo runs, prepared once per backend and kept.
 *
 * Statements are written against the schema-qualified tables with
 * OPERATOR(pg_catalog.x), so the caller's search_path cannot change what
 * they mean.  Status and outcome parameters are passed as text and cast in
 * the statement: argument types are then all built-in, and the plan cache
 * can re-analyse a kept plan by itself after DROP/CREATE EXTENSION.
 *
 * Plans must not depend on table statistics: right after a VACUUM of an
 * emptied idempo.operations the planner believes the table is empty and
 * would plan a primary-key lookup as a sequential scan, and the plan would
 * stay until the next ANALYZE.  Every statement here is meant to use an
 * index, so plans are generic (CURSOR_OPT_GENERIC_PLAN: built only when
 * invalid) and are built with sequential scans, hash and merge joins
 * disabled.  The settings apply only while a plan is being built.
 *
 * idempo_spi_begin/end switch to the extension owner around SPI, as
 * ri_triggers.c does for foreign keys: callers need EXECUTE on the
 * functions, not rights on the tables, and the state machine cannot be
 * bypassed with a plain UPDATE.
 *
 * Dependencies: this file uses catalog.c (the owner) and replication.c (the
 * write check); scope_cache.c builds on it, and neither of those calls it.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "op_row.h"

#define OP_BY_KEY \
	" FROM idempo.operations WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"

/* What a statement writes, for the check on logical-replication subscribers (replication.c). */
typedef enum PlanWrites
{
	WRITES_NOTHING = 0,
	WRITES_KEY_1,				/* the record of ($1 scope, $2 key) */
	WRITES_KEY_2,				/* the record of ($2 scope, $3 key) */
	WRITES_BATCH				/* rows of a sweep batch */
} PlanWrites;

typedef struct PlanDef
{
	const char *sql;
	/*
	 * one letter per parameter: t text, b bytea, i int4, l int8, T timestamptz, j jsonb, B bool,
	 * and arrays: a text[], z timestamptz[], o bool[], c tid[]
	 */
	const char *args;
	PlanWrites	writes;
} PlanDef;

static const PlanDef plan_defs[NUM_PLANS] = {
	[PLAN_SCOPE_GET] = {
		"SELECT retention, lease, on_lease_expiry, verify_settle, max_attempts, "
		"require_fingerprint, hash_keys, store_params, audit, "
		"allowed_role::pg_catalog.text, owner, enabled, durability, remember, fingerprint_ignore, "
		"fingerprint_include, review_role::pg_catalog.text "
		"FROM idempo.scopes WHERE name OPERATOR(pg_catalog.=) $1",
		"t"
	},
	/* objects of 0.1.0 and 0.2.0: every scope 'local', no remembered keys, every field counts */
	[PLAN_SCOPE_GET_0_2] = {
		"SELECT retention, lease, on_lease_expiry, verify_settle, max_attempts, "
		"require_fingerprint, hash_keys, store_params, audit, "
		"allowed_role::pg_catalog.text, owner, enabled "
		"FROM idempo.scopes WHERE name OPERATOR(pg_catalog.=) $1",
		"t"
	},
	[PLAN_OP_INSERT] = {
		"INSERT INTO idempo.operations (scope, key, " OP_COLUMNS ") "
		"VALUES ($1, $2, $3, $4::idempo.status, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) "
		"ON CONFLICT (scope, key) DO NOTHING",
		"ttbtitTTTTTTjttji",
		WRITES_KEY_1
	},
	[PLAN_OP_SELECT_FOR_UPDATE] = {
		"SELECT " OP_COLUMNS OP_BY_KEY " FOR UPDATE",
		"tt"
	},
	[PLAN_OP_SELECT_SKIP_LOCKED] = {
		"SELECT " OP_COLUMNS OP_BY_KEY " FOR UPDATE SKIP LOCKED",
		"tt"
	},
	[PLAN_OP_SELECT] = {
		"SELECT " OP_COLUMNS OP_BY_KEY,
		"tt"
	},
	[PLAN_OP_WRITE] = {
		"UPDATE idempo.operations SET fingerprint = $3, status = $4::idempo.status, attempt = $5, "
		"run_id = $6, first_seen_at = $7, last_attempt_at = $8, lease_expires_at = $9, "
		"completed_at = $10, expires_at = $11, sweep_at = $12, result = $13, target_ref = $14, "
		"error = $15, params = $16, attempt_base = $17 "
		"WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2",
		"ttbtitTTTTTTjttji",
		WRITES_KEY_1
	},

	/*
	 * complete/fail in one statement, fenced by attempt: the current attempt
	 * may finish while the operation is in_progress, unknown (its reply came
	 * late) or retryable (someone concluded "not executed", but the attempt's
	 * own reply proves what happened; once a new attempt is acquired, the
	 * old one is fenced).  It normally changes no indexed column (sweep_at
	 * only moves if the new expiry is earlier, e.g. after the clock stepped
	 * back), so it can be a HOT update.  $10 admits a row this transaction
	 * already made 'succeeded' with complete_on_commit.
	 */
	[PLAN_OP_FINISH] = {
		"UPDATE idempo.operations SET status = $4::idempo.status, result = $5, target_ref = $6, "
		"error = $7, completed_at = $8, expires_at = $9, lease_expires_at = NULL, "
		"sweep_at = LEAST(sweep_at, $9) "
		"WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 "
		"AND attempt OPERATOR(pg_catalog.=) $3 "
		"AND (status OPERATOR(pg_catalog.=) 'in_progress'::idempo.status "
		"  OR status OPERATOR(pg_catalog.=) 'unknown'::idempo.status "
		"  OR status OPERATOR(pg_catalog.=) 'retryable'::idempo.status "
		"  OR ($10 AND status OPERATOR(pg_catalog.=) 'succeeded'::idempo.status))",
		"ttitjttTTB",
		WRITES_KEY_1
	},
	[PLAN_OP_LOOKUP] = {
		"SELECT o FROM idempo.operations o "
		"WHERE o.scope OPERATOR(pg_catalog.=) $1 AND o.key OPERATOR(pg_catalog.=) $2",
		"tt"
	},
	/*
	 * $6 is the operation row as text (PLAN_OP_LOOKUP): a plain INSERT ...
	 * VALUES that names its key, which Citus can route inside a delegated
	 * call (an INSERT ... SELECT it cannot).
	 */
	[PLAN_REVIEW_OPEN] = {
		"INSERT INTO idempo.reviews (scope, key, reason, opened_at, operation, detail) "
		"VALUES ($1, $2, $3, $4, $6::idempo.operations, $5) "
		"ON CONFLICT (scope, key) WHERE resolved_at IS NULL DO NOTHING RETURNING id",
		"tttTtt",
		WRITES_KEY_1
	},
	[PLAN_REVIEW_FIND_OPEN] = {
		"SELECT id FROM idempo.reviews WHERE scope OPERATOR(pg_catalog.=) $1 "
		"AND key OPERATOR(pg_catalog.=) $2 AND resolved_at IS NULL",
		"tt"
	},
	[PLAN_REVIEW_CLOSE] = {
		"UPDATE idempo.reviews SET resolved_at = $3, resolved_by = $4, resolution = $5, note = $6 "
		"WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2 AND resolved_at IS NULL",
		"ttTttt",
		WRITES_KEY_1
	},
	[PLAN_EVENT_LOG] = {
		"INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, "
		"outcome, action, actor) VALUES ($1, $2, $3, $4, $5, $6::idempo.status, "
		"$7::idempo.status, $8::idempo.outcome, $9, $10)",
		"Ttttittttt",
		WRITES_KEY_2
	},

	/*
	 * The sweep: due rows (SKIP LOCKED: never wait for a claim), then one
	 * statement per kind of change for the whole batch.
	 */
	[PLAN_SWEEP_DUE] = {
		"SELECT " SWEEP_DUE_COLUMNS " FROM idempo.operations " SWEEP_DUE_WHERE,
		"Ti"
	},
	[PLAN_SWEEP_PURGE] = {
		"DELETE FROM idempo.operations o " SWEEP_PURGE_WHERE,
		"c",
		WRITES_BATCH
	},
	[PLAN_SWEEP_SHRINK] = {
		"UPDATE idempo.operations o " SWEEP_SHRINK_REST,
		"cz",
		WRITES_BATCH
	},
	[PLAN_SWEEP_REVIEW] = {
		"INSERT INTO idempo.reviews (scope, key, reason, opened_at, operation, detail) "
		"SELECT o.scope, o.key, 'retention_expired', $2, o, " SWEEP_REVIEW_DETAIL
		" FROM idempo.operations o "
		SWEEP_REVIEW_WHERE,
		"cT",
		WRITES_BATCH
	},
	[PLAN_SWEEP_REVIEW_SAFE] = {
		"INSERT INTO idempo.reviews (scope, key, reason, opened_at, operation, detail) "
		"SELECT o.scope, o.key, 'retention_expired', $2, o, " SWEEP_REVIEW_DETAIL
		" FROM idempo.operations o "
		SWEEP_REVIEW_WHERE " " SWEEP_REVIEW_ON_CONFLICT,
		"cT",
		WRITES_BATCH
	},
	[PLAN_SWEEP_TO_REVIEW] = {
		"UPDATE idempo.operations o " SWEEP_TO_REVIEW_REST,
		"c",
		WRITES_BATCH
	},
	[PLAN_SWEEP_SET] = {
		"UPDATE idempo.operations o " SWEEP_SET_REST,
		"cazo",
		WRITES_BATCH
	},
	/*
	 * A repeat counts on the open conflict of the same stored and incoming
	 * request; a new row takes the id the claim drew ($9).
	 */
	[PLAN_CONFLICT_RECORD] = {
		"INSERT INTO idempo.conflicts AS c (id, scope, key, stored_fingerprint, incoming_fingerprint, "
		"stored_params, incoming_params, run_id, first_detected_at, last_detected_at) "
		"VALUES ($9, $1, $2, $3, $4, $5, $6, $7, $8, $8) "
		"ON CONFLICT (scope, key, stored_fingerprint, incoming_fingerprint) WHERE resolved_at IS NULL "
		"DO UPDATE SET "
		"last_detected_at = GREATEST(c.last_detected_at, excluded.last_detected_at), "
		"occurrences = c.occurrences OPERATOR(pg_catalog.+) 1, run_id = excluded.run_id "
		"RETURNING id",
		"ttbbjjtTl",
		WRITES_KEY_1
	},
	/* the same for objects of 0.1.0 and 0.2.0, which know open conflicts by the incoming request */
	[PLAN_CONFLICT_RECORD_0_2] = {
		"INSERT INTO idempo.conflicts AS c (id, scope, key, stored_fingerprint, incoming_fingerprint, "
		"stored_params, incoming_params, run_id, first_detected_at, last_detected_at) "
		"VALUES ($9, $1, $2, $3, $4, $5, $6, $7, $8, $8) "
		"ON CONFLICT (scope, key, incoming_fingerprint) WHERE resolved_at IS NULL DO UPDATE SET "
		"last_detected_at = GREATEST(c.last_detected_at, excluded.last_detected_at), "
		"occurrences = c.occurrences OPERATOR(pg_catalog.+) 1, run_id = excluded.run_id "
		"RETURNING id",
		"ttbbjjtTl",
		WRITES_KEY_1
	},
	[PLAN_CONFLICT_NEXT_ID] = {
		"SELECT pg_catalog.nextval('idempo.conflicts_id_seq'::pg_catalog.regclass)",
		""
	},
	/* claim_batch's probe: OP_COLUMNS without what a replay does not read (run_id, params) */
	[PLAN_OP_PROBE_BATCH] = {
		"SELECT key, fingerprint, status, attempt, NULL::pg_catalog.text, first_seen_at, "
		"last_attempt_at, lease_expires_at, completed_at, expires_at, sweep_at, result, target_ref, "
		"error, NULL::pg_catalog.jsonb, attempt_base FROM idempo.operations "
		"WHERE scope OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) ANY ($2)",
		"ta"
	},
};

static SPIPlanPtr plans[NUM_PLANS];

static Oid
plan_arg_type(char c)
{
	switch (c)
	{
		case 't':
			return TEXTOID;
		case 'b':
			return BYTEAOID;
		case 'i':
			return INT4OID;
		case 'l':
			return INT8OID;
		case 'T':
			return TIMESTAMPTZOID;
		case 'j':
			return JSONBOID;
		case 'B':
			return BOOLOID;
		case 'a':
			return TEXTARRAYOID;
		case 'z':
			return TIMESTAMPTZARRAYOID;
		case 'o':
			return BOOLARRAYOID;
		case 'c':
			return TIDARRAYOID;
	}
	elog(ERROR, "unrecognized plan argument type '%c'", c);
	pg_unreachable();
}

/*
 * The parameter types of a statement into types[] (room for FUNC_MAX_ARGS);
 * returns their number.  citus.c runs the sweep's statements on shards with
 * the same parameters.
 */
int
idempo_plan_arg_types(IdempoPlanId id, Oid *types)
{
	const char *args = plan_defs[id].args;
	int			nargs = strlen(args);
	int			i;

	for (i = 0; i < nargs; i++)
		types[i] = plan_arg_type(args[i]);
	return nargs;
}

/* The kept plan for a statement; prepares it on first use.  Call inside SPI. */
SPIPlanPtr
idempo_plan(IdempoPlanId id)
{
	const PlanDef *def = &plan_defs[id];
	Oid			argtypes[FUNC_MAX_ARGS];
	int			nargs;
	SPIPlanPtr	plan;

	if (likely(plans[id] != NULL))
		return plans[id];

	nargs = idempo_plan_arg_types(id, argtypes);
	plan = SPI_prepare_cursor(def->sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s", def->sql,
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	plans[id] = plan;
	return plan;
}

/*
 * Runs a plan: with the transaction's snapshot (snapshot InvalidSnapshot),
 * or read-only with the one given.
 */
static int
execute_plan(SPIPlanPtr plan, Datum *values, const char *nulls, Snapshot snapshot, long tcount)
{
	if (snapshot == InvalidSnapshot)
		return SPI_execute_plan(plan, values, nulls, false, tcount);
	return SPI_execute_snapshot(plan, values, nulls, snapshot, InvalidSnapshot, true, false, tcount);
}

/* Runs a statement whose plan must be (re)built, with index access forced (see above). */
static int
execute_replanning(SPIPlanPtr plan, Datum *values, const char *nulls, Snapshot snapshot, long tcount)
{
	int			nest = NewGUCNestLevel();
	int			rc;

	(void) set_config_option("enable_seqscan", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_hashjoin", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_mergejoin", "off", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	rc = execute_plan(plan, values, nulls, snapshot, tcount);
	AtEOXact_GUC(true, nest);
	return rc;
}

/* Refuses a write where the records are a subscription's (replication.c). */
static void
check_write(IdempoPlanId id, Datum *values)
{
	switch (plan_defs[id].writes)
	{
		case WRITES_NOTHING:
			return;
		case WRITES_KEY_1:
			idempo_refuse_on_subscriber(TextDatumGetCString(values[0]), TextDatumGetCString(values[1]), NULL);
			return;
		case WRITES_KEY_2:
			idempo_refuse_on_subscriber(TextDatumGetCString(values[1]), TextDatumGetCString(values[2]), NULL);
			return;
		case WRITES_BATCH:
			idempo_refuse_on_subscriber(NULL, NULL, NULL);
			return;
	}
}

static int
spi_execute(IdempoPlanId id, Datum *values, const char *nulls, Snapshot snapshot, long tcount)
{
	SPIPlanPtr	plan = idempo_plan(id);
	int			rc;

	if (plan_defs[id].writes != WRITES_NOTHING && unlikely(idempo_records_subscription() != NULL))
		check_write(id, values);
	if (likely(SPI_plan_is_valid(plan)))
		rc = execute_plan(plan, values, nulls, snapshot, tcount);
	else
		rc = execute_replanning(plan, values, nulls, snapshot, tcount);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s", plan_defs[id].sql,
			 SPI_result_code_string(rc));
	return (int) SPI_processed;
}

/* Runs one kept statement; returns SPI_processed. */
int
idempo_spi_execute(IdempoPlanId id, Datum *values, const char *nulls, long tcount)
{
	return spi_execute(id, values, nulls, InvalidSnapshot, tcount);
}

/*
 * Runs one kept statement that writes nothing, with the latest snapshot
 * rather than the transaction's: what is committed now, as PostgreSQL reads
 * its own catalogs.  For idempo's configuration (the scopes), which a
 * REPEATABLE READ transaction must not keep seeing as it was at its start.
 */
int
idempo_spi_read_latest(IdempoPlanId id, Datum *values, const char *nulls, long tcount)
{
	Assert(plan_defs[id].writes == WRITES_NOTHING);
	return spi_execute(id, values, nulls, GetLatestSnapshot(), tcount);
}

/*
 * The idempo SPI sessions open in this backend (a user trigger on
 * idempo.operations can call idempo inside idempo), by the transaction nest
 * level each was opened at, and memory that lives until the outermost of
 * them ends: what a nested call must not free under its caller (the scope
 * cache's stale generations) goes there, so that a long transaction of many
 * calls does not keep it all to its end.  A call that ends in an error
 * never reaches idempo_spi_end(): the sessions of an aborted subtransaction
 * are forgotten when it aborts, all of them when the transaction ends, and
 * the memory, which hangs under TopTransactionContext, goes with the
 * transaction (its reset callback forgets it).
 */
static int *session_levels = NULL;
static int	nsessions = 0;
static int	maxsessions = 0;
static MemoryContext outermost_call_cxt = NULL;

static void
outermost_call_cxt_gone(void *arg)
{
	outermost_call_cxt = NULL;
}

static void
sessions_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT || event == XACT_EVENT_PREPARE ||
		event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
		nsessions = 0;
}

static void
sessions_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						  SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();

	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	while (nsessions > 0 && session_levels[nsessions - 1] >= level)
		nsessions--;
}

/* Memory freed when the outermost open idempo SPI session ends (or its transaction does). */
MemoryContext
idempo_spi_outermost_context(void)
{
	if (outermost_call_cxt == NULL)
	{
		MemoryContextCallback *cb;

		outermost_call_cxt = AllocSetContextCreate(TopTransactionContext, "idempo outermost call",
												   ALLOCSET_SMALL_SIZES);
		cb = MemoryContextAlloc(outermost_call_cxt, sizeof(MemoryContextCallback));
		cb->func = outermost_call_cxt_gone;
		cb->arg = NULL;
		MemoryContextRegisterResetCallback(outermost_call_cxt, cb);
	}
	return outermost_call_cxt;
}

static void
session_opened(void)
{
	if (session_levels == NULL)
	{
		RegisterXactCallback(sessions_xact_callback, NULL);
		RegisterSubXactCallback(sessions_subxact_callback, NULL);
		maxsessions = 8;
		session_levels = MemoryContextAlloc(TopMemoryContext, maxsessions * sizeof(int));
	}
	else if (nsessions == maxsessions)
	{
		maxsessions *= 2;
		session_levels = repalloc(session_levels, maxsessions * sizeof(int));
	}
	session_levels[nsessions++] = GetCurrentTransactionNestLevel();
}

/* The outermost call is over: nothing above holds what was kept for it. */
static void
session_closed(void)
{
	if (nsessions > 0)
		nsessions--;
	if (nsessions == 0 && outermost_call_cxt != NULL)
		MemoryContextDelete(outermost_call_cxt);	/* its callback forgets it */
}

/* Connects SPI and becomes the owner of idempo's tables. */
void
idempo_spi_begin(IdempoSpiSession *session)
{
	Oid			owner = idempo_catalog()->owner;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	GetUserIdAndSecContext(&session->save_userid, &session->save_sec_context);
	SetUserIdAndSecContext(owner, session->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE | SECURITY_NOFORCE_RLS);
	session_opened();
}

/* Back to the caller's identity; disconnects SPI. */
void
idempo_spi_end(IdempoSpiSession *session)
{
	SetUserIdAndSecContext(session->save_userid, session->save_sec_context);
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
	session_closed();
}
