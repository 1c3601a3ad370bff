/*-------------------------------------------------------------------------
 *
 * drop_guard.c
 *	  Refuses to drop the extension while it holds processing records.
 *
 * DROP EXTENSION idempo deletes every operation, review and conflict with
 * it: after CREATE EXTENSION idempo a key whose action was done would be
 * acquired again.  So while operations, open reviews or open conflicts
 * exist, the statements that would drop the extension are refused:
 *	 - DROP EXTENSION idempo (with or without CASCADE, among other names);
 *	 - DROP SCHEMA idempo CASCADE (the extension depends on its schema);
 *	 - DROP OWNED BY the role that owns the extension.
 * A superuser sets idempo.allow_drop_with_records to drop them anyway.
 *
 * The check is an event trigger on ddl_command_start that is a member of
 * the extension: it exists exactly while the extension does, it sees the
 * statement before anything is dropped, and calling it loads this library,
 * so it works whether or not the library is preloaded.  It is ENABLE
 * ALWAYS, so session_replication_role = replica does not bypass it.
 *
 * Statement forms are not every route: a cascade reaches the extension
 * from anything one of its members depends on (DROP EXTENSION plpgsql
 * CASCADE: its PL/pgSQL functions; DROP OWNED BY the owner of a schema
 * idempo was installed into; an extension a member was marked DEPENDS ON),
 * and PostgreSQL then drops the whole extension.  So the library also
 * installs an object_access_hook, loaded with it whatever the route: it sees
 * OAT_DROP for every object of a DROP before that object is deleted, and the
 * first of idempo's objects to go (a member, or the extension row itself)
 * is checked like the statements above.  The trigger fires for every DROP
 * tag, so the library is loaded before any DROP runs even when it is not
 * preloaded.  The extension's own scripts (ALTER EXTENSION UPDATE) may drop
 * members: those drops do not drop the extension.
 *
 * Event triggers do not fire in single-user mode (nor, on PostgreSQL 17
 * and later, with event_triggers = off) and a library that is not loaded
 * has no hook: those are a superuser's deliberate way around it, as is
 * ALTER EVENT TRIGGER idempo_drop_guard DISABLE in a session that has not
 * loaded the library, the way out when the library itself is gone.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_extension.h"
#include "commands/event_trigger.h"
#include "commands/extension.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(idempo_drop_guard);

bool		idempo_allow_drop_with_records = false;

static object_access_hook_type prev_object_access_hook = NULL;

/* The owner and schema of the extension idempo (from pg_extension). */
static bool
extension_owner_and_schema(Oid ext, Oid *owner, Oid *nsp)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		found = false;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		Form_pg_extension form = (Form_pg_extension) GETSTRUCT(tuple);

		*owner = form->extowner;
		*nsp = form->extnamespace;
		found = true;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

static bool
names_include(List *objects, const char *name)
{
	ListCell   *lc;

	foreach(lc, objects)
		if (IsA(lfirst(lc), String) && strcmp(strVal(lfirst(lc)), name) == 0)
			return true;
	return false;
}

static bool
roles_include(List *roles, Oid role)
{
	ListCell   *lc;

	foreach(lc, roles)
		if (get_rolespec_oid((RoleSpec *) lfirst(lc), true) == role)
			return true;
	return false;
}

/*
 * The statement's way of dropping the extension, for the message: NULL if
 * it does not drop it.
 */
static const char *
drops_extension(Node *stmt, Oid owner, Oid nsp)
{
	if (IsA(stmt, DropStmt))
	{
		DropStmt   *d = (DropStmt *) stmt;

		if (d->removeType == OBJECT_EXTENSION && names_include(d->objects, "idempo"))
			return "DROP EXTENSION idempo";
		/* without CASCADE PostgreSQL refuses it by itself: the extension depends on the schema */
		if (d->removeType == OBJECT_SCHEMA && d->behavior == DROP_CASCADE &&
			names_include(d->objects, get_namespace_name(nsp)))
			return "DROP SCHEMA idempo CASCADE";
	}
	else if (IsA(stmt, DropOwnedStmt))
	{
		if (roles_include(((DropOwnedStmt *) stmt)->roles, owner))
			return "DROP OWNED BY the extension's owner";
	}
	return NULL;
}

