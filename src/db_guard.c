/*-------------------------------------------------------------------------
 *
 * db_guard.c
 *	  A utility hook that keeps the sweepers out of the way of database DDL,
 *	  and tells the launcher about CREATE EXTENSION idempo as soon as it
 *	  commits.
 *
 * DROP DATABASE, ALTER DATABASE ... RENAME / SET TABLESPACE and CREATE
 * DATABASE ... TEMPLATE x refuse to run while other sessions are connected
 * to the database.  A sweeper is such a session, so before those commands
 * run we stop the database's sweeper and ask the launcher to hold off for
 * a few seconds.  Only the database's owner (or a superuser) can cause
 * this; anyone else's command fails its own privilege check as before.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"
#include "worker.h"

#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/timestamp.h"

#define HOLD_MS 10000			/* the launcher waits this long before restarting it */
#define STOP_WAIT_MS 5000		/* how long we wait for the sweeper to leave */

static ProcessUtility_hook_type prev_ProcessUtility = NULL;
static bool wake_launcher_at_commit = false;

/* CREATE EXTENSION idempo committed: now a sweeper will find it */
static void
db_guard_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT && wake_launcher_at_commit)
		idempo_wake_launcher();
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_PREPARE)
		wake_launcher_at_commit = false;
}

/* Stops the sweeper of a database and holds the launcher off. */
static void
release_database(const char *name)
{
	Oid			database_id;
	pid_t		pid;
	bool		signalled = false;
	TimestampTz give_up;

	if (idempo_shared == NULL || name == NULL)
		return;
	database_id = get_database_oid(name, true);
	if (!OidIsValid(database_id) || !object_ownercheck(DatabaseRelationId, database_id, GetUserId()))
		return;
	idempo_hold_database(database_id, TimestampTzPlusMilliseconds(GetCurrentTimestamp(), HOLD_MS));
	/* a deadline, not a count of waits: a latch set meanwhile ends a wait early */
	give_up = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), STOP_WAIT_MS);
	while (GetCurrentTimestamp() < give_up)
	{
		pid = idempo_sweeper_pid(database_id);
		if (pid == 0)
			return;
		if (!signalled)
			(void) kill(pid, SIGTERM);
		signalled = true;
		CHECK_FOR_INTERRUPTS();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10,
						 idempo_wait_event(IDEMPO_WAIT_SWEEPER_EXIT));
		ResetLatch(MyLatch);
	}
}

static char *
option_string(List *options, const char *name)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *d = lfirst(lc);

		if (strcmp(d->defname, name) == 0 && d->arg != NULL)
			return defGetString(d);
	}
	return NULL;
}

static void
idempo_ProcessUtility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					  ProcessUtilityContext context, ParamListInfo params,
					  QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	bool		created_idempo = false;

	switch (nodeTag(stmt))
	{
		case T_DropdbStmt:
			release_database(((DropdbStmt *) stmt)->dbname);
			break;
		case T_RenameStmt:
			if (((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
				release_database(((RenameStmt *) stmt)->subname);
			break;
		case T_AlterDatabaseStmt:
			if (option_string(((AlterDatabaseStmt *) stmt)->options, "tablespace"))
				release_database(((AlterDatabaseStmt *) stmt)->dbname);
			break;
		case T_CreatedbStmt:
			release_database(option_string(((CreatedbStmt *) stmt)->options, "template"));
			break;
		case T_CreateExtensionStmt:
			created_idempo = strcmp(((CreateExtensionStmt *) stmt)->extname, "idempo") == 0;
			break;
		default:
			break;
	}

	if (prev_ProcessUtility)
		prev_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);

	if (created_idempo)
		wake_launcher_at_commit = true;
}

void
idempo_install_utility_hook(void)
{
	prev_ProcessUtility = ProcessUtility_hook;
	ProcessUtility_hook = idempo_ProcessUtility;
	RegisterXactCallback(db_guard_xact_callback, NULL);
}
