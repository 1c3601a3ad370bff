/*-------------------------------------------------------------------------
 *
 * scope_cache.c
 *	  The rows of idempo.scopes, cached per backend.
 *
 * Every claim needs its scope's policy.  Reading idempo.scopes each time
 * would add a statement to every call, so each backend keeps the scopes it
 * used in a hash table.  A statement trigger on idempo.scopes sends a
 * relcache invalidation for the table on commit (and locally at once), and
 * catalog.c's callback then marks this cache stale; it is emptied at the
 * next lookup.  This is the same mechanism PostgreSQL uses to keep its own
 * relcache coherent, so a committed alter_scope() is seen by the next claim
 * in every session.  Like the catalogs, a scope is read with the latest
 * snapshot, not the transaction's: a REPEATABLE READ transaction sees a
 * change committed after it began as soon as its cache learns of it.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"

PG_FUNCTION_INFO_V1(idempo_scopes_changed);

static HTAB *scope_cache = NULL;
static MemoryContext scope_cache_cxt = NULL;
static bool scope_cache_stale = false;

/* Called from the invalidation callback: only flag, free later. */
void
idempo_scope_cache_reset(void)
{
	scope_cache_stale = true;
}

static void
scope_cache_init(void)
{
	HASHCTL		ctl;

	if (scope_cache_cxt == NULL)
		scope_cache_cxt = AllocSetContextCreate(CacheMemoryContext, "idempo scope cache",
												ALLOCSET_SMALL_SIZES);
	else
		MemoryContextReset(scope_cache_cxt);

	ctl.keysize = IDEMPO_MAX_SCOPE_BYTES + 1;
	ctl.entrysize = sizeof(IdempoScope);
	ctl.hcxt = scope_cache_cxt;
	scope_cache = hash_create("idempo scopes", 16, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	scope_cache_stale = false;
}

/* Reads one scope from idempo.scopes into *entry; false if there is none. */
static bool
scope_load(const char *name, IdempoScope *entry)
{
	Datum		arg = CStringGetTextDatum(name);
	HeapTuple	tuple;
	TupleDesc	desc;
	Datum		d;
	bool		isnull;
	char	   *role;

	/* the row as committed now: a REPEATABLE READ snapshot would keep showing it as it was */
	if (idempo_spi_read_latest(idempo_catalog()->scope_rules ? PLAN_SCOPE_GET : PLAN_SCOPE_GET_0_2,
							   &arg, NULL, 1) == 0)
		return false;
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;

	entry->retention = *DatumGetIntervalP(SPI_getbinval(tuple, desc, 1, &isnull));
	entry->lease = *DatumGetIntervalP(SPI_getbinval(tuple, desc, 2, &isnull));
	entry->retry_on_lease_expiry = strcmp(TextDatumGetCString(SPI_getbinval(tuple, desc, 3, &isnull)), "retry") == 0;
	entry->verify_settle = *DatumGetIntervalP(SPI_getbinval(tuple, desc, 4, &isnull));
	d = SPI_getbinval(tuple, desc, 5, &isnull);
	entry->max_attempts = isnull ? 0 : DatumGetInt32(d);
	entry->require_fingerprint = DatumGetBool(SPI_getbinval(tuple, desc, 6, &isnull));
	entry->hash_keys = DatumGetBool(SPI_getbinval(tuple, desc, 7, &isnull));
	entry->store_params = DatumGetBool(SPI_getbinval(tuple, desc, 8, &isnull));
	entry->audit = DatumGetBool(SPI_getbinval(tuple, desc, 9, &isnull));
	role = SPI_getvalue(tuple, desc, 10);
	entry->allowed_role_name = role ? MemoryContextStrdup(scope_cache_cxt, role) : NULL;
	entry->allowed_role = role ? get_role_oid(role, true) : InvalidOid;
	d = SPI_getbinval(tuple, desc, 11, &isnull);
	entry->owner = isnull ? NULL : MemoryContextStrdup(scope_cache_cxt, TextDatumGetCString(d));
	entry->enabled = DatumGetBool(SPI_getbinval(tuple, desc, 12, &isnull));
	/* 0.3.0's columns (PLAN_SCOPE_GET); with older objects *entry keeps its zeroed defaults */
	if (desc->natts >= 15)
	{
		entry->replicated = strcmp(TextDatumGetCString(SPI_getbinval(tuple, desc, 13, &isnull)),
								   "replicated") == 0;
		d = SPI_getbinval(tuple, desc, 14, &isnull);
		if (!isnull)
			entry->remember = *DatumGetIntervalP(d);
		/* greater than '0' as the interval type compares (and the scope's CHECK) */
		entry->remembers = idempo_interval_usecs(&entry->remember) > 0;
		d = SPI_getbinval(tuple, desc, 15, &isnull);
		if (!isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(scope_cache_cxt);

			entry->fingerprint_ignore_paths = DatumGetArrayTypePCopy(d);
			MemoryContextSwitchTo(old);
		}
	}
	return true;
}

/*
 * Whether two fingerprint_ignore columns, as loaded (flat copies), are the
 * same list.  Byte for byte: a list that alter_scope() reordered (which it
 * allows, the rule being the same) compares unequal, and a claim racing
 * that change gets a needless 40001 - rare, and retrying is the answer.
 */
static bool
ignore_paths_equal(const ArrayType *a, const ArrayType *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return VARSIZE(a) == VARSIZE(b) && memcmp(a, b, VARSIZE(a)) == 0;
}

/*
 * The policy of a scope, from the cache or idempo.scopes; NULL if there is
 * no such scope.  Call inside an idempo SPI session.  The result stays valid
 * until the next call.
 */
const IdempoScope *
idempo_scope_find(const char *name)
{
	IdempoScope *entry;
	IdempoScope loaded;
	bool		found;

	(void) idempo_catalog();	/* the cache is only valid with the catalog */
	/* scopes replicated from a publisher change without a trigger telling us: read them afresh */
	if (scope_cache == NULL || scope_cache_stale || unlikely(idempo_scopes_subscription() != NULL))
		scope_cache_init();

	entry = hash_search(scope_cache, name, HASH_FIND, NULL);
	if (likely(entry != NULL))
		return entry;

	memset(&loaded, 0, sizeof(loaded));
	if (!scope_load(name, &loaded))
		return NULL;
	strlcpy(loaded.name, name, sizeof(loaded.name));
	entry = hash_search(scope_cache, name, HASH_ENTER, &found);
	*entry = loaded;
	return entry;
}

/*
 * The scope's fingerprint_ignore, compiled (NULL: every field counts).  It is
 * compiled when a claim first needs it, not when the scope is loaded: a list
 * that does not compile (written by a direct UPDATE, past check_scope()) then
 * fails the claims of its own scope, saying why, and not the sweep, which
 * loads the scope of every due row and never needs the list.
 */
const IdempoIgnore *
idempo_scope_ignore(const IdempoScope *scope)
{
	IdempoScope *entry = unconstify(IdempoScope *, scope);	/* the cache's entry, filled in here */

	if (!entry->fingerprint_ignore_compiled)
	{
		/* an error must leave nothing half-built in the cache: check in the caller's memory first */
		(void) idempo_ignore_compile(entry->fingerprint_ignore_paths, CurrentMemoryContext, entry->name);
		entry->fingerprint_ignore = idempo_ignore_compile(entry->fingerprint_ignore_paths,
														  scope_cache_cxt, entry->name);
		entry->fingerprint_ignore_compiled = true;
	}
	return entry->fingerprint_ignore;
}

/*
 * Whether the settings that decide how a new record is stored (hash_keys: the
 * key; fingerprint_ignore: the fingerprint) are still those of the scope as
 * now committed.  alter_scope() changes them only while the scope has no
 * operations, holding a lock on idempo.operations that waits for claims in
 * flight and that claims wait for; a claim that read the scope before such a
 * change committed and took its lock on idempo.operations after it has
 * accepted the change's invalidation with that lock (PostgreSQL reads
 * invalidations whenever it acquires a relation lock), so a cache still
 * fresh needs no second look, and a stale one is compared with the row as
 * committed now (scope_load() reads the latest snapshot).  Call inside an
 * idempo SPI session, after the record was written.
 */
bool
idempo_scope_unchanged(const IdempoScope *scope)
{
	IdempoScope fresh;

	if (!scope_cache_stale)
		return true;
	memset(&fresh, 0, sizeof(fresh));
	if (!scope_load(scope->name, &fresh))
		return false;
	return fresh.hash_keys == scope->hash_keys &&
		ignore_paths_equal(fresh.fingerprint_ignore_paths, scope->fingerprint_ignore_paths);
}

/* Like idempo_scope_find(), but an unknown scope is an error. */
const IdempoScope *
idempo_scope_get(const char *name)
{
	const IdempoScope *scope = idempo_scope_find(name);

	if (scope == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("scope \"%s\" does not exist", name),
				 errhint("Check the name; a role that may create scopes (docs/security.md) adds it with SELECT idempo.create_scope('%s', retention => '24 hours');",
						 name)));
	return scope;
}

