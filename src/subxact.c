/*-------------------------------------------------------------------------
 *
 * subxact.c
 *	  Running a piece of work in a subtransaction that may fail with one
 *	  expected error.
 *
 * claim(wait => false) tries the claim with a lock timeout (an expected
 * 55P03 means "maybe busy"), and looks whether the key's row is locked
 * (SKIP LOCKED, in a subtransaction always undone); the sweep opens a batch's reviews with a plain
 * INSERT (an expected 23505 means "a review made by hand: redo it with ON
 * CONFLICT").  Both need the same care, that of PL/pgSQL's exception
 * blocks: whatever the error, our subtransaction is rolled back before
 * anything else, and only then is an unexpected error passed on.  Passed
 * on with the subtransaction still open, it would be caught by the
 * caller's handler (a worker's AbortCurrentTransaction(), a PL/pgSQL
 * EXCEPTION block) as if it were theirs, which aborts only our
 * subtransaction and leaves theirs -- and the user id of idempo's SPI
 * session -- in place.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "utils/resowner.h"

/*
 * Runs body(arg) in a subtransaction, which is then kept (committed into
 * the caller's transaction) or rolled back.  Returns true if body
 * succeeded, false if it failed with SQLSTATE expected (everything it did
 * undone, the error discarded); any other error is re-thrown after the
 * rollback.
 */
static bool
run_in_subxact(void (*body) (void *arg), void *arg, bool keep, int expected)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool done = true;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		body(arg);
		if (keep)
			ReleaseCurrentSubTransaction();
		else
			RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		if (expected == 0 || edata->sqlerrcode != expected)
			ReThrowError(edata);
		FreeErrorData(edata);
		done = false;
	}
	PG_END_TRY();
	return done;
}

/*
 * Runs body(arg) in a subtransaction kept on success; false (everything
 * undone) if it failed with SQLSTATE expected, any other error re-thrown.
 */
bool
idempo_try_in_subxact(void (*body) (void *arg), void *arg, int expected)
{
	return run_in_subxact(body, arg, true, expected);
}

/*
 * Runs body(arg) in a subtransaction that is always rolled back: for a look
 * that has to take locks (SELECT ... FOR UPDATE SKIP LOCKED) but must not
 * keep them.  An error is re-thrown after the rollback.
 */
void
idempo_in_undone_subxact(void (*body) (void *arg), void *arg)
{
	(void) run_in_subxact(body, arg, false, 0);
}
