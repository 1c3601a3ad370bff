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
 * The claim waits for a PENDING request at most WAIT_PENDING_MS: the sweeper
 * may be in a sweep round that queues behind a lock the claim's own
 * transaction holds (a cycle the deadlock detector cannot see), so after
 * that the claim takes the request back and writes the row itself, with a
 * handover.  Once the sweeper has TAKEN it, the recording is bounded by its
 * own lock timeout, and the claim waits for it.  A handover made while no
 * sweeper serves the database stays PENDING until one does (the launcher
 * is asked to start one).  A claim that ends while waiting -- an error, a
 * cancel, or FATAL -- leaves the request to the sweeper (before_shmem_exit
 * through PG_ENSURE_ERROR_CLEANUP).
 *
 * A request is never recorded twice.  A TAKEN request is re-taken (by the
 * waiting claim, withdraw(), or by the next sweeper,
 * idempo_cq_sweeper_started()) only once its sweeper has left the registry,
 * that is, has exited; and a sweeper cannot exit between committing the row
 * and marking the slot: record_one() runs nothing there that can throw or
 * process an interrupt (CommitTransactionCommand() holds interrupts until
 * the commit is complete, a SIGTERM taken in its wait for a synchronous
 * standby ends only that wait, and the next CHECK_FOR_INTERRUPTS() is after
 * the slot is marked; the segment is detached only after that).  A crash of
 * the sweeper (kill -9) restarts the server, whose shared memory, queue
 * included, starts empty: the committed row stays, and no claim is left to
 * write it again.  A sweeper that dies before its commit leaves no row, so
 * re-taking its request counts the conflict once.
 *
 * Every change of a slot happens under idempo_shared->mutex; there are
 * IDEMPO_CONFLICT_SLOTS of them, and conflicts are rare.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"
#include "worker.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "pgstat.h"
#include "utils/timestamp.h"

#define WAIT_CHECK_MS 100		/* how often a waiting claim looks at its request */
#define WAIT_PENDING_MS 1000	/* how long it waits for the sweeper to take it */
#define RETRY_LOCKED_MS 1000	/* a handed-over request that met a lock: again after this */
#define SERVE_AT_ONCE 16		/* requests recorded before the sweeper looks at anything else */

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
/* Frees the pin of a request that never got a slot (the claim ended while waiting for one). */
static void
unpin_unsubmitted(int code, Datum arg)
{
	ConditionVariableCancelSleep();
	dsm_unpin_segment(DatumGetUInt32(arg));
}

static int
take_free_slot(dsm_segment *seg, IdempoConflictSlotState state)
{
	int			slot = -1;
	int			i;

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
	return slot;
}

int
idempo_cq_submit(dsm_segment *seg, IdempoConflictSlotState state)
{
	dsm_handle	handle = dsm_segment_handle(seg);
	int			slot;

	/* pinned before anyone can see it: whoever frees the slot unpins it */
	dsm_pin_segment(seg);
	slot = take_free_slot(seg, state);
	if (slot < 0 && state == CQ_PENDING)
	{
		/*
		 * Every slot is in use: wait a while for one to be freed, not
		 * forever (slots held for databases no sweeper serves may stay held
		 * until a restart); then the caller writes the row itself.
		 */
		TimestampTz give_up = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), WAIT_PENDING_MS);

		PG_ENSURE_ERROR_CLEANUP(unpin_unsubmitted, UInt32GetDatum(handle));
		{
			ConditionVariablePrepareToSleep(&idempo_shared->conflicts_cv);
			while ((slot = take_free_slot(seg, state)) < 0 && GetCurrentTimestamp() < give_up)
				(void) ConditionVariableTimedSleep(&idempo_shared->conflicts_cv, WAIT_CHECK_MS,
												   idempo_wait_event(IDEMPO_WAIT_CONFLICT_SLOT));
			ConditionVariableCancelSleep();
		}
		PG_END_ENSURE_ERROR_CLEANUP(unpin_unsubmitted, UInt32GetDatum(handle));
	}
	if (slot < 0)
		dsm_unpin_segment(handle);
	else if (!idempo_wake_sweeper(MyDatabaseId))
		idempo_wake_launcher();		/* nobody serves this database yet: start a sweeper */
	return slot;
}

/* Whether a sweeper serves the database; call with the mutex held. */
static bool
served_locked(Oid database_id)
{
	int			i;

	for (i = 0; i < idempo_shared->nslots; i++)
		if (idempo_shared->slots[i].pid != 0 && idempo_shared->slots[i].database_id == database_id)
			return true;
	return false;
}

