/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The idempo launcher: one background worker, connected to no database,
 *	  that starts a sweeper (sweeper.c) for every database it should serve.
 *
 * It starts once recovery has finished (BgWorkerStart_RecoveryFinished): on
 * a standby it never runs, and after promotion the postmaster starts it.
 * Every round it reads pg_database (a shared catalog) and starts a sweeper,
 * passing the database's OID, for each database that allows connections,
 * is not a template, is listed in idempo.databases (empty: all) and has no
 * sweeper yet.  A sweeper that finds no idempo extension exits; the
 * launcher looks again after EXTENSION_RECHECK, or at once when a CREATE
 * EXTENSION idempo wakes it (db_guard.c) or on SIGHUP.  Sweepers of databases that went
 * away or were unlisted are stopped.  If the launcher dies, the postmaster
 * restarts it after LAUNCHER_RESTART seconds.
 *
 * A database for which no worker slot has been free for UNSERVED_AFTER_MS
 * is "unserved": the launcher says so once, not every round (naming it,
 * and whether it knows that the database has idempo or had no slot even to
 * look), publishes the list for idempo.workers() (kind 'unserved'), tries
 * again every LAUNCHER_NAP_MS (at once while conflicts wait there), and
 * says when it served it after all.
 *
 * After every round it also publishes the databases a sweeper is on its way
 * to (publish_coming), for the claims: a conflict is handed over to a
 * sweeper only there (conflicts.c).  That list does not wait
 * UNSERVED_AFTER_MS: a database counts only from the moment its sweeper is
 * registered with the postmaster, and stops counting at the first start
 * that finds no slot.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"
#include "worker.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"


#define LAUNCHER_RESTART 5			/* seconds */
#define LAUNCHER_NAP_MS 10000		/* longest sleep between rounds */
#define EXTENSION_RECHECK_MS 60000	/* look again at a database without the extension */
#define UNSERVED_AFTER_MS 10000		/* without a slot this long: unserved (not a passing worker) */

/*
 * What the launcher knows of a database.  Every sweeper it starts first
 * looks whether the database has idempo (a probe); the moves, all made in
 * set_state():
 *
 *	 NEW, WAS_SERVED, WITHOUT_IDEMPO --a sweeper started--> PROBING
 *	 PROBING --it found idempo and serves--> SERVED
 *	 SERVED --it stopped--> WAS_SERVED: start one again at once (it was
 *		terminated, stopped for database DDL, or idempo was dropped: the next
 *		one leaves at once if there is no idempo any more)
 *	 PROBING --it stopped--> WITHOUT_IDEMPO: look again after
 *		EXTENSION_RECHECK_MS, or at once if a CREATE EXTENSION ran since the
 *		probe started (it may have looked just before the extension was there)
 */
typedef enum DatabaseState
{
	DB_NEW,						/* not looked at yet */
	DB_PROBING,					/* its sweeper runs and has not found idempo (yet) */
	DB_SERVED,					/* its sweeper runs and serves it */
	DB_WAS_SERVED,				/* its sweeper served it, then stopped */
	DB_WITHOUT_IDEMPO			/* a sweeper looked and found no idempo */
} DatabaseState;

typedef struct ServedDatabase
{
	Oid			database_id;	/* hash key */
	DatabaseState state;
	BackgroundWorkerHandle *handle; /* of its sweeper, while PROBING or SERVED */
	TimestampTz next_start;		/* do not start a sweeper before this */
	uint64		started_generation; /* idempo_extension_generation() at the probe's start */
	bool		seen;			/* still in pg_database and listed */
	/* what was said about worker slots (note_unserved, note_served) */
	TimestampTz no_slot_since;	/* its starts fail for want of a slot since (0: they do not) */
	bool		unserved;		/* no slot for UNSERVED_AFTER_MS: said once, published */
	bool		unserved_known;	/* ... and whether it was known to have idempo when said */
} ServedDatabase;

static HTAB *served = NULL;

/* The one place where a database's state changes (the moves: DatabaseState). */
static void
set_state(ServedDatabase *db, DatabaseState next)
{
	switch (next)
	{
		case DB_PROBING:
			Assert(db->state != DB_PROBING && db->state != DB_SERVED);
			db->started_generation = idempo_extension_generation();
			break;
		case DB_SERVED:
			Assert(db->state == DB_PROBING);
			break;
		case DB_WAS_SERVED:
			Assert(db->state == DB_SERVED);
			db->next_start = 0;
			break;
		case DB_WITHOUT_IDEMPO:
			Assert(db->state == DB_PROBING);
			db->next_start = idempo_extension_generation() != db->started_generation ? 0 :
				TimestampTzPlusMilliseconds(GetCurrentTimestamp(), EXTENSION_RECHECK_MS);
			break;
		case DB_NEW:
			elog(ERROR, "idempo launcher: no move back to a new database");
	}
	db->state = next;
}

void
idempo_register_launcher_worker(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = LAUNCHER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempo");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idempo_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempo launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempo launcher");
	RegisterBackgroundWorker(&worker);
}

