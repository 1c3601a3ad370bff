/*-------------------------------------------------------------------------
 *
 * conflict_queue.c
 *	  Conflicts recorded by the sweeper of their database.
 *
 * A conflict must outlive the claim's transaction, which usually rolls
 * back (conflicts.c explains why it needs another process).  The sweeper
 * is a process the database has anyway, holding its worker slot for as
 * long as the server runs: handing the row to it needs no free slot in
 * max_worker_processes.  (Starting a background worker per conflict, as
 * idempo did before, lost conflicts whenever no slot was free, for
 * instance while the launcher looked at databases or parallel queries ran.)
 *
 * The protocol, for a claim that found a conflict:
 *	- it writes the request into a dynamic shared memory segment and pins
 *	  the segment, so that it survives the claim being cancelled;
 *	- it takes a free slot here (PENDING), sets the sweeper's latch and
 *	  sleeps on conflicts_cv;
 *	- the sweeper takes the slot (TAKEN), records the row in a transaction
 *	  of its own, marks the slot DONE and broadcasts;
 *	- the claim collects the answer, frees the slot and unpins the segment.
 * A claim that stops waiting (a cancel) clears waited_for, and the sweeper
 * frees the slot itself.  A request the sweeper could not record because
 * another transaction holds the conflict's row (a reviewer resolving it)
 * ends DONE with lock_timeout: the claim then records it in its own
 * transaction, where the deadlock detector sees the wait, and reserves a
 * slot (RESERVED) that is handed to the sweeper (PENDING, nobody waiting)
 * if that transaction or subtransaction rolls back (conflicts.c).
 *
 * Every change of a slot happens under idempo_shared->mutex; there are
 * IDEMPO_CONFLICT_SLOTS of them, and conflicts are rare.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "utils/timestamp.h"

#define WAIT_CHECK_MS 1000		/* how often a waiting claim checks that a sweeper is there */
#define RETRY_LOCKED_MS 1000	/* a handed-over request that met a lock: again after this */

static IdempoConflictSlot *
slot_at(int i)
{
	return &idempo_shared->conflict_slots[i];
}

/*
 * Publishes the request in seg: PENDING (the caller waits for the sweeper,
 * idempo_cq_wait; it also waits for a free slot, interruptibly) or RESERVED
 * (handed over later, idempo_cq_hand_over; -1 if no slot is free).
 * Returns the slot.
 */
int
idempo_cq_submit(dsm_segment *seg, IdempoConflictSlotState state)
{
	volatile int slot = -1;
	int			i;

	/* pinned before anyone can see it: the sweeper unpins it when it is done */
	dsm_pin_segment(seg);
	if (state == CQ_PENDING)
		ConditionVariablePrepareToSleep(&idempo_shared->conflicts_cv);
	for (;;)
	{
		SpinLockAcquire(&idempo_shared->mutex);
		for (i = 0; i < IDEMPO_CONFLICT_SLOTS; i++)
		{
			IdempoConflictSlot *s = slot_at(i);

			if (s->state != CQ_FREE)
				continue;
			memset(s, 0, sizeof(*s));
			s->state = state;
			s->database_id = MyDatabaseId;
			s->handle = dsm_segment_handle(seg);
			s->waited_for = (state == CQ_PENDING);
			slot = i;
			break;
		}
		SpinLockRelease(&idempo_shared->mutex);
		if (slot >= 0 || state != CQ_PENDING)
			break;
		/* every slot is in use: wait until one is freed (a cancel unpins the segment below) */
		PG_TRY();
		{
			(void) ConditionVariableTimedSleep(&idempo_shared->conflicts_cv, WAIT_CHECK_MS,
											   PG_WAIT_EXTENSION);
		}
		PG_CATCH();
		{
			ConditionVariableCancelSleep();
			dsm_unpin_segment(dsm_segment_handle(seg));
			PG_RE_THROW();
		}
		PG_END_TRY();
	}
	if (state == CQ_PENDING)
		ConditionVariableCancelSleep();
	if (slot < 0)
		dsm_unpin_segment(dsm_segment_handle(seg));
	else if (state == CQ_PENDING)
		(void) idempo_wake_sweeper(MyDatabaseId);
	return slot;
}

/*
 * A request nobody will take any more: PENDING, or TAKEN by a sweeper that
 * is gone (one that exited while recording it), while no sweeper serves
 * the database.  Frees the slot; true if it did.
 */
static bool
withdraw_if_untaken(int slot)
{
	IdempoConflictSlot *s = slot_at(slot);
	bool		withdrawn = false;
	dsm_handle	handle = 0;

	if (idempo_sweeper_pid(MyDatabaseId) != 0)
		return false;
	SpinLockAcquire(&idempo_shared->mutex);
	if (s->state == CQ_PENDING || s->state == CQ_TAKEN)
	{
		handle = s->handle;
		s->state = CQ_FREE;
		withdrawn = true;
	}
	SpinLockRelease(&idempo_shared->mutex);
	if (withdrawn)
	{
		dsm_unpin_segment(handle);
		ConditionVariableBroadcast(&idempo_shared->conflicts_cv);
	}
	return withdrawn;
}

/* A waiting claim leaves (an error or a cancel): the sweeper frees the slot when it is done. */
static void
stop_waiting(int slot)
{
	IdempoConflictSlot *s = slot_at(slot);
	dsm_handle	handle = 0;
	bool		unpin = false;

	SpinLockAcquire(&idempo_shared->mutex);
	if (s->state == CQ_DONE)
	{
		handle = s->handle;
		s->state = CQ_FREE;
		unpin = true;
	}
	else
		s->waited_for = false;
	SpinLockRelease(&idempo_shared->mutex);
	if (unpin)
	{
		dsm_unpin_segment(handle);
		ConditionVariableBroadcast(&idempo_shared->conflicts_cv);
	}
}

