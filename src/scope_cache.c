/*-------------------------------------------------------------------------
 *
 * scope_cache.c
 *	  The rows of idempo.scopes, cached per backend.
 *
 * Every claim needs its scope's policy.  Reading idempo.scopes each time
 * would add a statement to every call, so each backend keeps the scopes it
 * used in a hash table.  A statement trigger on idempo.scopes sends a
 * relcache invalidation for the table on commit (and locally at once), and
 * a relcache callback (catalog.c's, which calls this file's watcher) marks
 * the cache stale; a new one is built at the next lookup.  This is the mechanism PostgreSQL uses to keep
 * its own relcache coherent, with one difference: PostgreSQL reads the
 * invalidations other sessions sent only when it takes a lock it does not
 * hold yet, and a transaction that already claimed holds every lock a claim
 * takes.  So every lookup first reads them itself
 * (AcceptInvalidationMessages(): a test of one flag when there are none),
 * and a change committed by another session is seen by the next call in
 * every session, inside an open transaction too.  Like the catalogs, a
 * scope is read with the latest snapshot, not the transaction's: a
 * REPEATABLE READ transaction sees a change committed after it began.
 *
 * allowed_role is kept as the name the scope row holds and looked up at
 * each use (a syscache probe): a role renamed, or dropped and created
 * again, changes no scope row and sends no invalidation that would reach
 * this cache, so a role OID kept here could name another role by now.
 *
 * Lifetime.  A scope returned by idempo_scope_find() stays valid until the
 * caller's idempo SPI session ends, whatever happens meanwhile: a user
 * trigger on idempo.operations may call alter_scope() and claim() inside
 * the claim that fired it, and the nested claim then finds the cache stale.
 * So a stale cache is never freed in place: its memory context is moved
 * under the memory of the outermost idempo call (plans.c), freed when that
 * call ends, or with the transaction if it ended in an error, and a new one
 * is built.  A transaction of many calls keeps at most the generations of
 * one call, not every one it saw.
 * Where idempo.scopes comes from a publisher, the apply worker's changes
 * fire no statement trigger, so each lookup reads the scope afresh into the
 * caller's memory (the SPI session's) instead of the cache.
 *
 * Dependencies, in one direction: catalog.c (the OIDs) <- replication.c
 * (subscriptions) <- plans.c (statements, the write check) <- this file.
 * None of them calls back into a later one.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"

PG_FUNCTION_INFO_V1(idempo_scopes_changed);

static HTAB *scope_cache = NULL;
static MemoryContext scope_cache_cxt = NULL;
static Oid	scope_cache_relid = InvalidOid;	/* idempo.scopes when the cache was built */
static bool scope_cache_stale = false;

/* Relcache invalidation: idempo.scopes changed (or was dropped), or everything did. */
static void
scope_cache_relcache_callback(Oid relid)
{
	if (relid == InvalidOid || relid == scope_cache_relid)
		scope_cache_stale = true;
}

void
idempo_scope_cache_register_callbacks(void)
{
	/* through catalog.c's callback: PostgreSQL's slots for them are few */
	idempo_catalog_watch_relcache(scope_cache_relcache_callback);
}

/*
 * A new, empty cache for the scopes table scopes_relid.  The old one may
 * still be in use by a caller further up the stack (see the file header):
 * it is retired to the outermost idempo call's memory, not freed.
 */
static void
scope_cache_renew(Oid scopes_relid)
{
	HASHCTL		ctl;

	Assert(IsTransactionState());
	if (scope_cache_cxt != NULL)
		MemoryContextSetParent(scope_cache_cxt, idempo_spi_outermost_context());
	scope_cache_cxt = NULL;
	scope_cache = NULL;

	scope_cache_cxt = AllocSetContextCreate(CacheMemoryContext, "idempo scope cache",
											ALLOCSET_SMALL_SIZES);
	ctl.keysize = IDEMPO_MAX_SCOPE_BYTES + 1;
	ctl.entrysize = sizeof(IdempoScope);
	ctl.hcxt = scope_cache_cxt;
	scope_cache = hash_create("idempo scopes", 16, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	scope_cache_relid = scopes_relid;
	scope_cache_stale = false;
}

/*
 * Reads one scope from idempo.scopes into *entry, its strings and lists
 * allocated in cxt; false if there is none.
 */
static bool
scope_load(const char *name, IdempoScope *entry, MemoryContext cxt)
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

	strlcpy(entry->name, name, sizeof(entry->name));
	entry->cxt = cxt;
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
	entry->allowed_role_name = role ? MemoryContextStrdup(cxt, role) : NULL;
	d = SPI_getbinval(tuple, desc, 11, &isnull);
	entry->owner = isnull ? NULL : MemoryContextStrdup(cxt, TextDatumGetCString(d));
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
			MemoryContext old = MemoryContextSwitchTo(cxt);

			entry->fingerprint_ignore_paths = DatumGetArrayTypePCopy(d);
			MemoryContextSwitchTo(old);
		}
		d = desc->natts >= 16 ? SPI_getbinval(tuple, desc, 16, &isnull) : (Datum) 0;
		if (desc->natts >= 16 && !isnull)
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);

			entry->fingerprint_include_paths = DatumGetArrayTypePCopy(d);
			MemoryContextSwitchTo(old);
		}
		role = desc->natts >= 17 ? SPI_getvalue(tuple, desc, 17) : NULL;
		entry->review_role_name = role ? MemoryContextStrdup(cxt, role) : NULL;
	}
	return true;
}

