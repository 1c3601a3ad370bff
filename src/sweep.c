/*-------------------------------------------------------------------------
 *
 * sweep.c
 *	  idempo.sweep(batch): apply what time has done, in the background.
 *
 * One call handles up to "batch" rows whose sweep_at has come, oldest
 * first, in the caller's transaction:
 *	- in_progress past its lease -> unknown (retryable in 'retry' scopes);
 *	- unfinished past first_seen_at + retention -> in_review, with a review
 *	  (reason retention_expired) holding a snapshot of the row;
 *	- finished past expires_at -> deleted, or in scopes with remember > 0
 *	  shrunk to a remembered key (deleted once expires_at + remember passed);
 *	- rows with nothing due yet (sweep_at is allowed to be early) get the
 *	  time at which something will be due.
 * The decisions are those of claim (expiry.c).  Rows are taken FOR UPDATE
 * SKIP LOCKED, so a sweep never waits for a claim and several sweeps share
 * the work; a claim waits at most for one batch's transaction.  Each kind of
 * change is one statement over arrays of row ids (moving to review is two:
 * the reviews, then the rows).
 *
 * On a Citus cluster (idempo.operations distributed) the same batch runs
 * once per shard of idempo.operations that this node holds, on the shard
 * relations themselves (citus.c explains why); each node sweeps its own.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "citus.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "op_row.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idempo_sweep);

#define MAX_SWEEP_BATCH 100000

/* how long the sweep leaves alone the operations of a scope that does not exist */
#define ORPHAN_RETRY_US (USECS_PER_HOUR)

/*
 * Arrays of one kind of change, parallel by index.  Rows are named by their
 * ctid: the batch holds them locked FOR UPDATE, so no one else can move
 * them, and each row appears in one statement that changes it; a TID scan
 * spares every statement a primary-key descent per row.
 */
typedef struct KeyList
{
	int			n;
	Datum	   *tid;
	Datum	   *status;			/* PLAN_SWEEP_SET only, as the three below */
	Datum	   *sweep_at;
	bool	   *sweep_at_null;
	Datum	   *clear_lease;
} KeyList;

typedef struct ScopeTally
{
	char		scope[IDEMPO_MAX_SCOPE_BYTES + 1];
	IdempoSweepCounts counts;
} ScopeTally;

static void
keylist_init(KeyList *l, int capacity)
{
	l->n = 0;
	l->tid = palloc(sizeof(Datum) * capacity);
	l->status = palloc(sizeof(Datum) * capacity);
	l->sweep_at = palloc(sizeof(Datum) * capacity);
	l->sweep_at_null = palloc(sizeof(bool) * capacity);
	l->clear_lease = palloc(sizeof(Datum) * capacity);
}

/* A row whose change is the same for the whole list (purge, move to review). */
static void
keylist_add_row(KeyList *l, Datum tid)
{
	l->tid[l->n++] = tid;
}

/* A row of PLAN_SWEEP_SET, with its own new status and sweep time. */
static void
keylist_add(KeyList *l, Datum tid, IdempoStatus status, TimestampTz sweep_at, bool clear_lease)
{
	l->tid[l->n] = tid;
	l->status[l->n] = CStringGetTextDatum(idempo_status_names[status]);
	l->sweep_at[l->n] = TimestampTzGetDatum(sweep_at);
	l->sweep_at_null[l->n] = TIMESTAMP_IS_NOBEGIN(sweep_at);
	l->clear_lease[l->n] = BoolGetDatum(clear_lease);
	l->n++;
}

/* Runs one sweep statement on idempo's tables, or on one local shard (Citus). */
static int
sweep_execute(const IdempoCitusShard *shard, IdempoPlanId id, Datum *args)
{
	if (shard == NULL)
		return idempo_spi_execute(id, args, NULL, 0);
	return idempo_citus_sweep_execute(shard, id, args);
}