/*
 * The claim takes its request back, to write the row itself: if it is
 * still PENDING, or TAKEN while no sweeper serves the database (one exited
 * while recording it).  Frees the slot; true if it did.
 */
static bool
withdraw(int slot)
{
	IdempoConflictSlot *s = slot_at(slot);
	bool		withdrawn = false;
	dsm_handle	handle = 0;

	SpinLockAcquire(&idempo_shared->mutex);
	if (s->state == CQ_PENDING ||
		(s->state == CQ_TAKEN && !served_locked(s->database_id)))
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

/* A waiting claim ends (an error, a cancel, FATAL): the sweeper frees the slot when it is done. */
static void
stop_waiting(int code, Datum arg)
{
	IdempoConflictSlot *s = slot_at(DatumGetInt32(arg));
	dsm_handle	handle = 0;
	bool		unpin = false;

	ConditionVariableCancelSleep();
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
	TimestampTz give_up_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), WAIT_PENDING_MS);
	bool		done = false;
	bool		recorded = false;
	dsm_handle	handle = 0;

	*lock_timeout = false;
	PG_ENSURE_ERROR_CLEANUP(stop_waiting, Int32GetDatum(slot));
	{
		uint32		wait_event = idempo_wait_event(IDEMPO_WAIT_CONFLICT_RECORDED);

		ConditionVariablePrepareToSleep(&idempo_shared->conflicts_cv);
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
			/* not taken in time (the sweeper may queue behind a lock of ours): write it ourselves */
			if (GetCurrentTimestamp() >= give_up_at && withdraw(slot))
				break;
			(void) ConditionVariableTimedSleep(&idempo_shared->conflicts_cv, WAIT_CHECK_MS,
											   wait_event);
		}
		ConditionVariableCancelSleep();
	}
	PG_END_ENSURE_ERROR_CLEANUP(stop_waiting, Int32GetDatum(slot));
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
	Oid			database_id;

	SpinLockAcquire(&idempo_shared->mutex);
	s->state = CQ_PENDING;
	s->waited_for = false;
	database_id = s->database_id;
	SpinLockRelease(&idempo_shared->mutex);
	if (!idempo_wake_sweeper(database_id))
		idempo_wake_launcher();
}

/* Whether requests of a database wait for a sweeper (the launcher then starts one at once). */
bool
idempo_cq_pending(Oid database_id)
{
	bool		pending = false;
	int			i;

	SpinLockAcquire(&idempo_shared->mutex);
	for (i = 0; i < IDEMPO_CONFLICT_SLOTS && !pending; i++)
		pending = slot_at(i)->state == CQ_PENDING && slot_at(i)->database_id == database_id;
	SpinLockRelease(&idempo_shared->mutex);
	return pending;
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
record_one(int slot, dsm_handle handle)
{
	IdempoConflictSlot *s = slot_at(slot);
	dsm_segment *seg = dsm_attach(handle);
	bool		recorded = false;
	bool		lock_timeout = false;
	int64		conflict_id = 0;
	bool		unpin = false;

	if (seg != NULL)
		idempo_record_conflict_request(seg, &recorded, &lock_timeout, &conflict_id);

	/* nothing that can throw until the slot says what was committed (see the header) */
	SpinLockAcquire(&idempo_shared->mutex);
	if (s->state != CQ_TAKEN || s->taken_by != MyProcPid || s->handle != handle)
		;						/* no longer ours (withdrawn meanwhile): leave it */
	else if (!s->waited_for && !recorded && lock_timeout)
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
	if (seg != NULL)
		dsm_detach(seg);
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
	int			served;

	for (served = 0;; served++)
	{
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz next = 0;
		int			slot = -1;
		dsm_handle	handle = 0;
		int			i;

		CHECK_FOR_INTERRUPTS();
		SpinLockAcquire(&idempo_shared->mutex);
		for (i = 0; i < IDEMPO_CONFLICT_SLOTS; i++)
		{
			IdempoConflictSlot *s = slot_at(i);

			if (s->state != CQ_PENDING || s->database_id != MyDatabaseId)
				continue;
			if (s->not_before <= now && served < SERVE_AT_ONCE)
			{
				s->state = CQ_TAKEN;
				s->taken_by = MyProcPid;
				handle = s->handle;
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
		record_one(slot, handle);
		pgstat_report_activity(STATE_IDLE, NULL);
	}
}
