/*-------------------------------------------------------------------------
 *
 * wait_events.c
 *	  The names under which idempo's waits show in pg_stat_activity.
 *
 * From PostgreSQL 17 on, an extension names its waits: pg_stat_activity
 * shows wait_event_type "Extension" with wait_event "IdempoSweeperIdle",
 * say, instead of the one event "Extension" of every extension (compat.h
 * maps the name to that before 17).  A name is registered in shared memory
 * by the first process that waits under it (WaitEventExtensionNew takes a
 * lock for that); each process keeps the ids it got, so that a wait costs
 * nothing more after the first.
 *
 * Registering fails with an ERROR when the registry, shared by every
 * extension, is full, and fails holding its lock.  In a backend that ends
 * the statement, and the abort releases the lock.  A worker must not die
 * of it (the launcher would start it again at once, in a loop), so the
 * workers register every name at their start, inside a transaction whose
 * abort releases the lock, and fall back to "Extension" if that fails.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"
#include "worker.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/wait_event.h"

static const char *const wait_event_names[NUM_IDEMPO_WAITS] = {
	[IDEMPO_WAIT_SWEEPER_IDLE] = "IdempoSweeperIdle",
	[IDEMPO_WAIT_LAUNCHER_IDLE] = "IdempoLauncherIdle",
	[IDEMPO_WAIT_CONFLICT_SLOT] = "IdempoConflictQueueSlot",
	[IDEMPO_WAIT_CONFLICT_RECORDED] = "IdempoConflictRecorded",
	[IDEMPO_WAIT_SWEEPER_EXIT] = "IdempoSweeperExit",
};

static uint32 wait_event_ids[NUM_IDEMPO_WAITS];	/* 0: not registered by this process yet */

/* The wait event to pass to WaitLatch and friends for one of idempo's waits. */
uint32
idempo_wait_event(IdempoWait wait)
{
	Assert(wait >= 0 && wait < NUM_IDEMPO_WAITS);
	if (wait_event_ids[wait] == 0)
		wait_event_ids[wait] = WaitEventExtensionNew(wait_event_names[wait]);
	return wait_event_ids[wait];
}

void
idempo_wait_events_prepare(void)
{
	MemoryContext cxt = CurrentMemoryContext;
	int			i;

	StartTransactionCommand();
	PG_TRY();
	{
		for (i = 0; i < NUM_IDEMPO_WAITS; i++)
			(void) idempo_wait_event((IdempoWait) i);
	}
	PG_CATCH();
	{
		HOLD_INTERRUPTS();
		errcontext("idempo registering the names of its wait events: its waits show as \"Extension\"");
		EmitErrorReport();
		AbortCurrentTransaction();
		FlushErrorState();
		MemoryContextSwitchTo(cxt);
		RESUME_INTERRUPTS();
		for (i = 0; i < NUM_IDEMPO_WAITS; i++)
			if (wait_event_ids[i] == 0)
				wait_event_ids[i] = PG_WAIT_EXTENSION;
		return;
	}
	PG_END_TRY();
	CommitTransactionCommand();
}
