/*-------------------------------------------------------------------------
 *
 * conflicts.c
 *	  Durable recording of conflicts: the same key claimed with different
 *	  parameters.
 *
 * A caller that gets outcome 'conflict' usually raises an error, which rolls
 * back its transaction.  The conflict must still reach a person, so it
 * cannot be written in the caller's transaction only.  PostgreSQL has no
 * autonomous transactions; another process must commit the row.  In order:
 *	1. the sweeper of the database (conflict_queue.c): it exists wherever
 *	   the library is preloaded and the database is served, and needs no
 *	   free worker slot; the claim waits for its commit;
 *	2. where no sweeper serves the database, a short-lived background
 *	   worker started for the conflict (it needs a free slot);
 *	3. otherwise, when the row is locked by another transaction (a
 *	   reviewer resolving the same conflict; the sweeper does not wait for
 *	   it, so that its database's other conflicts and sweeps go on), or
 *	   when the sweeper did not take the request within a second (it may
 *	   queue behind a lock of this very transaction), the claim writes the
 *	   row in its own transaction, where the deadlock detector sees any
 *	   wait, and hands the row to the sweeper if that transaction or
 *	   subtransaction rolls back (to the next sweeper, if none serves the
 *	   database now).  That hand-over is reserved only where a sweeper is
 *	   on its way: one is registered for the database, or the launcher has
 *	   one starting for it, or starts one again at once after the last one
 *	   stopped, until such a start finds no worker slot
 *	   (idempo_sweeper_coming, shmem.c); it records the row as soon as it
 *	   runs, within seconds.  Elsewhere -- the library is not preloaded, the
 *	   database is not listed in idempo.databases, the launcher has not
 *	   started a sweeper for it yet or found no worker slot for one --
 *	   nothing is handed over (it would hold a slot of the shared queue
 *	   until a sweeper came, perhaps not before a restart), and a WARNING
 *	   says that the conflict is kept only if the transaction commits.  A
 *	   claim waits at most a second for a free slot of the queue before it
 *	   writes the row itself, so no claim waits forever.
 * The claim returns the conflict's id only where the row is kept whatever
 * its caller does next: committed by the sweeper or a recorder worker, or
 * to be handed over at a rollback.  Where the row lives in the caller's
 * transaction only it returns none (conflict_id NULL): callers store the id
 * and show it to a person, and a rollback would leave it naming no row.
 * A transaction holding a hand-over cannot PREPARE (refuse_prepare): a
 * prepared transaction ends in COMMIT PREPARED or ROLLBACK PREPARED, perhaps
 * in another session or after a restart, where nothing hands its row over.
 * The conflict's id is drawn from the sequence first and travels with the
 * request, so that the id the claim returns is the row's wherever it is
 * written.  The row is upserted on the open conflict of the same stored
 * and incoming fingerprints: a repeat counts there.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"
#include "worker.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "catalog/pg_index.h"
#include "commands/dbcommands.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/snapmgr.h"


#define NO_OFFSET ((Size) -1)
#define RECORD_LOCK_TIMEOUT "200ms"	/* the recorder does not queue behind a reviewer */

typedef struct ConflictMessage
{
	Oid			database_id;
	Oid			role_id;
	int64		conflict_id;	/* drawn by the claim: the row's id if it is a new row */
	TimestampTz detected_at;
	uint8		stored_fingerprint[IDEMPO_DIGEST_LEN];
	uint8		incoming_fingerprint[IDEMPO_DIGEST_LEN];
	Size		scope_off;
	Size		key_off;
	Size		run_id_off;
	Size		stored_params_off;
	Size		incoming_params_off;
	/* written by a dynamic recorder worker */
	bool		recorded;
	bool		lock_timeout;
	int64		recorded_id;
	char		data[FLEXIBLE_ARRAY_MEMBER];
} ConflictMessage;

/* A conflict this transaction wrote itself, to be handed to the sweeper if it rolls back. */
typedef struct Handover
{
	int			slot;
	dsm_segment *seg;
	SubTransactionId subid;
	int64		conflict_id;	/* of the row this transaction wrote */
} Handover;

static List *handovers = NIL;	/* of Handover, in TopMemoryContext */
static bool handover_callbacks = false;

