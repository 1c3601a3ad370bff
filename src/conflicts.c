/*-------------------------------------------------------------------------
 *
 * conflicts.c
 *	  Durable recording of conflicts: the same key claimed with different
 *	  parameters.
 *
 * A caller that gets outcome 'conflict' usually raises an error, which rolls
 * back its transaction.  The conflict must still reach a person, so it
 * cannot be written in the caller's transaction.  PostgreSQL has no
 * autonomous transactions; we get one by handing the row to a short-lived
 * dynamic background worker that connects to the same database as the
 * owner of idempo's tables, upserts the row into idempo.conflicts in its
 * own transaction, commits, and exits.  The claim waits for it (a few
 * milliseconds: conflicts are rare, and this is their path only).
 *
 * Limits, documented in README.md:
 *	- the worker needs a free slot in max_worker_processes, and the owner
 *	  must be able to log in; if it cannot run (or fails, e.g. on
 *	  lock_timeout), the row is written in the caller's transaction instead
 *	  and a WARNING says that it will vanish if that transaction rolls back;
 *	- the conflict row is committed before the caller's transaction ends, so
 *	  it can outlive a claim that itself never commits (that is the point);
 *	- lock_timeout bounds the worker's wait, so it cannot wait forever on a
 *	  lock that the waiting caller holds itself.
 *
 * The request travels in a dynamic shared memory segment; the worker writes
 * the new row's id back into it.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "storage/dsm.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

PGDLLEXPORT void idempo_conflict_recorder_main(Datum main_arg);

#define NO_OFFSET ((Size) -1)

typedef struct ConflictMessage
{
	Oid			database_id;
	Oid			role_id;
	TimestampTz detected_at;
	uint8		stored_fingerprint[IDEMPO_DIGEST_LEN];
	uint8		incoming_fingerprint[IDEMPO_DIGEST_LEN];
	Size		scope_off;
	Size		key_off;
	Size		run_id_off;
	Size		stored_params_off;
	Size		incoming_params_off;
	/* written by the worker */
	bool		recorded;
	int64		conflict_id;
	char		data[FLEXIBLE_ARRAY_MEMBER];
} ConflictMessage;

/* Upserts the conflict row; returns its id.  Runs inside an idempo SPI session. */
static int64
insert_conflict_row(const IdempoConflict *c)
{
	Datum		values[8];
	char		nulls[8];
	bytea	   *stored = palloc(VARHDRSZ + IDEMPO_DIGEST_LEN);
	bytea	   *incoming = palloc(VARHDRSZ + IDEMPO_DIGEST_LEN);
	bool		isnull;

	SET_VARSIZE(stored, VARHDRSZ + IDEMPO_DIGEST_LEN);
	memcpy(VARDATA(stored), c->stored_fingerprint, IDEMPO_DIGEST_LEN);
	SET_VARSIZE(incoming, VARHDRSZ + IDEMPO_DIGEST_LEN);
	memcpy(VARDATA(incoming), c->incoming_fingerprint, IDEMPO_DIGEST_LEN);

	memset(nulls, ' ', sizeof(nulls));
	values[0] = CStringGetTextDatum(c->scope);
	values[1] = CStringGetTextDatum(c->key);
	values[2] = PointerGetDatum(stored);
	values[3] = PointerGetDatum(incoming);
	values[4] = PointerGetDatum(c->stored_params);
	nulls[4] = c->stored_params ? ' ' : 'n';
	values[5] = PointerGetDatum(c->incoming_params);
	nulls[5] = c->incoming_params ? ' ' : 'n';
	values[6] = c->run_id ? CStringGetTextDatum(c->run_id) : (Datum) 0;
	nulls[6] = c->run_id ? ' ' : 'n';
	values[7] = TimestampTzGetDatum(c->detected_at);
	if (idempo_spi_execute(PLAN_CONFLICT_RECORD, values, nulls, 0) != 1)
		elog(ERROR, "recording a conflict returned no row");
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
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
message_build(const IdempoConflict *c, dsm_segment **seg_out)
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
	msg->detected_at = c->detected_at;
	memcpy(msg->stored_fingerprint, c->stored_fingerprint, IDEMPO_DIGEST_LEN);
	memcpy(msg->incoming_fingerprint, c->incoming_fingerprint, IDEMPO_DIGEST_LEN);
	msg->scope_off = add_bytes(msg, &used, c->scope, scope_len);
	msg->key_off = add_bytes(msg, &used, c->key, key_len);
	msg->run_id_off = c->run_id ? add_bytes(msg, &used, c->run_id, run_len) : NO_OFFSET;
	msg->stored_params_off = c->stored_params ? add_bytes(msg, &used, c->stored_params, sp_len) : NO_OFFSET;
	msg->incoming_params_off = c->incoming_params ? add_bytes(msg, &used, c->incoming_params, ip_len) : NO_OFFSET;
	msg->recorded = false;
	*seg_out = seg;
	return msg;
}

/* Runs the recorder worker and waits for it; true if it committed the row. */
static bool
record_in_worker(const IdempoConflict *c, int64 *id_out)
{
	dsm_segment *seg;
	ConflictMessage *msg;
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	BgwHandleStatus status;
	bool		recorded = false;

	msg = message_build(c, &seg);

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

	if (RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		status = WaitForBackgroundWorkerShutdown(handle);
		if (status == BGWH_STOPPED)
		{
			pg_read_barrier();
			recorded = msg->recorded;
			*id_out = msg->conflict_id;
		}
	}
	dsm_detach(seg);
	return recorded;
}

/*
 * Records a conflict durably (see the header comment); returns the id of
 * its row in idempo.conflicts.  Call outside an idempo SPI session.
 */
int64
idempo_record_conflict(const IdempoConflict *c)
{
	int64		id = 0;
	IdempoSpiSession session;

	/* where the records are a publisher's, no conflict can be recorded here (replication.c) */
	idempo_refuse_on_subscriber(c->scope, c->key, NULL);
	if (IsUnderPostmaster && record_in_worker(c, &id))
		return id;

	ereport(WARNING,
			(errmsg("conflict on key \"%s\" in scope \"%s\" is recorded in the current transaction only",
					c->key, c->scope),
			 errdetail("The conflict recorder background worker could not run or did not finish."),
			 errhint("If this transaction rolls back, the conflict is not kept. Check max_worker_processes and the server log.")));
	idempo_spi_begin(&session);
	id = insert_conflict_row(c);
	idempo_spi_end(&session);
	return id;
}

/* Entry point of the recorder worker. */
void
idempo_conflict_recorder_main(Datum main_arg)
{
	dsm_segment *seg;
	ConflictMessage *msg;
	IdempoConflict c;
	IdempoSpiSession session;
	int64		id;

	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	seg = dsm_attach(DatumGetUInt32(main_arg));
	if (seg == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempo conflict recorder could not map its request")));
	msg = dsm_segment_address(seg);

	BackgroundWorkerInitializeConnectionByOid(msg->database_id, msg->role_id, 0);
	/* never wait long: the backend that asked is waiting for us */
	SetConfigOption("lock_timeout", "5s", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("statement_timeout", "10s", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("synchronous_commit", "on", PGC_SUSET, PGC_S_OVERRIDE);

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

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "idempo: recording a conflict");
	idempo_spi_begin(&session);
	id = insert_conflict_row(&c);
	idempo_spi_end(&session);
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);

	msg->conflict_id = id;
	pg_write_barrier();
	msg->recorded = true;
	dsm_detach(seg);
	proc_exit(0);
}