static Datum
text_array(Datum *elems, int n)
{
	return PointerGetDatum(construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT));
}

static Datum
tid_array(Datum *elems, int n)
{
	return PointerGetDatum(construct_array(elems, n, TIDOID, sizeof(ItemPointerData), false,
										   TYPALIGN_SHORT));
}

/* The list's new sweep_at times (NULL elements: never), a timestamptz[]. */
static Datum
sweep_at_array(KeyList *l)
{
	int			dims[1] = {l->n};
	int			lbs[1] = {1};

	return PointerGetDatum(construct_md_array(l->sweep_at, l->sweep_at_null, 1, dims, lbs,
											  TIMESTAMPTZOID, sizeof(TimestampTz), true,
											  TYPALIGN_DOUBLE));
}

/* Shrinks finished records to remembered keys (sweep_at: when each is forgotten). */
static void
run_shrink(const IdempoCitusShard *shard, KeyList *l)
{
	Datum		args[2];

	if (l->n == 0)
		return;
	args[0] = tid_array(l->tid, l->n);
	args[1] = sweep_at_array(l);
	sweep_execute(shard, PLAN_SWEEP_SHRINK, args);
}

static void
run_purge(const IdempoCitusShard *shard, KeyList *l)
{
	Datum		args[1];

	if (l->n == 0)
		return;
	args[0] = tid_array(l->tid, l->n);
	sweep_execute(shard, PLAN_SWEEP_PURGE, args);
}

/*
 * Moves a batch's rows into review: a review each, holding the row as it
 * was, then the rows' new status.  The rows are locked and none is in
 * review, so none has an open review (every way into review sets the
 * status in the same transaction): the reviews are a plain INSERT, which
 * spares ON CONFLICT's pre-check and speculative insertion, about a fifth
 * of the cost of a move.  Should an open review exist all the same (one
 * made by hand), the unique index refuses the batch, in a subtransaction;
 * the batch then runs again with ON CONFLICT DO NOTHING, which keeps the
 * existing review, as before.
 */
typedef struct ReviewCall
{
	const IdempoCitusShard *shard;
	Datum	   *args;
} ReviewCall;

static void
open_reviews_plain(void *arg)
{
	ReviewCall *call = arg;

	sweep_execute(call->shard, PLAN_SWEEP_REVIEW, call->args);
}

static void
run_to_review(const IdempoCitusShard *shard, KeyList *l, TimestampTz now)
{
	Datum		args[2];
	ReviewCall	call = {shard, args};

	if (l->n == 0)
		return;
	args[0] = tid_array(l->tid, l->n);
	args[1] = TimestampTzGetDatum(now);
	if (!idempo_try_in_subxact(open_reviews_plain, &call, ERRCODE_UNIQUE_VIOLATION))
		sweep_execute(shard, PLAN_SWEEP_REVIEW_SAFE, args);
	sweep_execute(shard, PLAN_SWEEP_TO_REVIEW, args);
}

static void
run_set(const IdempoCitusShard *shard, KeyList *l)
{
	Datum		args[4];

	if (l->n == 0)
		return;
	args[0] = tid_array(l->tid, l->n);
	args[1] = text_array(l->status, l->n);
	args[2] = sweep_at_array(l);
	args[3] = PointerGetDatum(construct_array(l->clear_lease, l->n, BOOLOID, 1, true, TYPALIGN_CHAR));
	sweep_execute(shard, PLAN_SWEEP_SET, args);
}

static IdempoSweepCounts *
tally_for(List **tallies, const char *scope)
{
	ListCell   *lc;
	ScopeTally *t;

	foreach(lc, *tallies)
	{
		t = lfirst(lc);
		if (strcmp(t->scope, scope) == 0)
			return &t->counts;
	}
	t = palloc0(sizeof(ScopeTally));
	strlcpy(t->scope, scope, sizeof(t->scope));
	*tallies = lappend(*tallies, t);
	return &t->counts;
}