/*
 * The policy of a scope, from the cache or idempo.scopes; NULL if there is
 * no such scope.  Call inside an idempo SPI session.  The result stays valid
 * until that session ends, even if a nested idempo call renews the cache
 * (see the file header).
 */
const IdempoScope *
idempo_scope_find(const char *name)
{
	const IdempoCatalog *cat;
	IdempoScope *entry;
	IdempoScope loaded;
	bool		found;

	/* what other sessions committed (alter_scope, disable_scope), also with every lock held */
	AcceptInvalidationMessages();
	cat = idempo_catalog();

	/* scopes replicated from a publisher change without a trigger telling us: read them afresh */
	if (unlikely(idempo_scopes_subscription() != NULL))
	{
		entry = palloc0(sizeof(IdempoScope));
		if (!scope_load(name, entry, CurrentMemoryContext))
		{
			pfree(entry);
			return NULL;
		}
		return entry;
	}

	if (scope_cache == NULL || scope_cache_stale || scope_cache_relid != cat->scopes_relid)
		scope_cache_renew(cat->scopes_relid);

	entry = hash_search(scope_cache, name, HASH_FIND, NULL);
	if (likely(entry != NULL))
		return entry;

	memset(&loaded, 0, sizeof(loaded));
	if (!scope_load(name, &loaded, scope_cache_cxt))
		return NULL;
	entry = hash_search(scope_cache, name, HASH_ENTER, &found);
	*entry = loaded;
	return entry;
}

/*
 * Where a scope's list of fingerprint paths is compiled: a context of its
 * own under the caller's memory, so that a list that does not compile
 * leaves nothing half-built in the cache (the error frees it with the
 * caller's memory); rules_keep() then moves it under the scope's.  NULL
 * when there is no list (nothing to compile).
 */
static MemoryContext
rules_begin(ArrayType *paths)
{
	if (paths == NULL)
		return NULL;
	return AllocSetContextCreate(CurrentMemoryContext, "idempo fingerprint rules",
								 ALLOCSET_SMALL_SIZES);
}

static void
rules_keep(IdempoScope *entry, MemoryContext cxt, const void *compiled)
{
	if (cxt == NULL)
		return;
	if (compiled == NULL)
		MemoryContextDelete(cxt);	/* an empty list: every field counts */
	else
		MemoryContextSetParent(cxt, entry->cxt);
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
		MemoryContext cxt = rules_begin(entry->fingerprint_ignore_paths);

		entry->fingerprint_ignore = idempo_ignore_compile(entry->fingerprint_ignore_paths, cxt,
														  entry->name);
		rules_keep(entry, cxt, entry->fingerprint_ignore);
		entry->fingerprint_ignore_compiled = true;
	}
	return entry->fingerprint_ignore;
}

/* The scope's fingerprint_include, compiled (NULL: every field counts); as idempo_scope_ignore(). */
const IdempoInclude *
idempo_scope_include(const IdempoScope *scope)
{
	IdempoScope *entry = unconstify(IdempoScope *, scope);

	if (!entry->fingerprint_include_compiled)
	{
		MemoryContext cxt = rules_begin(entry->fingerprint_include_paths);

		entry->fingerprint_include = idempo_include_compile(entry->fingerprint_include_paths, cxt,
															entry->name);
		rules_keep(entry, cxt, entry->fingerprint_include);
		entry->fingerprint_include_compiled = true;
	}
	return entry->fingerprint_include;
}

