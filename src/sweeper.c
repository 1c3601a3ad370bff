/*-------------------------------------------------------------------------
 *
 * sweeper.c
 *	  The per-database worker: runs idempo.sweep()'s work in rounds, so that
 *	  expired leases become unknown, unfinished work past retention reaches
 *	  a person and expired records are purged even when nobody calls sweep().
 *
 * Started by the launcher with the database OID.  Each round is its own
 * transaction (the order of worker_spi: statement timestamp, transaction,
 * snapshot, activity, work, commit, statistics, idle).  A round that
 * handled a full batch is followed at once by another; otherwise the
 * sweeper waits idempo.sweep_interval on its latch.  An error in a round is
 * logged, counted and survived.  What a round moved is logged per scope at
 * LOG after it committed; an empty round is silent.  A database whose
 * records come from a publisher by logical replication is not swept: the
 * sweeper looks each round, says so once, and waits (replication.c).  The
 * sweeper exits when the database no longer has the extension, is no longer
 * listed in idempo.databases, or on SIGTERM (quietly when idle, after
 * recording the conflicts in hand); postmaster death ends it.
 *
 * It also records the conflicts that claims in its database hand it
 * (conflict_queue.c): its latch is set for each, and it serves them before
 * anything else, also while idempo.worker_enabled is off.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"
#include "worker.h"

#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "commands/dbcommands.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

typedef enum RoundResult
{
	ROUND_DONE,					/* nothing more due right now */
	ROUND_FULL,					/* a full batch: more may be due */
	ROUND_FAILED,
	ROUND_NO_EXTENSION,
	ROUND_SUBSCRIBER			/* the records come from a publisher (replication.c) */
} RoundResult;

typedef struct ScopeMoves
{
	char		scope[IDEMPO_MAX_SCOPE_BYTES + 1];
	IdempoSweepCounts counts;
} ScopeMoves;

static char *dbname = NULL;		/* of the database this sweeper serves */
static char *subscription = NULL;	/* the one whose target the records are; NULL: none */
static volatile sig_atomic_t working = false;	/* in a transaction: SIGTERM must interrupt it */

/*
 * SIGTERM: while the sweeper works in a transaction, as die() (a lock wait
 * or a wait for a synchronous standby must end); while it is idle, a quiet
 * exit at the top of the loop, after the conflicts in hand are recorded.
 */
static void
sweeper_sigterm(SIGNAL_ARGS)
{
	if (working)
		die(IDEMPO_SIGNAL_ARGS_PASS);
	else
		SignalHandlerForShutdownRequest(IDEMPO_SIGNAL_ARGS_PASS);
}

/* Records what claims handed over, then leaves: they must not wait for the next sweeper. */
static void
sweeper_exit(void)
{
	working = true;
	(void) idempo_cq_serve();
	working = false;
	proc_exit(0);
}
static List *round_moves = NIL;	/* ScopeMoves of the current round, in round_cxt */
static MemoryContext round_cxt = NULL;

static void
remember_moves(const char *scope, const IdempoSweepCounts *counts, void *arg)
{
	MemoryContext old = MemoryContextSwitchTo(round_cxt);
	ScopeMoves *m = palloc(sizeof(ScopeMoves));

	strlcpy(m->scope, scope, sizeof(m->scope));
	m->counts = *counts;
	round_moves = lappend(round_moves, m);
	MemoryContextSwitchTo(old);
}

/* Says once when the database starts, or stops, receiving its records from a publisher. */
static void
note_subscription(const char *sub)
{
	if (sub == NULL && subscription == NULL)
		return;
	if (sub != NULL && subscription != NULL && strcmp(sub, subscription) == 0)
		return;
	if (sub != NULL)
		ereport(LOG,
				(errmsg("idempo sweeper: database \"%s\" receives idempo's records from subscription \"%s\": not sweeping it",
						dbname, sub),
				 errdetail("The publisher sweeps; its changes arrive by replication.")));
	else
		ereport(LOG,
				(errmsg("idempo sweeper: database \"%s\" no longer receives idempo's records from a subscription: sweeping it",
						dbname)));
	if (subscription != NULL)
		pfree(subscription);
	subscription = sub ? MemoryContextStrdup(TopMemoryContext, sub) : NULL;
}

static RoundResult
sweep_round(void)
{
	IdempoSweepCounts total;
	IdempoSpiSession session;
	int			batch = idempo_sweep_batch_size;
	Oid			extension;

	memset(&total, 0, sizeof(total));
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	extension = get_extension_oid("idempo", true);
	if (OidIsValid(extension))
	{
		/*
		 * DROP EXTENSION locks the extension before it drops any member.
		 * Held for the round, the lock makes a drop wait until the round has
		 * committed, and a round that waited for a drop finds the extension
		 * gone (taking the lock processed the drop's invalidations) instead
		 * of failing on tables dropped under it.
		 */
		LockDatabaseObject(ExtensionRelationId, extension, 0, AccessShareLock);
		if (get_extension_oid("idempo", true) != extension)
			extension = InvalidOid;
	}
	if (!OidIsValid(extension))
	{
		PopActiveSnapshot();
		CommitTransactionCommand();
		return ROUND_NO_EXTENSION;
	}
	pgstat_report_activity(STATE_RUNNING, "idempo: sweeping");
	idempo_spi_begin(&session);
	note_subscription(idempo_records_subscription());
	if (subscription != NULL)
	{
		idempo_spi_end(&session);
		PopActiveSnapshot();
		CommitTransactionCommand();
		pgstat_report_activity(STATE_IDLE, NULL);
		return ROUND_SUBSCRIBER;
	}
	idempo_sweep_batch(batch, idempo_now(), session.save_userid, &total, remember_moves, NULL);
	idempo_spi_end(&session);
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);

	idempo_count(COUNTER_SWEEPS, 1);
	idempo_count(COUNTER_LEASE_EXPIRED, total.lease_expired);
	idempo_count(COUNTER_MOVED_TO_REVIEW, total.moved_to_review);
	idempo_count(COUNTER_PURGED, total.purged);
	idempo_count(COUNTER_REMEMBERED, total.remembered);
	return total.rows_seen >= batch ? ROUND_FULL : ROUND_DONE;
}