/*
 * One batch on idempo's tables, or on one local shard of them (Citus);
 * adds per scope to *tallies.  Returns the number of rows examined.
 */
static int
sweep_one(const IdempoCitusShard *shard, int batch, TimestampTz now, Oid actor, List **tallies)
{
	Datum		args[2];
	int			n,
				i;
	SPITupleTable *due;
	KeyList		purge,
				review,
				set,
				shrink;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(batch);
	n = sweep_execute(shard, PLAN_SWEEP_DUE, args);
	due = SPI_tuptable;
	if (n == 0)
		return 0;

	keylist_init(&purge, n);
	keylist_init(&review, n);
	keylist_init(&set, n);
	keylist_init(&shrink, n);

	for (i = 0; i < n; i++)
	{
		HeapTuple	tuple = due->vals[i];
		bool		isnull;
		Datum		tid_d = SPI_getbinval(tuple, due->tupdesc, 1, &isnull);
		Datum		scope_d = SPI_getbinval(tuple, due->tupdesc, 2, &isnull);
		Datum		key_d = SPI_getbinval(tuple, due->tupdesc, 3, &isnull);
		char	   *scope_name = TextDatumGetCString(scope_d);
		const IdempoScope *s = idempo_scope_find(scope_name);
		IdempoSweepCounts *c;
		OpRow		r;
		TimestampTz next_due;
		IdempoStatus from;

		op_row_from_tuple(tuple, due->tupdesc, 4, &r);
		if (s == NULL)
		{
			/* a scope row deleted by hand: leave its operations alone, and say so */
			ereport(WARNING,
					(errmsg("idempo sweep: scope \"%s\" of an operation does not exist", scope_name),
					 errhint("Recreate the scope with idempo.create_scope('%s'); its operations are looked at again hourly.",
							 scope_name)));
			keylist_add(&set, tid_d, r.status, idempo_time_add(now, ORPHAN_RETRY_US), false);
			continue;
		}
		from = r.status;
		c = tally_for(tallies, s->name);
		switch (op_expiry(&r, s, now, &next_due))
		{
			case EXPIRY_ABSENT:
				keylist_add_row(&purge, tid_d);
				c->purged++;
				break;
			case EXPIRY_REMEMBER:
				keylist_add(&shrink, tid_d, r.status, next_due, false);
				c->remembered++;
				break;
			case EXPIRY_REVIEW:
				keylist_add_row(&review, tid_d);
				c->moved_to_review++;
				idempo_log_event(s, TextDatumGetCString(key_d), NULL, r.attempt, from,
								 STATUS_IN_REVIEW, -1, "sweep", now, actor);
				break;
			case EXPIRY_LEASE_UNKNOWN:
			case EXPIRY_LEASE_RETRY:
				{
					IdempoStatus to = s->retry_on_lease_expiry ? STATUS_RETRYABLE : STATUS_UNKNOWN;

					keylist_add(&set, tid_d, to, op_review_at(&r, s), true);
					c->lease_expired++;
					idempo_log_event(s, TextDatumGetCString(key_d), NULL, r.attempt, from, to, -1,
									 "sweep", now, actor);
					break;
				}
			case EXPIRY_NONE:
				/* sweep_at was early: come back when something is due */
				keylist_add(&set, tid_d, r.status, next_due, false);
				break;
		}
	}

	run_to_review(shard, &review, now);
	run_set(shard, &set);
	run_shrink(shard, &shrink);
	run_purge(shard, &purge);
	return n;
}

/*
 * One batch, inside an idempo SPI session.  Adds to *total; if tally is
 * given, calls it once per scope that had changes.  On a Citus node, one
 * batch per local shard of idempo.operations; rows_seen is then that of
 * the fullest shard, so that a caller looping while batches are full keeps
 * going exactly while some shard has more.
 */