static bytea *
digest_bytea(const uint8 *digest)
{
	bytea	   *b = palloc(VARHDRSZ + IDEMPO_DIGEST_LEN);

	SET_VARSIZE(b, VARHDRSZ + IDEMPO_DIGEST_LEN);
	memcpy(VARDATA(b), digest, IDEMPO_DIGEST_LEN);
	return b;
}

/*
 * Whether an open conflict is known by both fingerprints (0.3.0 on) or by
 * the incoming one (0.1.0, 0.2.0): the arbiter index says, looked up on
 * every conflict (they are rare), so that ALTER EXTENSION UPDATE applies
 * at once in every session.
 */
static bool
open_conflict_by_stored(void)
{
	Oid			index = get_relname_relid("conflicts_open_idx", idempo_catalog()->namespace_oid);
	HeapTuple	tuple;
	bool		by_stored = false;

	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(index));
	if (HeapTupleIsValid(tuple))
	{
		by_stored = ((Form_pg_index) GETSTRUCT(tuple))->indnkeyatts == 4;
		ReleaseSysCache(tuple);
	}
	return by_stored;
}

/*
 * Upserts the conflict row (a new one gets conflict_id) and returns the id
 * of the row it counted on.  Runs inside an idempo SPI session.  Objects of
 * 0.1.0/0.2.0 know open conflicts by incoming fingerprint only.
 */