/* One round, surviving any error in it. */
static RoundResult
sweep_round_guarded(void)
{
	MemoryContext cxt = CurrentMemoryContext;
	RoundResult result;
	ListCell   *lc;

	MemoryContextReset(round_cxt);
	round_moves = NIL;
	PG_TRY();
	{
		result = sweep_round();
	}
	PG_CATCH();
	{
		/*
		 * As do_autovacuum: the error goes to the log whole (SQLSTATE,
		 * detail, hint, context), then the transaction is aborted and the
		 * error state cleared, with interrupts held so that a SIGTERM cannot
		 * leave either half done.
		 */
		HOLD_INTERRUPTS();
		errcontext("idempo sweep round in database \"%s\"", dbname);
		EmitErrorReport();
		AbortOutOfAnyTransaction();
		FlushErrorState();
		MemoryContextSwitchTo(cxt);
		/* counted before anything can end the process (a SIGTERM held meanwhile) */
		idempo_count(COUNTER_WORKER_ERRORS, 1);
		RESUME_INTERRUPTS();
		pgstat_report_activity(STATE_IDLE, NULL);
		ereport(LOG,
				(errmsg("idempo sweeper: a sweep round in database \"%s\" failed", dbname),
				 errhint("The sweeper carries on; the next round tries again.")));
		round_moves = NIL;
		return ROUND_FAILED;
	}
	PG_END_TRY();

	/* committed: now say what moved */
	foreach(lc, round_moves)
	{
		ScopeMoves *m = lfirst(lc);

		ereport(LOG,
				(errmsg("idempo sweeper: scope \"%s\": %lld lease(s) expired, %lld moved to review, %lld purged, %lld remembered",
						m->scope, (long long) m->counts.lease_expired,
						(long long) m->counts.moved_to_review, (long long) m->counts.purged,
						(long long) m->counts.remembered)));
	}
	return result;
}

void
idempo_sweeper_main(Datum main_arg)
{
	Oid			database_id = DatumGetObjectId(main_arg);
	TimestampTz next_round = 0;	/* when to sweep next (0: now) */
	bool		has_extension;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, sweeper_sigterm);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(database_id, InvalidOid, 0);
	if (!idempo_slot_register(database_id))
		proc_exit(0);			/* another sweeper serves this database */
	idempo_cq_sweeper_started();
	idempo_wait_events_prepare();

	round_cxt = AllocSetContextCreate(TopMemoryContext, "idempo sweeper round", ALLOCSET_SMALL_SIZES);
	StartTransactionCommand();
	dbname = MemoryContextStrdup(TopMemoryContext, get_database_name(database_id));
	has_extension = OidIsValid(get_extension_oid("idempo", true));
	CommitTransactionCommand();
	if (!has_extension)
		proc_exit(0);			/* the launcher only looked: it looks again later */
	/* from now on it serves the database (the launcher no longer counts it as a look) */
	idempo_slot_report(WORKER_IDLE, false, 0);
	idempo_wake_launcher();		/* it may look at the next database now */
	SetConfigOption("application_name", "idempo sweeper", PGC_USERSET, PGC_S_SESSION);

	for (;;)
	{
		TimestampTz now;
		TimestampTz wake;
		TimestampTz conflict_retry;
		long		timeout_ms;

		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending)
			sweeper_exit();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (!idempo_database_listed(dbname))
				sweeper_exit();
			next_round = 0;		/* a new interval or batch size applies from now */
		}

		/* conflicts first: a claim is waiting for each (conflict_queue.c) */
		working = true;
		conflict_retry = idempo_cq_serve();
		working = false;

		now = GetCurrentTimestamp();
		if (now >= next_round)
		{
			RoundResult result = ROUND_DONE;

			if (idempo_worker_enabled && !RecoveryInProgress())
			{
				idempo_slot_report(WORKER_SWEEPING, false, 0);
				working = true;
				result = sweep_round_guarded();
				working = false;
				if (result == ROUND_NO_EXTENSION)
					proc_exit(0);	/* the launcher looks again later */
			}
			if (result == ROUND_FULL)
			{
				/* more may be due: go on at once, after the conflicts */
				idempo_slot_report(WORKER_SWEEPING, true, 0);
				continue;
			}
			next_round = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), idempo_sweep_interval_ms);
			idempo_slot_report(!idempo_worker_enabled ? WORKER_DISABLED :
							   result == ROUND_SUBSCRIBER ? WORKER_SUBSCRIBER : WORKER_IDLE,
							   idempo_worker_enabled && result != ROUND_FAILED && result != ROUND_SUBSCRIBER,
							   next_round);
		}

		/* sleep until the next round, a conflict that met a lock is due, or the latch is set */
		wake = next_round;
		if (conflict_retry != 0 && conflict_retry < wake)
			wake = conflict_retry;
		now = GetCurrentTimestamp();
		timeout_ms = wake > now ? (long) ((wake - now + 999) / 1000) : 0;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 timeout_ms, idempo_wait_event(IDEMPO_WAIT_SWEEPER_IDLE));
		ResetLatch(MyLatch);
	}
}