/*
 * Refuses use of a disabled scope, or by a role outside allowed_role.
 * user is the caller's identity (not the owner we run SPI as).
 */
void
idempo_scope_check_use(const IdempoScope *scope, const char *key, Oid user)
{
	if (!scope->enabled)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("scope \"%s\" is disabled (key \"%s\"); its owner is %s",
						scope->name, key, scope->owner ? scope->owner : "not recorded"),
				 errhint("An old copy of a flow may still be running. Ask the scope's owner before enabling it again with idempo.enable_scope('%s').",
						 scope->name)));

	if (scope->allowed_role_name != NULL)
	{
		if (!OidIsValid(scope->allowed_role))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("allowed_role \"%s\" of scope \"%s\" does not exist",
							scope->allowed_role_name, scope->name),
					 errhint("Recreate the role or change the scope with idempo.alter_scope('%s', allowed_role => ...).",
							 scope->name)));
		if (!is_member_of_role(user, scope->allowed_role))
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("role \"%s\" may not use scope \"%s\" (key \"%s\")",
							GetUserNameFromId(user, false), scope->name, key),
					 errhint("Only members of role \"%s\" may claim, complete, fail or verify in this scope.",
							 scope->allowed_role_name)));
	}
}

/*
 * Trigger on idempo.scopes: make every backend (this one at once, the others
 * at commit) forget its cached scopes.
 *
 * On a Citus cluster idempo.scopes is a reference table: a change runs on
 * the table's placement on every node (the relation idempo.scopes_<shardid>),
 * and it is there that the trigger fires, not on idempo.scopes itself.  So
 * the invalidation always names idempo.scopes, which is what catalog.c's
 * callback watches, and every node's backends drop their copies.
 */
Datum
idempo_scopes_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("idempo.scopes_changed() must be called as a trigger")));
	idempo_refuse_scope_change_on_subscriber();
	CacheInvalidateRelcache(trigdata->tg_relation);
	if (RelationGetRelid(trigdata->tg_relation) != idempo_catalog()->scopes_relid)
		CacheInvalidateRelcacheByRelid(idempo_catalog()->scopes_relid);
	PG_RETURN_POINTER(NULL);
}