/*
 * The scope's values, copied into *out for use after the SPI session ends
 * (claim_batch.c): every pointer into the cache's memory is cleared, and
 * the fingerprint rules count as compiled to nothing, so that nothing can
 * reach memory freed by an invalidation.  A new pointer field of
 * IdempoScope is cleared here.
 */
void
idempo_scope_values(const IdempoScope *scope, IdempoScope *out)
{
	*out = *scope;
	out->fingerprint_ignore_paths = NULL;
	out->fingerprint_ignore = NULL;
	out->fingerprint_ignore_compiled = true;
	out->fingerprint_include_paths = NULL;
	out->fingerprint_include = NULL;
	out->fingerprint_include_compiled = true;
	out->allowed_role_name = NULL;
	out->review_role_name = NULL;
	out->owner = NULL;
	out->cxt = NULL;
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
 * idempo_scope_get() for a call that writes the scope's records from what
 * the scope says (complete, fail, verify, resolve; the claim and the sweep
 * take the same lock themselves).  The lock on idempo.operations that the
 * write takes anyway is taken first, before the scope is read, and held to
 * the end of the transaction.  alter_scope() changes the settings that
 * decide how records are stored and scheduled (hash_keys,
 * fingerprint_ignore, retention, remember) only under a lock that conflicts
 * with it, so it either committed before this lock was granted, and the
 * lookup sees the change (its invalidation was sent before its locks were
 * released, and the lookup reads invalidations first), or it waits for this
 * transaction and then sees the records it wrote.
 */
const IdempoScope *
idempo_scope_get_for_write(const char *name)
{
	LockRelationOid(idempo_catalog()->operations_relid, RowExclusiveLock);
	return idempo_scope_get(name);
}

/*
 * Refuses a role outside the scope's allowed_role, looked up by name now (see
 * the file header); reviewers_too: the scope's reviewers pass too (verify,
 * lookup: a person looks a record up and says what the target system has).
 */
static void
check_role(const IdempoScope *scope, const char *key, Oid user, bool reviewers_too)
{
	Oid			role;

	if (scope->allowed_role_name == NULL)
		return;
	if (reviewers_too && idempo_scope_may_review(scope, user))
		return;
	role = get_role_oid(scope->allowed_role_name, true);
	if (!OidIsValid(role))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("allowed_role \"%s\" of scope \"%s\" does not exist",
						scope->allowed_role_name, scope->name),
				 errhint("Recreate the role or change the scope with idempo.alter_scope('%s', allowed_role => ...).",
						 scope->name)));
	if (!is_member_of_role(user, role))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" may not use scope \"%s\" (key \"%s\")",
						GetUserNameFromId(user, false), scope->name, key),
				 scope->review_role_name && reviewers_too ?
				 errhint("Only members of role \"%s\" and the scope's reviewers (role \"%s\") may look up, verify or put in review keys in this scope.",
						 scope->allowed_role_name, scope->review_role_name) :
				 errhint("Only members of role \"%s\" may claim, complete, fail, verify or look up keys in this scope.",
						 scope->allowed_role_name)));
}

static void
refuse_disabled(const IdempoScope *scope, const char *key)
{
	if (!scope->enabled)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("scope \"%s\" is disabled (key \"%s\"); its owner is %s",
						scope->name, key, scope->owner ? scope->owner : "not recorded"),
				 errhint("An old copy of a flow may still be running. Ask the scope's owner before enabling it again with idempo.enable_scope('%s').",
						 scope->name)));
}

/*
 * Refuses use of a disabled scope, or by a role outside allowed_role.
 * user is the caller's identity (not the owner we run SPI as).
 */
void
idempo_scope_check_use(const IdempoScope *scope, const char *key, Oid user)
{
	refuse_disabled(scope, key);
	check_role(scope, key, user, false);
}

/*
 * verify(): as idempo_scope_check_use(), and the scope's reviewers pass too:
 * a person who looked the action up in the target system records it.
 */
void
idempo_scope_check_verify(const IdempoScope *scope, const char *key, Oid user)
{
	refuse_disabled(scope, key);
	check_role(scope, key, user, true);
}

/*
 * Refuses a read of the scope's records (lookup) by a role outside
 * allowed_role: one application must not read another's stored results
 * either.  A disabled scope can still be read.
 */
void
idempo_scope_check_read(const IdempoScope *scope, const char *key, Oid user)
{
	check_role(scope, key, user, true);
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