/*
 * Waits until the sweeper has recorded the PENDING request in slot, and
 * frees the slot.  Returns whether the row is committed (then *conflict_id
 * is its id); if not, *lock_timeout says whether a lock was the reason.
 * Interruptible: a cancel leaves the request to the sweeper.
 */
bool
idempo_cq_wait(int slot, bool *lock_timeout, int64 *conflict_id)
{
	IdempoConflictSlot *s = slot_at(slot);
	volatile bool done = false;
	volatile bool recorded = false;
	volatile dsm_handle handle = 0;

	*lock_timeout = false;
	ConditionVariablePrepareToSleep(&idempo_shared->conflicts_cv);
	PG_TRY();
	{
		for (;;)
		{
			SpinLockAcquire(&idempo_shared->mutex);
			if (s->state == CQ_DONE)
			{
				recorded = s->recorded;
				*lock_timeout = s->lock_timeout;
				*conflict_id = s->conflict_id;
				handle = s->handle;
				s->state = CQ_FREE;
				done = true;
			}
			SpinLockRelease(&idempo_shared->mutex);
			if (done)
			{
				dsm_unpin_segment(handle);
				ConditionVariableBroadcast(&idempo_shared->conflicts_cv);	/* a free slot */
				break;
			}
			if (withdraw_if_untaken(slot))
				break;
			(void) ConditionVariableTimedSleep(&idempo_shared->conflicts_cv, WAIT_CHECK_MS,
											   PG_WAIT_EXTENSION);
		}
	}
	PG_CATCH();
	{
		ConditionVariableCancelSleep();
		stop_waiting(slot);
		PG_RE_THROW();
	}
	PG_END_TRY();
	ConditionVariableCancelSleep();
	return recorded;
}

/* A RESERVED request that is not needed (its transaction committed): free it. */
void
idempo_cq_withdraw(int slot)
{
	IdempoConflictSlot *s = slot_at(slot);
	dsm_handle	handle;

	SpinLockAcquire(&idempo_shared->mutex);
	handle = s->handle;
	s->state = CQ_FREE;
	SpinLockRelease(&idempo_shared->mutex);
	dsm_unpin_segment(handle);
	ConditionVariableBroadcast(&idempo_shared->conflicts_cv);
}

/*
 * A RESERVED request whose transaction rolled back: the sweeper records
 * it, nobody waits.  Only assignments and a latch: safe at abort.
 */
void
idempo_cq_hand_over(int slot)
{
	IdempoConflictSlot *s = slot_at(slot);

	SpinLockAcquire(&idempo_shared->mutex);
	s->state = CQ_PENDING;
	s->waited_for = false;
	SpinLockRelease(&idempo_shared->mutex);
	(void) idempo_wake_sweeper(s->database_id);
}

/* A new sweeper takes over what a sweeper of its database left TAKEN when it exited. */
void
idempo_cq_sweeper_started(void)
{
	int			i;

	SpinLockAcquire(&idempo_shared->mutex);
	for (i = 0; i < IDEMPO_CONFLICT_SLOTS; i++)
		if (slot_at(i)->state == CQ_TAKEN && slot_at(i)->database_id == MyDatabaseId)
			slot_at(i)->state = CQ_PENDING;
	SpinLockRelease(&idempo_shared->mutex);
}

/* Records one TAKEN request and says so to whoever waits. */
static void
record_one(int slot)
{
	IdempoConflictSlot *s = slot_at(slot);
	dsm_segment *seg = dsm_attach(s->handle);
	bool		recorded = false;
	bool		lock_timeout = false;
	int64		conflict_id = 0;
	bool		unpin = false;
	dsm_handle	handle = s->handle;

	if (seg != NULL)
	{
		idempo_record_conflict_request(seg, &recorded, &lock_timeout, &conflict_id);
		dsm_detach(seg);
	}

	SpinLockAcquire(&idempo_shared->mutex);
	if (!s->waited_for && !recorded && lock_timeout)
	{
		/* handed over, and the conflict's row is locked: try again later */
		s->state = CQ_PENDING;
		s->not_before = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), RETRY_LOCKED_MS);
	}
	else if (s->waited_for)
	{
		s->state = CQ_DONE;
		s->recorded = recorded;
		s->lock_timeout = lock_timeout;
		s->conflict_id = conflict_id;
	}
	else
	{
		s->state = CQ_FREE;
		unpin = true;
	}
	SpinLockRelease(&idempo_shared->mutex);
	if (unpin)
		dsm_unpin_segment(handle);
	ConditionVariableBroadcast(&idempo_shared->conflicts_cv);
}

/*
 * The sweeper records every request of its database that is due.  Returns
 * when the next one that met a lock is due again, or 0 if none waits.
 */
TimestampTz
idempo_cq_serve(void)
{
	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz next = 0;
		int			slot = -1;
		int			i;

		SpinLockAcquire(&idempo_shared->mutex);
		for (i = 0; i < IDEMPO_CONFLICT_SLOTS; i++)
		{
			IdempoConflictSlot *s = slot_at(i);

			if (s->state != CQ_PENDING || s->database_id != MyDatabaseId)
				continue;
			if (s->not_before <= now)
			{
				s->state = CQ_TAKEN;
				s->taken_by = MyProcPid;
				slot = i;
				break;
			}
			if (next == 0 || s->not_before < next)
				next = s->not_before;
		}
		SpinLockRelease(&idempo_shared->mutex);
		if (slot < 0)
			return next;
		pgstat_report_activity(STATE_RUNNING, "idempo: recording a conflict");
		record_one(slot);
		pgstat_report_activity(STATE_IDLE, NULL);
	}
}