static bool
start_sweeper(ServedDatabase *db, const char *name)
{
	BackgroundWorker worker;
	MemoryContext old;
	bool		started;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idempo");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idempo_sweeper_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idempo sweeper for database \"%s\"", name);
	snprintf(worker.bgw_type, BGW_MAXLEN, "idempo sweeper");
	worker.bgw_main_arg = ObjectIdGetDatum(db->database_id);
	worker.bgw_notify_pid = MyProcPid;
	/* the handle outlives this round's transaction */
	old = MemoryContextSwitchTo(TopMemoryContext);
	started = RegisterDynamicBackgroundWorker(&worker, &db->handle);
	MemoryContextSwitchTo(old);
	if (started)
		set_state(db, DB_PROBING);
	return started;
}

static bool
sweeper_running(ServedDatabase *db)
{
	pid_t		pid;

	if (db->handle == NULL)
		return false;
	if (GetBackgroundWorkerPid(db->handle, &pid) != BGWH_STOPPED)
	{
		/* serving: its own registration, not another sweeper's that is still there */
		if (db->state == DB_PROBING && idempo_sweeper_pid(db->database_id) == pid &&
			idempo_sweeper_serving(db->database_id))
			set_state(db, DB_SERVED);
		return true;
	}
	pfree(db->handle);
	db->handle = NULL;
	set_state(db, db->state == DB_SERVED ? DB_WAS_SERVED : DB_WITHOUT_IDEMPO);
	return false;
}

/*
 * No worker slot for a database.  A slot held for a moment by another
 * worker (a conflict recorder, a look at another database, a parallel
 * query) is no news; after UNSERVED_AFTER_MS without one the database is
 * unserved: said once per change (not every round), naming the database
 * and whether it is known to have idempo.
 */
static void
note_unserved(ServedDatabase *db, const char *name, TimestampTz now)
{
	bool		known = db->state == DB_WAS_SERVED || idempo_cq_pending(db->database_id);

	if (db->no_slot_since == 0)
		db->no_slot_since = now;
	if (!TimestampDifferenceExceeds(db->no_slot_since, now, UNSERVED_AFTER_MS))
		return;
	if (db->unserved && db->unserved_known == known)
		return;
	db->unserved = true;
	db->unserved_known = known;
	if (known)
		ereport(LOG,
				(errmsg("idempo launcher could not start a sweeper for database \"%s\": no free background worker slot",
						name),
				 idempo_cq_pending(db->database_id) ?
				 errdetail("Conflicts of rolled-back claims wait there for a sweeper, in shared memory only: a restart loses them. Nothing sweeps the database.") :
				 errdetail("Nothing sweeps the database, and its conflicts are kept only if the claim's transaction commits."),
				 errhint("Raise max_worker_processes: idempo needs one slot for its launcher, one for each database with idempo and one more.")));
	else
		ereport(LOG,
				(errmsg("idempo launcher could not look whether database \"%s\" has idempo: no free background worker slot",
						name),
				 errhint("Raise max_worker_processes: idempo needs one slot for its launcher, one for each database with idempo and one more; or list the databases with idempo in idempo.databases.")));
}

/* A sweeper started where there was no slot before: said once. */
static void
note_served(ServedDatabase *db, const char *name)
{
	db->no_slot_since = 0;
	if (!db->unserved)
		return;
	db->unserved = false;
	if (db->unserved_known)
		ereport(LOG,
				(errmsg("idempo launcher started a sweeper for database \"%s\", which had no worker slot before",
						name)));
	else
		ereport(LOG,
				(errmsg("idempo launcher is looking whether database \"%s\" has idempo, which it had no worker slot for before",
						name)));
}

/* Publishes the databases without a slot, for idempo.workers(). */
static void
publish_unserved(void)
{
	HASH_SEQ_STATUS seq;
	ServedDatabase *db;
	IdempoUnserved unserved[IDEMPO_UNSERVED_MAX];
	int			n = 0;

	hash_seq_init(&seq, served);
	while ((db = hash_seq_search(&seq)) != NULL)
	{
		if (!db->unserved)
			continue;
		if (n < IDEMPO_UNSERVED_MAX)
		{
			unserved[n].database_id = db->database_id;
			unserved[n].known_idempo = db->unserved_known;
		}
		n++;
	}
	idempo_publish_unserved(unserved, n);
}

/*
 * Publishes the databases a sweeper is on its way to, where a claim may hand
 * a conflict over (idempo_sweeper_coming): a sweeper is registered with the
 * postmaster for it and has not stopped (it starts, looks or serves), or the
 * one that served it stopped and the next is started at once -- until a
 * start finds no worker slot.  Not a database it has not started one for
 * yet, however early: that one may never get a slot.
 */
static void
publish_coming(void)
{
	HASH_SEQ_STATUS seq;
	ServedDatabase *db;
	Oid		   *coming = palloc(sizeof(Oid) * Max(hash_get_num_entries(served), 1));
	int			n = 0;

	hash_seq_init(&seq, served);
	while ((db = hash_seq_search(&seq)) != NULL)
		if (db->handle != NULL || (db->state == DB_WAS_SERVED && db->no_slot_since == 0))
			coming[n++] = db->database_id;
	idempo_publish_coming(coming, n);
	pfree(coming);
}