/* count(*) of one of idempo's tables (0 if someone renamed it away), as the caller. */
static int64
count_rows(Oid nsp, const char *table, const char *where)
{
	char	   *sql;
	bool		isnull;
	Datum		d;

	if (!OidIsValid(get_relname_relid(table, nsp)))
		return 0;
	sql = psprintf("SELECT pg_catalog.count(*) FROM %s.%s%s",
				   quote_identifier(get_namespace_name(nsp)), table, where);
	if (SPI_execute(sql, true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "could not count the rows of idempo.%s", table);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? 0 : DatumGetInt64(d);
}

/* "3 operations", "1 open review": appended with the right separator. */
static void
append_count(StringInfo buf, int64 n, const char *one, const char *many, int *parts, int total)
{
	if (n == 0)
		return;
	if (*parts > 0)
		appendStringInfoString(buf, *parts == total - 1 ? " and " : ", ");
	appendStringInfo(buf, "%lld %s", (long long) n, n == 1 ? one : many);
	(*parts)++;
}

/*
 * ERRORs if idempo (schema nsp) holds operations, open reviews or open
 * conflicts; how says what would drop it, for the detail.  Counts as the
 * current user: the caller decides who that is.
 */
static void
refuse_if_records(Oid nsp, const char *how)
{
	int64		operations,
				reviews,
				conflicts;
	int			parts = 0,
				total;
	StringInfoData what;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	/*
	 * Count what is committed now, not what the statement's snapshot shows:
	 * the hook runs after the DROP waited for its locks, and a claim that
	 * committed meanwhile (the DROP queued behind its lock on
	 * idempo.operations) must count, or its record is dropped with the rest.
	 */
	PushActiveSnapshot(GetLatestSnapshot());
	operations = count_rows(nsp, "operations", "");
	reviews = count_rows(nsp, "reviews", " WHERE resolved_at IS NULL");
	conflicts = count_rows(nsp, "conflicts", " WHERE resolved_at IS NULL");
	PopActiveSnapshot();
	SPI_finish();
	if (operations == 0 && reviews == 0 && conflicts == 0)
		return;

	total = (operations > 0) + (reviews > 0) + (conflicts > 0);
	initStringInfo(&what);
	append_count(&what, operations, "operation", "operations", &parts, total);
	append_count(&what, reviews, "open review", "open reviews", &parts, total);
	append_count(&what, conflicts, "open conflict", "open conflicts", &parts, total);
	ereport(ERROR,
			(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
			 errmsg("cannot drop extension idempo while it holds %s", what.data),
			 errdetail("%s would delete every processing record with it: after CREATE EXTENSION idempo, a key whose action was done would be acquired again.",
					   how),
			 errhint("Let finished records expire and resolve reviews and conflicts first, or keep them in a dump (pg_dump); to drop them anyway, a superuser runs SET idempo.allow_drop_with_records = on first.")));
}

/* idempo.drop_guard(): the event trigger function (see the file header). */
Datum
idempo_drop_guard(PG_FUNCTION_ARGS)
{
	EventTriggerData *trigdata;
	Oid			ext,
				owner,
				nsp;
	const char *how;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idempo.drop_guard() must be called as an event trigger")));
	trigdata = (EventTriggerData *) fcinfo->context;

	ext = get_extension_oid("idempo", true);
	if (!OidIsValid(ext) || !extension_owner_and_schema(ext, &owner, &nsp))
		PG_RETURN_VOID();
	how = drops_extension(trigdata->parsetree, owner, nsp);
	if (how == NULL || idempo_allow_drop_with_records)
		PG_RETURN_VOID();
	/* a role that may not drop it gets PostgreSQL's own refusal, not our counts */
	if (!has_privs_of_role(GetUserId(), owner))
		PG_RETURN_VOID();

	refuse_if_records(nsp, how);
	PG_RETURN_VOID();
}

/*
 * The extension idempo if the object is it or one of its members, else
 * InvalidOid.
 */
static Oid
idempo_extension_of(Oid classId, Oid objectId)
{
	Oid			ext;
	char	   *name;

	ext = classId == ExtensionRelationId ? objectId : getExtensionOfObject(classId, objectId);
	if (!OidIsValid(ext))
		return InvalidOid;
	name = get_extension_name(ext);
	return name != NULL && strcmp(name, "idempo") == 0 ? ext : InvalidOid;
}

/*
 * object_access_hook: the backstop for the routes the statement check does
 * not recognise (see the file header).  PostgreSQL has already checked that
 * the statement may drop what it drops, so the records are counted as the
 * extension's owner, whoever runs it.
 */
static void
drop_guard_object_access(ObjectAccessType access, Oid classId, Oid objectId, int subId, void *arg)
{
	Oid			ext,
				owner,
				nsp,
				save_userid;
	int			save_sec_context;

	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);

	/* a column is not the extension: only whole objects can be its members */
	if (access != OAT_DROP || subId != 0 || idempo_allow_drop_with_records)
		return;
	ext = idempo_extension_of(classId, objectId);
	if (!OidIsValid(ext))
		return;
	/* its own update script dropping one of its objects: the extension stays */
	if (creating_extension && CurrentExtensionObject == ext)
		return;
	if (!extension_owner_and_schema(ext, &owner, &nsp))
		return;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	refuse_if_records(nsp, "This statement drops extension idempo, directly or by cascade, which");
	SetUserIdAndSecContext(save_userid, save_sec_context);
}

/* _PG_init: whether or not the library is preloaded (see the file header). */
void
idempo_install_drop_hook(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = drop_guard_object_access;
}
