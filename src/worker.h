/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The worker layer's own declarations: idempo's shared memory, the
 *	  launcher, the sweepers, the conflict queue and the names of its waits.
 *
 * Included only by the files of that layer (shmem.c, launcher.c,
 * sweeper.c, conflict_queue.c, conflicts.c, db_guard.c, wait_events.c);
 * the rest of idempo sees the counters and the set-up calls in idempo.h.
 * Everything here exists only with shared_preload_libraries = 'idempo':
 * idempo_shared is NULL otherwise.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPO_WORKER_H
#define IDEMPO_WORKER_H

#include "idempo.h"

#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/dsm.h"
#include "storage/latch.h"
#include "storage/spin.h"

typedef enum IdempoWorkerState
{
	WORKER_STARTING,
	WORKER_IDLE,
	WORKER_SWEEPING,
	WORKER_DISABLED,
	WORKER_SUBSCRIBER			/* the database's records come from a publisher: not swept */
} IdempoWorkerState;

typedef struct IdempoWorkerSlot
{
	Oid			database_id;
	pid_t		pid;			/* 0: free */
	IdempoWorkerState state;
	uint64		rounds;			/* sweep rounds done */
	uint64		wakeups;		/* times it woke up, swept or not */
	TimestampTz last_round_at;
	TimestampTz next_round_at;
	Latch	   *latch;			/* set to wake it (conflicts to record) */
} IdempoWorkerSlot;

/*
 * A conflict handed to the sweeper of its database for recording in the
 * sweeper's own transaction (conflict_queue.c).  The request itself is in
 * a pinned dynamic shared memory segment.
 */
#define IDEMPO_CONFLICT_SLOTS 256

typedef enum IdempoConflictSlotState
{
	CQ_FREE = 0,
	CQ_RESERVED,				/* handed over only if the caller's (sub)transaction rolls back */
	CQ_PENDING,					/* for the sweeper to record */
	CQ_TAKEN,					/* the sweeper is recording it */
	CQ_DONE						/* recorded or refused; the waiting claim collects it */
} IdempoConflictSlotState;

typedef struct IdempoConflictSlot
{
	IdempoConflictSlotState state;
	Oid			database_id;
	dsm_handle	handle;
	bool		waited_for;		/* a claim waits for the answer (else the slot frees itself) */
	pid_t		taken_by;		/* the sweeper recording it */
	TimestampTz not_before;		/* PENDING: try again no sooner (it met a lock) */
	bool		recorded;		/* DONE: the row is committed */
	bool		lock_timeout;	/* DONE, not recorded: a lock was not granted in time */
	int64		conflict_id;
} IdempoConflictSlot;

/*
 * A database the launcher should serve but could not start a sweeper for
 * (no free worker slot), as it last published them; shown by
 * idempo.workers().  At most IDEMPO_UNSERVED_MAX are kept.
 */
#define IDEMPO_UNSERVED_MAX 64

typedef struct IdempoUnserved
{
	Oid			database_id;
	bool		known_idempo;	/* a sweeper served it before, or a conflict waits there */
} IdempoUnserved;

typedef struct IdempoShared
{
	slock_t		mutex;			/* protects everything but the counters */
	pid_t		launcher_pid;
	Latch	   *launcher_latch;
	bool		recheck_requested;
	uint64		extension_generation;	/* bumped by every wake-up of the launcher (CREATE
										 * EXTENSION idempo among them) */
	uint64		launcher_rounds;
	TimestampTz launcher_round_at;
	Oid			held_database;	/* a database DDL needs without connections */
	TimestampTz held_until;
	TimestampTz counters_reset_at;
	pg_atomic_uint64 counters[NUM_COUNTERS];
	ConditionVariable conflicts_cv;	/* broadcast when a conflict request is DONE */
	IdempoConflictSlot conflict_slots[IDEMPO_CONFLICT_SLOTS];
	int			nunserved;		/* published by the launcher after each round */
	IdempoUnserved unserved[IDEMPO_UNSERVED_MAX];
	int			ncoming;		/* published by the launcher after each round (shmem.c) */
	int			nslots;
	IdempoWorkerSlot slots[FLEXIBLE_ARRAY_MEMBER];
	/* followed by Oid coming[nslots]: the databases a sweeper is on its way to */
} IdempoShared;

extern IdempoShared *idempo_shared;

/* ---- shmem.c: the sweepers' slots ---- */