/* One look at pg_database: start what is missing, stop what is no longer wanted. */
static void
launcher_round(bool recheck_all)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	HASH_SEQ_STATUS seq;
	ServedDatabase *db;
	TimestampTz now = GetCurrentTimestamp();
	List	   *start_dbs = NIL;
	List	   *start_names = NIL;
	ListCell   *lc1,
			   *lc2;
	bool		probing = false;	/* a sweeper is looking whether its database has idempo */
	bool		no_slot = false;	/* a start failed: no free worker slot */

	hash_seq_init(&seq, served);
	while ((db = hash_seq_search(&seq)) != NULL)
		db->seen = false;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, "idempo launcher: reading pg_database");
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database form = (Form_pg_database) GETSTRUCT(tuple);
		bool		found;

		if (!form->datallowconn || form->datistemplate ||
			!idempo_database_listed(NameStr(form->datname)))
			continue;
		db = hash_search(served, &form->oid, HASH_ENTER, &found);
		if (!found)
		{
			db->state = DB_NEW;
			db->handle = NULL;
			db->next_start = 0;
			db->no_slot_since = 0;
			db->unserved = false;
			db->unserved_known = false;
		}
		db->seen = true;
		if (sweeper_running(db))
		{
			if (db->state == DB_PROBING)
				probing = true;
			continue;
		}

		/*
		 * A sweeper this launcher did not start is registered for the
		 * database: one started by the launcher before this one (sweepers
		 * outlive their launcher), or one of ours still leaving after the
		 * database was unlisted.  A sweeper started now would find it there
		 * and leave at once, and, the database looking served while it
		 * lived, be started again at once, in a loop.  Start one when that
		 * one has gone (a round comes at least every LAUNCHER_NAP_MS).
		 */
		if (idempo_sweeper_pid(db->database_id) != 0)
			continue;
		/* conflicts handed over wait for a sweeper of this database: start one now */
		if (recheck_all || idempo_cq_pending(db->database_id))
			db->next_start = 0;
		if (now >= db->next_start && !idempo_database_held(db->database_id, now))
		{
			start_dbs = lappend(start_dbs, db);
			start_names = lappend(start_names, pstrdup(NameStr(form->datname)));
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	/*
	 * Start them outside the catalog scan.  Every sweeper starts as a probe
	 * (DatabaseState): at most one probe runs at a time, so that looking at
	 * databases without idempo takes one worker slot, not one per database
	 * (a sweeper wakes the launcher when it has found idempo, and a probe's
	 * end wakes it too).
	 */
	forboth(lc1, start_dbs, lc2, start_names)
	{
		db = (ServedDatabase *) lfirst(lc1);
		if (probing)
			continue;
		probing = true;
		if (!no_slot && start_sweeper(db, (char *) lfirst(lc2)))
		{
			note_served(db, (char *) lfirst(lc2));
			continue;
		}
		no_slot = true;
		db->next_start = TimestampTzPlusMilliseconds(now, LAUNCHER_NAP_MS);
	}

	/*
	 * Without a slot, every database still to start is unserved, also those
	 * skipped above while a look was due elsewhere.
	 */
	if (no_slot)
		forboth(lc1, start_dbs, lc2, start_names)
		{
			db = (ServedDatabase *) lfirst(lc1);
			if (db->handle == NULL)
				note_unserved(db, (char *) lfirst(lc2), now);
		}
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);

	hash_seq_init(&seq, served);
	while ((db = hash_seq_search(&seq)) != NULL)
	{
		if (db->seen)
			continue;
		if (db->handle != NULL)
			TerminateBackgroundWorker(db->handle);
		hash_search(served, &db->database_id, HASH_REMOVE, NULL);
	}
	publish_unserved();
	publish_coming();
}

void
idempo_launcher_main(Datum main_arg)
{
	HASHCTL		ctl;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/* a clean stop, without a FATAL in the log; exit code 1: the postmaster restarts it */
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	idempo_launcher_attach();
	idempo_wait_events_prepare();

	ctl.keysize = sizeof(Oid);
	ctl.entrysize = sizeof(ServedDatabase);
	ctl.hcxt = TopMemoryContext;
	served = hash_create("idempo served databases", 16, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	ereport(LOG, (errmsg("idempo launcher started")));
	for (;;)
	{
		bool		recheck;

		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending)
			proc_exit(1);
		recheck = idempo_take_recheck_request();
		if (ConfigReloadPending)
		{
			/*
			 * A reload also makes it look again at once at databases that had
			 * no extension: a CREATE EXTENSION committed in two phases (Citus
			 * propagating it to a worker) does not wake the launcher.
			 */
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			recheck = true;
		}
		/* also while sweeping is off: the sweepers then only record conflicts */
		launcher_round(recheck);
		idempo_launcher_report_round();

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 Min(idempo_sweep_interval_ms, LAUNCHER_NAP_MS),
						 idempo_wait_event(IDEMPO_WAIT_LAUNCHER_IDLE));
		ResetLatch(MyLatch);
	}
}
