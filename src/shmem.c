/*-------------------------------------------------------------------------
 *
 * shmem.c
 *	  idempo's shared memory: counters, the sweepers' registry, and the
 *	  launcher's latch.  Exists only when idempo is in
 *	  shared_preload_libraries; idempo_shared is NULL otherwise.
 *
 * Locking: counters are atomics, updated without a lock.  The registry of
 * sweepers (one slot per database being served) and the launcher fields
 * are protected by a spinlock; every critical section is a few
 * assignments.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"
#include "worker.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(idempo_counters);
PG_FUNCTION_INFO_V1(idempo_reset_counters);
PG_FUNCTION_INFO_V1(idempo_workers);

static int	my_slot = -1;			/* this sweeper's slot */

IdempoShared *idempo_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static const char *const counter_names[NUM_COUNTERS] = {
	[COUNTER_CLAIMS + OUTCOME_ACQUIRED] = "claims_acquired",
	[COUNTER_CLAIMS + OUTCOME_REPLAY] = "claims_replay",
	[COUNTER_CLAIMS + OUTCOME_BUSY] = "claims_busy",
	[COUNTER_CLAIMS + OUTCOME_CONFLICT] = "claims_conflict",
	[COUNTER_CLAIMS + OUTCOME_UNKNOWN] = "claims_unknown",
	[COUNTER_CLAIMS + OUTCOME_IN_REVIEW] = "claims_in_review",
	[COUNTER_CLAIMS + OUTCOME_STALE] = "claims_stale",
	[COUNTER_CLAIMS + OUTCOME_EXPIRED] = "claims_expired",
	[COUNTER_SWEEPS] = "sweeps",
	[COUNTER_LEASE_EXPIRED] = "lease_expired",
	[COUNTER_MOVED_TO_REVIEW] = "moved_to_review",
	[COUNTER_PURGED] = "purged",
	[COUNTER_WORKER_ERRORS] = "worker_errors",
	[COUNTER_REMEMBERED] = "remembered",
};

static int
slot_count(void)
{
	/* one sweeper per database, and there are never more workers than this */
	return max_worker_processes;
}

/* Where the registry's slots end: the launcher's list of databases a sweeper is on its way to. */
static Size
coming_offset(int nslots)
{
	return MAXALIGN(add_size(offsetof(IdempoShared, slots),
							 mul_size(sizeof(IdempoWorkerSlot), nslots)));
}

static Size
shared_size(void)
{
	return add_size(coming_offset(slot_count()), mul_size(sizeof(Oid), slot_count()));
}

static Oid *
coming_list(void)
{
	return (Oid *) ((char *) idempo_shared + coming_offset(idempo_shared->nslots));
}

static void
idempo_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(shared_size());
}

static void
idempo_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idempo_shared = ShmemInitStruct("idempo", shared_size(), &found);
	if (!found)
	{
		memset(idempo_shared, 0, shared_size());
		SpinLockInit(&idempo_shared->mutex);
		ConditionVariableInit(&idempo_shared->conflicts_cv);
		for (i = 0; i < NUM_COUNTERS; i++)
			pg_atomic_init_u64(&idempo_shared->counters[i], 0);
		idempo_shared->counters_reset_at = GetCurrentTimestamp();
		idempo_shared->nslots = slot_count();
	}
	LWLockRelease(AddinShmemInitLock);
}

/* Called from _PG_init while shared_preload_libraries are loaded. */
void
idempo_shmem_install_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = idempo_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = idempo_shmem_startup;
}

void
idempo_count(IdempoCounter counter, uint64 n)
{
	if (idempo_shared != NULL && n > 0)
		pg_atomic_fetch_add_u64(&idempo_shared->counters[counter], n);
}

