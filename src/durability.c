/*-------------------------------------------------------------------------
 *
 * durability.c
 *	  Scopes with durability 'replicated': a transaction that acquired a key
 *	  of such a scope commits only if the commit waits for a synchronous
 *	  standby.
 *
 * In the two-transaction pattern the claim commits before the outside call.
 * If that commit reaches only the primary and the primary is lost (a
 * failover with asynchronous standbys), the new primary has no record, the
 * retry is 'acquired' again and the outside call runs twice.  A scope that
 * must survive failover says so, and then the check is made where it cannot
 * be talked around: just before the commit record is written
 * (XACT_EVENT_PRE_COMMIT), with the rule PostgreSQL's commit itself applies
 * (SyncRepWaitForLSN): synchronous_commit above 'local', WAL senders
 * allowed, and synchronous standbys defined as the checkpointer last
 * published them.  A SET LOCAL after the claim is therefore seen.
 *
 * Only acquisitions count: they are what lets an action run.  A replay, a
 * busy or a conflict answer commits no decision that a lost commit could
 * repeat.  An acquisition undone by a rolled-back subtransaction no longer
 * counts.  PREPARE TRANSACTION is checked the same way, with the settings of
 * the preparing session (COMMIT PREPARED waits with its own).
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "replication/walsender.h"
#include "storage/lwlock.h"
#include "utils/memutils.h"

#include "compat.h"

/*
 * The shallowest transaction nesting level at which an acquisition in a
 * replicated scope is still live (0: none), and the first one, for the
 * message.
 */
static int	acquired_level = 0;
static char *acquired_scope = NULL;
static char *acquired_key = NULL;
static bool callbacks_registered = false;

/* Why the commit would not wait for a synchronous standby; NULL if it would. */
static const char *
commit_skips_standby(void)
{
	bool		defined;

	if (max_wal_senders <= 0)
		return "max_wal_senders is 0, so no standby can be synchronous";
	if (synchronous_commit <= SYNCHRONOUS_COMMIT_LOCAL_FLUSH)
		return psprintf("synchronous_commit is \"%s\", which does not wait for a standby",
						GetConfigOption("synchronous_commit", false, false));
	LWLockAcquire(SyncRepLock, LW_SHARED);
	defined = idempo_sync_standbys_defined();
	LWLockRelease(SyncRepLock);
	if (!defined)
		return "no synchronous standby is configured (synchronous_standby_names is empty)";
	return NULL;
}

static void
check_before_commit(void)
{
	const char *why;

	if (acquired_level == 0)
		return;
	why = commit_skips_standby();
	if (why == NULL)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_IDEMPO_NOT_REPLICATED),
			 errmsg("cannot commit the claim of key \"%s\" in scope \"%s\": the commit would not wait for a synchronous standby",
					acquired_key, acquired_scope),
			 errdetail("Scope \"%s\" has durability 'replicated', and %s.", acquired_scope, why),
			 errhint("Commit with synchronous_commit = on, remote_write or remote_apply and a synchronous standby (synchronous_standby_names, or Patroni's synchronous_mode); or, if a failover may lose the claim, alter the scope with durability => 'local'.")));
}

static void
forget(void)
{
	/* the strings live in TopTransactionContext and go with it */
	acquired_level = 0;
	acquired_scope = acquired_key = NULL;
}

static void
durability_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			check_before_commit();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			forget();
			break;
		default:
			break;
	}
}

static void
durability_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();

	if (acquired_level < level)
		return;					/* none, or made by an enclosing level */
	if (event == SUBXACT_EVENT_ABORT_SUB)
		forget();				/* everything at this level and deeper is undone */
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
		acquired_level = level - 1; /* now the parent's */
}

/*
 * Called when a claim answered 'acquired'.  Scopes with durability 'local'
 * are not tracked.
 */
void
idempo_durability_acquired(const IdempoScope *scope, const char *key)
{
	int			level = GetCurrentTransactionNestLevel();

	if (!scope->replicated)
		return;
	if (!callbacks_registered)
	{
		RegisterXactCallback(durability_xact_callback, NULL);
		RegisterSubXactCallback(durability_subxact_callback, NULL);
		callbacks_registered = true;
	}
	if (acquired_level != 0 && acquired_level <= level)
		return;
	acquired_level = level;
	acquired_scope = MemoryContextStrdup(TopTransactionContext, scope->name);
	acquired_key = MemoryContextStrdup(TopTransactionContext, key);
}