static int64
insert_conflict_row(const IdempoConflict *c, int64 conflict_id)
{
	Datum		values[9];
	char		nulls[9];
	bool		isnull;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = CStringGetTextDatum(c->scope);
	values[1] = CStringGetTextDatum(c->key);
	values[2] = PointerGetDatum(digest_bytea(c->stored_fingerprint));
	values[3] = PointerGetDatum(digest_bytea(c->incoming_fingerprint));
	values[4] = PointerGetDatum(c->stored_params);
	nulls[4] = c->stored_params ? ' ' : 'n';
	values[5] = PointerGetDatum(c->incoming_params);
	nulls[5] = c->incoming_params ? ' ' : 'n';
	values[6] = c->run_id ? CStringGetTextDatum(c->run_id) : (Datum) 0;
	nulls[6] = c->run_id ? ' ' : 'n';
	values[7] = TimestampTzGetDatum(c->detected_at);
	values[8] = Int64GetDatum(conflict_id);
	if (idempo_spi_execute(open_conflict_by_stored() ? PLAN_CONFLICT_RECORD : PLAN_CONFLICT_RECORD_0_2,
						   values, nulls, 0) != 1)
		elog(ERROR, "recording a conflict returned no row");
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* The id of a new conflict row, drawn now (sequences are not transactional). */
static int64
next_conflict_id(void)
{
	IdempoSpiSession session;
	bool		isnull;
	int64		id;

	idempo_spi_begin(&session);
	if (idempo_spi_execute(PLAN_CONFLICT_NEXT_ID, NULL, NULL, 1) != 1)
		elog(ERROR, "drawing a conflict id returned no row");
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	idempo_spi_end(&session);
	return id;
}

static Size
add_bytes(ConflictMessage *msg, Size *used, const void *data, Size len)
{
	Size		off = *used;

	memcpy(msg->data + off, data, len);
	*used = MAXALIGN(off + len);
	return off;
}

static ConflictMessage *
message_build(const IdempoConflict *c, int64 conflict_id, dsm_segment **seg_out)
{
	Size		scope_len = strlen(c->scope) + 1;
	Size		key_len = strlen(c->key) + 1;
	Size		run_len = c->run_id ? strlen(c->run_id) + 1 : 0;
	Size		sp_len = c->stored_params ? VARSIZE(c->stored_params) : 0;
	Size		ip_len = c->incoming_params ? VARSIZE(c->incoming_params) : 0;
	Size		size;
	Size		used = 0;
	dsm_segment *seg;
	ConflictMessage *msg;

	size = offsetof(ConflictMessage, data) + MAXALIGN(scope_len) + MAXALIGN(key_len) +
		MAXALIGN(run_len) + MAXALIGN(sp_len) + MAXALIGN(ip_len) + MAXIMUM_ALIGNOF;
	seg = dsm_create(size, 0);
	msg = dsm_segment_address(seg);
	memset(msg, 0, offsetof(ConflictMessage, data));
	msg->database_id = MyDatabaseId;
	msg->role_id = idempo_catalog()->owner;
	msg->conflict_id = conflict_id;
	msg->detected_at = c->detected_at;
	memcpy(msg->stored_fingerprint, c->stored_fingerprint, IDEMPO_DIGEST_LEN);
	memcpy(msg->incoming_fingerprint, c->incoming_fingerprint, IDEMPO_DIGEST_LEN);
	msg->scope_off = add_bytes(msg, &used, c->scope, scope_len);
	msg->key_off = add_bytes(msg, &used, c->key, key_len);
	msg->run_id_off = c->run_id ? add_bytes(msg, &used, c->run_id, run_len) : NO_OFFSET;
	msg->stored_params_off = c->stored_params ? add_bytes(msg, &used, c->stored_params, sp_len) : NO_OFFSET;
	msg->incoming_params_off = c->incoming_params ? add_bytes(msg, &used, c->incoming_params, ip_len) : NO_OFFSET;
	*seg_out = seg;
	return msg;
}

/*
 * Records the request in seg in a transaction of this process's own (the
 * sweeper, or a recorder worker), with a short lock timeout.  Never throws:
 * a failure is logged (unless it was the lock) and reported.
 */
void
idempo_record_conflict_request(dsm_segment *seg, bool *recorded, bool *lock_timeout,
							   int64 *conflict_id)
{
	ConflictMessage *msg = dsm_segment_address(seg);
	MemoryContext cxt = CurrentMemoryContext;
	IdempoConflict c;

	c.scope = msg->data + msg->scope_off;
	c.key = msg->data + msg->key_off;
	c.run_id = msg->run_id_off == NO_OFFSET ? NULL : msg->data + msg->run_id_off;
	c.stored_fingerprint = msg->stored_fingerprint;
	c.incoming_fingerprint = msg->incoming_fingerprint;
	c.stored_params = msg->stored_params_off == NO_OFFSET ? NULL :
		(Jsonb *) (msg->data + msg->stored_params_off);
	c.incoming_params = msg->incoming_params_off == NO_OFFSET ? NULL :
		(Jsonb *) (msg->data + msg->incoming_params_off);
	c.detected_at = msg->detected_at;

	/* its own transaction: the PG_CATCH below aborts whatever is open */
	Assert(!IsTransactionState());
	*recorded = false;
	*lock_timeout = false;
	PG_TRY();
	{
		IdempoSpiSession session;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		/* never queue behind another transaction; the claim then writes it itself */
		(void) set_config_option("lock_timeout", RECORD_LOCK_TIMEOUT, PGC_SUSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);
		(void) set_config_option("synchronous_commit", "on", PGC_SUSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);
		PushActiveSnapshot(GetTransactionSnapshot());
		idempo_spi_begin(&session);
		*conflict_id = insert_conflict_row(&c, msg->conflict_id);
		idempo_spi_end(&session);
		PopActiveSnapshot();
		CommitTransactionCommand();
		*recorded = true;
	}
	PG_CATCH();
	{
		/*
		 * A lock wait that ran out is expected (the claim then writes the row
		 * itself) and not logged; any other error goes to the log whole, as
		 * do_autovacuum reports its errors, before it is cleared.
		 */
		HOLD_INTERRUPTS();
		*lock_timeout = geterrcode() == ERRCODE_LOCK_NOT_AVAILABLE;
		if (!*lock_timeout)
		{
			errcontext("idempo could not record a conflict on key \"%s\" in scope \"%s\"",
					   c.key, c.scope);
			EmitErrorReport();
		}
		AbortOutOfAnyTransaction();
		FlushErrorState();
		MemoryContextSwitchTo(cxt);
		RESUME_INTERRUPTS();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
}

/* Hands the request to the sweeper of this database and waits; false if it did not record it. */
static bool
record_by_sweeper(const IdempoConflict *c, int64 conflict_id, bool *lock_timeout, int64 *id_out)
{
	dsm_segment *seg;
	int			slot;
	bool		recorded;

	(void) message_build(c, conflict_id, &seg);
	slot = idempo_cq_submit(seg, CQ_PENDING);
	recorded = slot >= 0 && idempo_cq_wait(slot, lock_timeout, id_out);
	dsm_detach(seg);
	return recorded;
}

/* Runs a recorder worker for the conflict and waits for it; true if it committed the row. */
static bool
record_in_worker(const IdempoConflict *c, int64 conflict_id, bool *lock_timeout, int64 *id_out)
{
	dsm_segment *seg;
	ConflictMessage *msg;
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	bool		recorded = false;

	msg = message_build(c, conflict_id, &seg);

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempo");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idempo_conflict_recorder_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempo conflict recorder for PID %d", MyProcPid);
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempo conflict recorder");
	worker.bgw_main_arg = UInt32GetDatum(dsm_segment_handle(seg));
	worker.bgw_notify_pid = MyProcPid;

	if (RegisterDynamicBackgroundWorker(&worker, &handle) &&
		WaitForBackgroundWorkerShutdown(handle) == BGWH_STOPPED)
	{
		pg_read_barrier();
		recorded = msg->recorded;
		*lock_timeout = msg->lock_timeout;
		*id_out = msg->recorded_id;
	}
	dsm_detach(seg);
	return recorded;
}

/*
 * PREPARE TRANSACTION of a transaction that wrote a conflict itself is
 * refused: whether the row is kept is decided only by COMMIT PREPARED or
 * ROLLBACK PREPARED, maybe in another session or after a restart, when no
 * callback of this backend runs to hand the row to the sweeper.  Thrown
 * before the point of no return, the error rolls the transaction back, and
 * the abort hands the conflict over as any rollback does.
 */
static void
refuse_prepare(void)
{
	Handover   *h = linitial(handovers);
	ConflictMessage *msg = dsm_segment_address(h->seg);

	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("cannot PREPARE a transaction that recorded conflict %lld on key \"%s\" in scope \"%s\" itself",
					(long long) h->conflict_id, msg->data + msg->key_off, msg->data + msg->scope_off),
			 errdetail("No other process could record the conflict in time (the sweeper met a lock, or none has started for this database yet), so the row is kept only if this transaction commits, and the outcome of a prepared transaction is not known here. The transaction is rolled back and the conflict is handed to the sweeper."),
			 errhint("Commit or roll back instead of preparing, or retry the transaction.")));
}

