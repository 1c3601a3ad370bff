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
 * repeat.  Which acquisitions the transaction still holds (a rolled-back
 * subtransaction's are undone) is txn_attempts.c's record; it calls
 * idempo_durability_check_commit() before the commit and before PREPARE
 * TRANSACTION, which is checked with the preparing session's settings
 * (COMMIT PREPARED waits with its own).
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/lwlock.h"
#include "utils/guc.h"

/*
 * Whether synchronous standbys are defined, as the commit's wait for them
 * sees it (SyncRepWaitForLSN); call with SyncRepLock held.
 *
 * The minor releases of May 2025 (15.13, 16.9, 17.5; 18 from the start)
 * replaced WalSndCtl's bool sync_standbys_defined by the bits
 * sync_standbys_status in the same byte: bit 0 "published by the
 * checkpointer" (until then the backend's own synchronous_standby_names
 * decides), bit 1 "standbys defined".  The value 1 means "published: none"
 * there and "defined" before.  Minor upgrades do not rebuild extensions,
 * so which meaning the byte has is decided by the running server's version,
 * not by the headers this library was built with.
 */
#ifdef SYNC_STANDBY_DEFINED
#define IDEMPO_SYNC_STANDBYS_BYTE sync_standbys_status
#else
#define IDEMPO_SYNC_STANDBYS_BYTE sync_standbys_defined
#endif

/* whether the running server has the bits (server_version_num, read once) */
static inline bool
idempo_server_has_sync_standbys_status(void)
{
	static int	has = -1;

	if (has < 0)
	{
		const char *v = GetConfigOption("server_version_num", false, false);
		int			num = v ? atoi(v) : PG_VERSION_NUM;
		int			major = num / 10000,
					minor = num % 10000;

		has = major >= 18 || (major == 17 && minor >= 5) || (major == 16 && minor >= 9) ||
			(major == 15 && minor >= 13);
	}
	return has;
}

static inline bool
idempo_sync_standbys_defined(void)
{
	uint8		byte;

	StaticAssertStmt(sizeof(((WalSndCtlData *) NULL)->IDEMPO_SYNC_STANDBYS_BYTE) == 1,
					 "the synchronous standbys flag is one byte");
	byte = *(volatile uint8 *) &WalSndCtl->IDEMPO_SYNC_STANDBYS_BYTE;
	if (!idempo_server_has_sync_standbys_status())
		return byte != 0;
	/* not yet published by the checkpointer: the session's own setting decides */
	if (!(byte & (1 << 0)))
		return SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0';
	return (byte & (1 << 1)) != 0;
}

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

/*
 * Refuses the commit of a transaction that acquired key in scope, a scope
 * with durability 'replicated', unless the commit waits for a synchronous
 * standby.
 */
void
idempo_durability_check_commit(const char *scope, const char *key)
{
	const char *why = commit_skips_standby();

	if (why == NULL)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_IDEMPO_NOT_REPLICATED),
			 errmsg("cannot commit the claim of key \"%s\" in scope \"%s\": the commit would not wait for a synchronous standby",
					key, scope),
			 errdetail("Scope \"%s\" has durability 'replicated', and %s.", scope, why),
			 errhint("Commit with synchronous_commit = on, remote_write or remote_apply and a synchronous standby (synchronous_standby_names, or Patroni's synchronous_mode); or, if a failover may lose the claim, alter the scope with durability => 'local'.")));
}