void
idempo_sweep_batch(int batch, TimestampTz now, Oid actor, IdempoSweepCounts *total,
				   idempo_sweep_tally_fn tally, void *tally_arg)
{
	List	   *tallies = NIL;
	ListCell   *lc;

	/*
	 * The lock the batch's writes take anyway, taken before it reads a due
	 * row or a scope: the due rows are read FOR UPDATE, whose lock does not
	 * conflict with the one alter_scope() takes to change retention or
	 * remember, so without it a change could commit between the batch's
	 * reading of the scope and its writes, and its rescheduling miss the rows
	 * the batch then writes with the old value (see
	 * idempo_scope_get_for_write()).
	 */
	LockRelationOid(idempo_catalog()->operations_relid, RowExclusiveLock);

	if (!idempo_citus_distributed())
		total->rows_seen += sweep_one(NULL, batch, now, actor, &tallies);
	else
	{
		int			fullest = 0;

		foreach(lc, idempo_citus_local_shards())
			fullest = Max(fullest, sweep_one(lfirst(lc), batch, now, actor, &tallies));
		total->rows_seen += fullest;
	}

	foreach(lc, tallies)
	{
		ScopeTally *t = lfirst(lc);
		IdempoSweepCounts *c = &t->counts;

		total->lease_expired += c->lease_expired;
		total->moved_to_review += c->moved_to_review;
		total->purged += c->purged;
		total->remembered += c->remembered;
		if (tally && (c->lease_expired || c->moved_to_review || c->purged || c->remembered))
			tally(t->scope, c, tally_arg);
	}
}

/*
 * idempo.sweep(batch int DEFAULT 1000)
 *	 RETURNS TABLE(lease_expired bigint, moved_to_review bigint, purged bigint)
 */
Datum
idempo_sweep(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdempoSpiSession session;
	IdempoSweepCounts total;
	int			batch;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("batch must not be NULL"),
				 errhint("Pass the number of rows to handle, e.g. 1000.")));
	batch = PG_GETARG_INT32(0);
	if (batch < 1 || batch > MAX_SWEEP_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d, not %d", MAX_SWEEP_BATCH, batch),
				 errhint("Call sweep() again while it reports full batches.")));

	/*
	 * The sweep writes: say so before its first locking read fails with
	 * PostgreSQL's message and our SQL in CONTEXT.  A job scheduled on every
	 * node of a cluster (pg_cron under Patroni) meets this on the standbys.
	 */
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("idempo.sweep() cannot run in a read-only transaction"),
				 RecoveryInProgress() ?
				 errdetail("This server is a standby: the primary sweeps, and its changes arrive here by replication.") :
				 errdetail("The sweep changes and deletes records."),
				 RecoveryInProgress() ?
				 errhint("Run idempo.sweep() on the primary. A job scheduled on every node skips the standbys with: DO $$BEGIN IF NOT pg_is_in_recovery() THEN PERFORM idempo.sweep(); END IF; END$$") :
				 errhint("Run idempo.sweep() in a read-write transaction.")));

	InitMaterializedSRF(fcinfo, 0);
	memset(&total, 0, sizeof(total));
	idempo_spi_begin(&session);
	idempo_refuse_sweep_on_subscriber();
	idempo_sweep_batch(batch, idempo_now(), session.save_userid, &total, NULL, NULL);
	if (total.rows_seen == 0 && idempo_citus_distributed() && idempo_citus_local_shards() == NIL)
		ereport(NOTICE,
				(errmsg("this node holds no shard of idempo.operations: nothing to sweep here"),
				 errdetail("On a Citus cluster every node sweeps its own shards; its background worker does so by itself."),
				 errhint("To sweep by hand, run it on every node: SELECT * FROM run_command_on_all_nodes('SELECT idempo.sweep()');")));
	idempo_spi_end(&session);

	values[0] = Int64GetDatum(total.lease_expired);
	values[1] = Int64GetDatum(total.moved_to_review);
	values[2] = Int64GetDatum(total.purged);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}