static void
handover_xact_callback(XactEvent event, void *arg)
{
	ListCell   *lc;
	bool		rolled_back;

	if (handovers == NIL)
		return;
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			refuse_prepare();
			return;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			rolled_back = false;
			break;
		case XACT_EVENT_PREPARE:
			/* refused at PRE_PREPARE: never here; keep the request rather than lose it */
			elog(WARNING, "idempo: a prepared transaction holds a conflict handover");
			rolled_back = true;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			rolled_back = true;
			break;
		default:
			return;
	}
	foreach(lc, handovers)
	{
		Handover   *h = lfirst(lc);

		if (rolled_back)
			idempo_cq_hand_over(h->slot);
		else
			idempo_cq_withdraw(h->slot);
		dsm_detach(h->seg);
	}
	list_free_deep(handovers);
	handovers = NIL;
}

static void
handover_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						  SubTransactionId parentSubid, void *arg)
{
	ListCell   *lc;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	foreach(lc, handovers)
	{
		Handover   *h = lfirst(lc);

		if (h->subid != mySubid)
			continue;
		if (event == SUBXACT_EVENT_COMMIT_SUB)
			h->subid = parentSubid;
		else
		{
			/* the row went with the subtransaction: the sweeper records it */
			idempo_cq_hand_over(h->slot);
			dsm_detach(h->seg);
			handovers = foreach_delete_current(handovers, lc);
			pfree(h);
		}
	}
}

/*
 * After the claim wrote the conflict in its own transaction: reserves a
 * slot so that the sweeper records it if this (sub)transaction rolls back.
 * False if that cannot be arranged (no sweeper, no free slot).
 */
static bool
reserve_handover(const IdempoConflict *c, int64 conflict_id)
{
	dsm_segment *seg;
	int			slot;
	MemoryContext old;
	Handover   *h;

	/* without a sweeper now, the request waits for the next one (the launcher starts it) */
	if (!IsUnderPostmaster || idempo_shared == NULL)
		return false;
	if (!handover_callbacks)
	{
		RegisterXactCallback(handover_xact_callback, NULL);
		RegisterSubXactCallback(handover_subxact_callback, NULL);
		handover_callbacks = true;
	}
	(void) message_build(c, conflict_id, &seg);
	slot = idempo_cq_submit(seg, CQ_RESERVED);
	if (slot < 0)
	{
		dsm_detach(seg);
		return false;
	}
	/* mapped until the transaction ends, whatever happens to resource owners */
	dsm_pin_mapping(seg);
	old = MemoryContextSwitchTo(TopMemoryContext);
	h = palloc(sizeof(Handover));
	h->slot = slot;
	h->seg = seg;
	h->subid = GetCurrentSubTransactionId();
	h->conflict_id = conflict_id;
	handovers = lappend(handovers, h);
	MemoryContextSwitchTo(old);
	return true;
}