/* Refuses what needs shared memory when the library was not preloaded. */
static void
require_shared(const char *what)
{
	if (idempo_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s needs idempo to be loaded at server start", what),
				 errhint("Add idempo to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/* ---- the sweepers' registry ---- */

static void
slot_release(int code, Datum arg)
{
	int			i = DatumGetInt32(arg);

	SpinLockAcquire(&idempo_shared->mutex);
	if (idempo_shared->slots[i].pid == MyProcPid)
	{
		idempo_shared->slots[i].pid = 0;
		idempo_shared->slots[i].database_id = InvalidOid;
	}
	SpinLockRelease(&idempo_shared->mutex);
}

/*
 * Registers this process as the sweeper of a database; false if another
 * one already is (then this one must leave).
 */
bool
idempo_slot_register(Oid database_id)
{
	int			i,
				free_slot = -1;

	SpinLockAcquire(&idempo_shared->mutex);
	for (i = 0; i < idempo_shared->nslots; i++)
	{
		IdempoWorkerSlot *slot = &idempo_shared->slots[i];

		if (slot->pid != 0 && slot->database_id == database_id)
		{
			SpinLockRelease(&idempo_shared->mutex);
			return false;
		}
		if (slot->pid == 0 && free_slot < 0)
			free_slot = i;
	}
	if (free_slot >= 0)
	{
		IdempoWorkerSlot *slot = &idempo_shared->slots[free_slot];

		memset(slot, 0, sizeof(*slot));
		slot->pid = MyProcPid;
		slot->database_id = database_id;
		slot->state = WORKER_STARTING;
		slot->latch = &MyProc->procLatch;
	}
	SpinLockRelease(&idempo_shared->mutex);
	if (free_slot < 0)
		return false;
	before_shmem_exit(slot_release, Int32GetDatum(free_slot));
	my_slot = free_slot;
	return true;
}

/* A sweeper says what it is doing (shown by idempo.workers()). */
void
idempo_slot_report(IdempoWorkerState state, bool swept, TimestampTz next_round_at)
{
	IdempoWorkerSlot *slot;

	if (my_slot < 0)
		return;
	slot = &idempo_shared->slots[my_slot];
	SpinLockAcquire(&idempo_shared->mutex);
	slot->state = state;
	if (swept)
	{
		slot->rounds++;
		slot->last_round_at = GetCurrentTimestamp();
	}
	if (state != WORKER_SWEEPING)
	{
		slot->wakeups++;
		slot->next_round_at = next_round_at;
	}
	SpinLockRelease(&idempo_shared->mutex);
}

void
idempo_launcher_report_round(void)
{
	SpinLockAcquire(&idempo_shared->mutex);
	idempo_shared->launcher_rounds++;
	idempo_shared->launcher_round_at = GetCurrentTimestamp();
	SpinLockRelease(&idempo_shared->mutex);
}

/* PID of the sweeper of a database, or 0. */
pid_t
idempo_sweeper_pid(Oid database_id)
{
	pid_t		pid = 0;
	int			i;

	SpinLockAcquire(&idempo_shared->mutex);
	for (i = 0; i < idempo_shared->nslots; i++)
		if (idempo_shared->slots[i].pid != 0 && idempo_shared->slots[i].database_id == database_id)
			pid = idempo_shared->slots[i].pid;
	SpinLockRelease(&idempo_shared->mutex);
	return pid;
}

/* Whether a sweeper serves a database (it has found the extension there). */
bool
idempo_sweeper_serving(Oid database_id)
{
	bool		serving = false;
	int			i;

	SpinLockAcquire(&idempo_shared->mutex);
	for (i = 0; i < idempo_shared->nslots; i++)
		if (idempo_shared->slots[i].pid != 0 && idempo_shared->slots[i].database_id == database_id &&
			idempo_shared->slots[i].state != WORKER_STARTING)
			serving = true;
	SpinLockRelease(&idempo_shared->mutex);
	return serving;
}

/* Wakes the sweeper of a database; false if it has none. */
bool
idempo_wake_sweeper(Oid database_id)
{
	Latch	   *latch = NULL;
	int			i;

	SpinLockAcquire(&idempo_shared->mutex);
	for (i = 0; i < idempo_shared->nslots; i++)
		if (idempo_shared->slots[i].pid != 0 && idempo_shared->slots[i].database_id == database_id)
			latch = idempo_shared->slots[i].latch;
	SpinLockRelease(&idempo_shared->mutex);
	if (latch != NULL)
		SetLatch(latch);
	return latch != NULL;
}

/* The launcher publishes the databases it could not serve (the first IDEMPO_UNSERVED_MAX). */
void
idempo_publish_unserved(const IdempoUnserved *unserved, int n)
{
	SpinLockAcquire(&idempo_shared->mutex);
	idempo_shared->nunserved = Min(n, IDEMPO_UNSERVED_MAX);
	memcpy(idempo_shared->unserved, unserved, sizeof(IdempoUnserved) * idempo_shared->nunserved);
	SpinLockRelease(&idempo_shared->mutex);
}

/*
 * The launcher publishes the databases a sweeper is on its way to (see
 * launcher.c's publish_coming), the first nslots of them: any others count
 * as having none, which only costs a WARNING.
 */
void
idempo_publish_coming(const Oid *coming, int n)
{
	SpinLockAcquire(&idempo_shared->mutex);
	idempo_shared->ncoming = Min(n, idempo_shared->nslots);
	memcpy(coming_list(), coming, sizeof(Oid) * idempo_shared->ncoming);
	SpinLockRelease(&idempo_shared->mutex);
}

/*
 * Whether a sweeper serves a database or is on its way, so that a conflict
 * handed over for it is recorded (conflicts.c): one is registered, or the
 * running launcher has published the database as one it has a sweeper
 * starting or serving for, or starts one for again at once.  Not a database
 * the launcher has not started one for yet, nor one whose start found no
 * worker slot: there a hand-over would wait for a sweeper that may never
 * come.  (Whether the database is listed in idempo.databases the caller
 * checks.)
 */
bool
idempo_sweeper_coming(Oid database_id)
{
	bool		coming = false;
	Oid		   *list;
	int			i;

	SpinLockAcquire(&idempo_shared->mutex);
	for (i = 0; i < idempo_shared->nslots; i++)
		if (idempo_shared->slots[i].pid != 0 && idempo_shared->slots[i].database_id == database_id)
			coming = true;
	list = coming_list();
	for (i = 0; i < idempo_shared->ncoming && !coming && idempo_shared->launcher_pid != 0; i++)
		if (list[i] == database_id)
			coming = true;
	SpinLockRelease(&idempo_shared->mutex);
	return coming;
}

/* Asks the launcher not to start a sweeper for a database before "until". */
void
idempo_hold_database(Oid database_id, TimestampTz until)
{
	SpinLockAcquire(&idempo_shared->mutex);
	idempo_shared->held_database = database_id;
	idempo_shared->held_until = until;
	SpinLockRelease(&idempo_shared->mutex);
}

bool
idempo_database_held(Oid database_id, TimestampTz now)
{
	bool		held;

	SpinLockAcquire(&idempo_shared->mutex);
	held = idempo_shared->held_database == database_id && now < idempo_shared->held_until;
	SpinLockRelease(&idempo_shared->mutex);
	return held;
}

/*
 * The launcher is exiting: forget it before its PGPROC is released, as
 * logical replication's launcher does, so that no wake-up sets the latch of
 * a process slot that now belongs to another backend, and idempo.workers()
 * does not show a dead pid as running until the next launcher starts.
 */
static void
launcher_unregister(int code, Datum arg)
{
	SpinLockAcquire(&idempo_shared->mutex);
	if (idempo_shared->launcher_pid == MyProcPid)
	{
		idempo_shared->launcher_pid = 0;
		idempo_shared->launcher_latch = NULL;
		idempo_shared->ncoming = 0;	/* it starts nothing any more */
	}
	SpinLockRelease(&idempo_shared->mutex);
}

/* The launcher announces itself, so others can wake it; launcher_unregister undoes it at exit. */
void
idempo_launcher_attach(void)
{
	SpinLockAcquire(&idempo_shared->mutex);
	idempo_shared->launcher_pid = MyProcPid;
	idempo_shared->launcher_latch = &MyProc->procLatch;
	SpinLockRelease(&idempo_shared->mutex);
	before_shmem_exit(launcher_unregister, (Datum) 0);
}

/* Wakes the launcher to look at every database again now (e.g. after CREATE EXTENSION). */
void
idempo_wake_launcher(void)
{
	Latch	   *latch = NULL;

	if (idempo_shared == NULL)
		return;
	SpinLockAcquire(&idempo_shared->mutex);
	idempo_shared->recheck_requested = true;
	idempo_shared->extension_generation++;
	if (idempo_shared->launcher_pid != 0)
		latch = idempo_shared->launcher_latch;
	SpinLockRelease(&idempo_shared->mutex);
	if (latch)
		SetLatch(latch);
}

bool
idempo_take_recheck_request(void)
{
	bool		requested;

	SpinLockAcquire(&idempo_shared->mutex);
	requested = idempo_shared->recheck_requested;
	idempo_shared->recheck_requested = false;
	SpinLockRelease(&idempo_shared->mutex);
	return requested;
}

uint64
idempo_extension_generation(void)
{
	uint64		generation;

	SpinLockAcquire(&idempo_shared->mutex);
	generation = idempo_shared->extension_generation;
	SpinLockRelease(&idempo_shared->mutex);
	return generation;
}

/* ---- SQL ---- */

/* idempo.counters() RETURNS TABLE(name text, value bigint, since timestamptz) */
Datum
idempo_counters(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz since;
	int			i;

	require_shared("idempo.counters()");
	InitMaterializedSRF(fcinfo, 0);
	SpinLockAcquire(&idempo_shared->mutex);
	since = idempo_shared->counters_reset_at;
	SpinLockRelease(&idempo_shared->mutex);
	for (i = 0; i < NUM_COUNTERS; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = CStringGetTextDatum(counter_names[i]);
		values[1] = Int64GetDatum((int64) pg_atomic_read_u64(&idempo_shared->counters[i]));
		values[2] = TimestampTzGetDatum(since);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/* idempo.reset_counters(): back to zero (administrators only, by grant). */
Datum
idempo_reset_counters(PG_FUNCTION_ARGS)
{
	int			i;

	require_shared("idempo.reset_counters()");
	for (i = 0; i < NUM_COUNTERS; i++)
		pg_atomic_write_u64(&idempo_shared->counters[i], 0);
	SpinLockAcquire(&idempo_shared->mutex);
	idempo_shared->counters_reset_at = GetCurrentTimestamp();
	SpinLockRelease(&idempo_shared->mutex);
	PG_RETURN_VOID();
}

/*
 * idempo.workers() RETURNS TABLE(kind text, database_id oid, pid int, state text,
 *		rounds bigint, wakeups bigint, last_round_at timestamptz, next_round_at timestamptz)
 */
Datum
idempo_workers(PG_FUNCTION_ARGS)
{
	static const char *const state_names[] = {"starting", "idle", "sweeping", "disabled", "subscriber"};
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdempoWorkerSlot *slots;
	int			nslots,
				i;
	pid_t		launcher_pid;
	uint64		launcher_rounds;
	TimestampTz launcher_round_at;
	IdempoUnserved unserved[IDEMPO_UNSERVED_MAX];
	int			nunserved;

	require_shared("idempo.workers()");
	InitMaterializedSRF(fcinfo, 0);

	/* copy under the lock, build tuples after */
	nslots = idempo_shared->nslots;
	slots = palloc(sizeof(IdempoWorkerSlot) * nslots);
	SpinLockAcquire(&idempo_shared->mutex);
	memcpy(slots, idempo_shared->slots, sizeof(IdempoWorkerSlot) * nslots);
	launcher_pid = idempo_shared->launcher_pid;
	launcher_rounds = idempo_shared->launcher_rounds;
	launcher_round_at = idempo_shared->launcher_round_at;
	nunserved = idempo_shared->nunserved;
	memcpy(unserved, idempo_shared->unserved, sizeof(IdempoUnserved) * nunserved);
	SpinLockRelease(&idempo_shared->mutex);

	if (launcher_pid != 0)
	{
		Datum		values[8];
		bool		nulls[8] = {false, true, false, false, false, true, false, true};

		values[0] = CStringGetTextDatum("launcher");
		values[2] = Int32GetDatum(launcher_pid);
		values[3] = CStringGetTextDatum(idempo_worker_enabled ? "running" : "disabled");
		values[4] = Int64GetDatum((int64) launcher_rounds);
		values[6] = TimestampTzGetDatum(launcher_round_at);
		nulls[6] = launcher_round_at == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	for (i = 0; i < nslots; i++)
	{
		Datum		values[8];
		bool		nulls[8] = {false, false, false, false, false, false, false, false};

		if (slots[i].pid == 0)
			continue;
		values[0] = CStringGetTextDatum("sweeper");
		values[1] = ObjectIdGetDatum(slots[i].database_id);
		values[2] = Int32GetDatum(slots[i].pid);
		values[3] = CStringGetTextDatum(state_names[slots[i].state]);
		values[4] = Int64GetDatum((int64) slots[i].rounds);
		values[5] = Int64GetDatum((int64) slots[i].wakeups);
		values[6] = TimestampTzGetDatum(slots[i].last_round_at);
		nulls[6] = slots[i].last_round_at == 0;
		values[7] = TimestampTzGetDatum(slots[i].next_round_at);
		nulls[7] = slots[i].next_round_at == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}

	/*
	 * Databases the launcher could not serve: 'no_slot' where idempo is
	 * known to be installed, 'not_looked_at' where there was no slot even to
	 * look (it may have no idempo).
	 */
	for (i = 0; i < nunserved; i++)
	{
		Datum		values[8];
		bool		nulls[8] = {false, false, true, false, true, true, true, true};

		values[0] = CStringGetTextDatum("unserved");
		values[1] = ObjectIdGetDatum(unserved[i].database_id);
		values[3] = CStringGetTextDatum(unserved[i].known_idempo ? "no_slot" : "not_looked_at");
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