/* Registers this process as its database's sweeper; false if another one already is. */
extern bool idempo_slot_register(Oid database_id);
/* A sweeper says what it is doing, for idempo.workers(). */
extern void idempo_slot_report(IdempoWorkerState state, bool swept, TimestampTz next_round_at);
/* The pid of the sweeper registered for a database, or 0. */
extern pid_t idempo_sweeper_pid(Oid database_id);
/* Whether a sweeper serves a database (it has found the extension there). */
extern bool idempo_sweeper_serving(Oid database_id);
/* Whether a sweeper serves the database or one is on its way: a hand-over is kept (see shmem.c). */
extern bool idempo_sweeper_coming(Oid database_id);
/* Sets the latch of a database's sweeper; false if it has none. */
extern bool idempo_wake_sweeper(Oid database_id);

/* ---- shmem.c: the launcher ---- */

/* The running launcher publishes itself, until it exits, so that others can wake it. */
extern void idempo_launcher_attach(void);
/* Asks the launcher to look at every database again now, and sets its latch if it runs. */
extern void idempo_wake_launcher(void);
/* Whether a look at every database was asked for since the last call (and clears it). */
extern bool idempo_take_recheck_request(void);
/* A counter that changes with every wake-up of the launcher (CREATE EXTENSION among them). */
extern uint64 idempo_extension_generation(void);
/* The launcher counts a round it finished, for idempo.workers(). */
extern void idempo_launcher_report_round(void);
/* The launcher publishes the databases it could not start a sweeper for. */
extern void idempo_publish_unserved(const IdempoUnserved *unserved, int n);
/* The launcher publishes the databases it has a sweeper starting or serving for, or restarts one for. */
extern void idempo_publish_coming(const Oid *coming, int n);
/* Asks the launcher not to start a sweeper for a database before "until" (database DDL). */
extern void idempo_hold_database(Oid database_id, TimestampTz until);
/* Whether a database is held (idempo_hold_database) at "now". */
extern bool idempo_database_held(Oid database_id, TimestampTz now);

/* ---- conflicts.c: the recorder's side of a hand-over ---- */

/* Records the request in seg in this worker's own transaction; never throws (see conflicts.c). */
extern void idempo_record_conflict_request(dsm_segment *seg, bool *recorded, bool *lock_timeout,
										   int64 *conflict_id);

/* ---- conflict_queue.c: conflicts recorded by the sweeper of their database ---- */

/* Puts a request in a free slot (waiting up to a second for one); its slot, or -1. */
extern int	idempo_cq_submit(dsm_segment *seg, IdempoConflictSlotState state);
/* Waits for the sweeper's answer to a PENDING request and frees its slot; true if recorded. */
extern bool idempo_cq_wait(int slot, bool *lock_timeout, int64 *conflict_id);
/* Frees a RESERVED request whose transaction committed (the claim's row stands). */
extern void idempo_cq_withdraw(int slot);
/* Gives a RESERVED request whose transaction rolled back to the sweeper; safe at abort. */
extern void idempo_cq_hand_over(int slot);
/* A new sweeper takes over the requests its database's last sweeper left TAKEN. */
extern void idempo_cq_sweeper_started(void);
/* Whether requests of a database wait for a sweeper. */
extern bool idempo_cq_pending(Oid database_id);
/* The sweeper records every due request of its database; when to come back (0: none waits). */
extern TimestampTz idempo_cq_serve(void);

/* ---- wait_events.c: what pg_stat_activity shows while idempo waits ---- */

typedef enum IdempoWait
{
	IDEMPO_WAIT_SWEEPER_IDLE,	/* a sweeper between rounds */
	IDEMPO_WAIT_LAUNCHER_IDLE,	/* the launcher between rounds */
	IDEMPO_WAIT_CONFLICT_SLOT,	/* a claim waits for a free slot of the conflict queue */
	IDEMPO_WAIT_CONFLICT_RECORDED,	/* a claim waits for the sweeper to record its conflict */
	IDEMPO_WAIT_SWEEPER_EXIT,	/* DROP/ALTER DATABASE waits for the database's sweeper to leave */
	NUM_IDEMPO_WAITS
} IdempoWait;

/* The wait event for one of idempo's waits (named from PostgreSQL 17 on). */
extern uint32 idempo_wait_event(IdempoWait wait);
/* A worker registers every name at its start; if that fails, its waits are all "Extension". */
extern void idempo_wait_events_prepare(void);

/* ---- the workers' entry points (bgw_function_name) ---- */

/* The launcher: starts and stops the sweepers; runs until SIGTERM (exit 1: restarted). */
extern PGDLLEXPORT void idempo_launcher_main(Datum main_arg);
/* The sweeper of the database whose OID is main_arg: sweeps and records handed-over conflicts. */
extern PGDLLEXPORT void idempo_sweeper_main(Datum main_arg);
/* A one-off worker that records one conflict request (where no sweeper runs); see conflicts.c. */
extern PGDLLEXPORT void idempo_conflict_recorder_main(Datum main_arg);

#endif							/* IDEMPO_WORKER_H */