/*
 * Records a conflict durably (see the header comment); returns the id of
 * its row in idempo.conflicts, or 0 where the row lives in the caller's
 * transaction only (a WARNING says so).  Call outside an idempo SPI session.
 */
int64
idempo_record_conflict(const IdempoConflict *c)
{
	int64		conflict_id = next_conflict_id();
	int64		id = 0;
	bool		lock_timeout = false;
	IdempoSpiSession session;
	char	   *dbname;
	bool		listed;

	if (IsUnderPostmaster && idempo_shared != NULL && idempo_sweeper_pid(MyDatabaseId) != 0)
	{
		if (record_by_sweeper(c, conflict_id, &lock_timeout, &id))
			return id;
	}
	else if (IsUnderPostmaster && record_in_worker(c, conflict_id, &lock_timeout, &id))
		return id;

	idempo_spi_begin(&session);
	id = insert_conflict_row(c, conflict_id);
	idempo_spi_end(&session);
	/*
	 * No hand-over where no sweeper serves the database or is coming (not
	 * listed, or no worker slot for it): it would hold a slot of the shared
	 * queue until a sweeper came, perhaps not before a restart.  Say so now
	 * instead.
	 */
	dbname = get_database_name(MyDatabaseId);
	listed = dbname != NULL && idempo_database_listed(dbname);
	if (IsUnderPostmaster && idempo_shared != NULL && !(listed && idempo_sweeper_coming(MyDatabaseId)))
		ereport(WARNING,
				(errmsg("conflict on key \"%s\" in scope \"%s\" is recorded in the current transaction only",
						c->key, c->scope),
				 listed ?
				 errdetail("No idempo sweeper serves database \"%s\" or is starting for it (none has been started for it yet, or no background worker slot was free), and no conflict recorder worker could record it. The claim returns no conflict_id.",
						   dbname) :
				 errdetail("Database \"%s\" is not listed in idempo.databases, so no idempo sweeper serves it, and no conflict recorder worker could record it. The claim returns no conflict_id.",
						   dbname ? dbname : "?"),
				 listed ?
				 errhint("If this transaction rolls back, the conflict is not kept. Raise max_worker_processes: idempo needs one slot for its launcher, one for each database with idempo and one more.") :
				 errhint("If this transaction rolls back, the conflict is not kept. Add the database to idempo.databases.")));
	else if (!reserve_handover(c, id))
		ereport(WARNING,
				(errmsg("conflict on key \"%s\" in scope \"%s\" is recorded in the current transaction only",
						c->key, c->scope),
				 errdetail("idempo is not preloaded (or its queue of conflicts is full), and no conflict recorder worker could run. The claim returns no conflict_id."),
				 errhint("If this transaction rolls back, the conflict is not kept. Preload idempo (shared_preload_libraries).")));
	else
		return id;				/* kept: a sweeper records it if this transaction rolls back */

	/*
	 * The row lives in this transaction only: no id, which callers store and
	 * show to a person, and which a rollback would leave naming no row.
	 */
	return 0;
}

/* Entry point of a recorder worker (used where no sweeper serves the database). */
void
idempo_conflict_recorder_main(Datum main_arg)
{
	dsm_segment *seg;
	ConflictMessage *msg;
	bool		recorded;
	bool		lock_timeout;
	int64		id = 0;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	seg = dsm_attach(DatumGetUInt32(main_arg));
	if (seg == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempo conflict recorder could not map its request")));
	msg = dsm_segment_address(seg);

	BackgroundWorkerInitializeConnectionByOid(msg->database_id, msg->role_id, 0);
	idempo_record_conflict_request(seg, &recorded, &lock_timeout, &id);
	msg->recorded_id = id;
	msg->lock_timeout = lock_timeout;
	pg_write_barrier();
	msg->recorded = recorded;
	dsm_detach(seg);
	proc_exit(0);
}
