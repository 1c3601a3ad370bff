/*-------------------------------------------------------------------------
 *
 * replication.c
 *	  Logical replication: a database that receives idempo's tables from a
 *	  publisher writes none of their rows itself.
 *
 * The rule.  When idempo.operations, idempo.reviews, idempo.conflicts or
 * idempo.events of this database is in a subscription (a row in
 * pg_subscription_rel, in any state, the subscription enabled or not), the
 * publisher owns idempo's records here.  A row written locally would change
 * a replicated row behind the publisher's back, or take a key or an id that
 * the publisher sends later; the apply worker then fails on it, again and
 * again.  So in such a database:
 *	 - the sweeper does not sweep (sweeper.c; idempo.workers() shows
 *	   'subscriber'), and idempo.sweep() refuses;
 *	 - a claim is answered as in a read-only transaction (claim.c): the
 *	   answers that need no write (a replay, busy, unknown, in_review) come
 *	   from the replicated rows, without a row lock or an audit event, and
 *	   a claim that must write is refused, saying why;
 *	 - every other statement that would write a record refuses, before it
 *	   runs: the kept statements of plans.c that write, the new-key
 *	   insertion of op_row.c, the conflict recorder, and resolve_conflict()
 *	   (through refuse_on_subscriber()); lookup() and the views work.
 * Likewise, when idempo.scopes is in a subscription, the scopes are the
 * publisher's: create_scope() and the other changes refuse (the statement
 * trigger on idempo.scopes, scope_cache.c), and each call reads its scope
 * afresh, since the apply worker's changes fire no statement trigger that
 * would drop the cached copies.
 *
 * alter_scope() changing retention or remember, which reschedules the
 * scope's records, refuses too (through idempo.refuse_on_subscriber()).
 *
 * Whether this holds is cached per backend and looked up again when
 * pg_subscription_rel changes (a syscache invalidation) or one of idempo's
 * tables does (DROP/CREATE EXTENSION).  The write check on every statement
 * is then one test of a cached flag.
 *
 * Dependencies: this file uses catalog.c only; plans.c and scope_cache.c
 * build on it.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_subscription.h"
#include "catalog/pg_subscription_rel.h"
#include "commands/dbcommands.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

PG_FUNCTION_INFO_V1(idempo_refuse_on_subscriber_sql);

/* the tables that hold records (the publisher owns them all, or none) */
static const char *const record_tables[] = {"operations", "reviews", "conflicts", "events"};

#define NUM_WATCHED (lengthof(record_tables) + 1)	/* and scopes */

static bool cache_valid = false;
static bool callbacks_registered = false;
static Oid	watched[NUM_WATCHED];	/* the relids the cache was computed for */
static char *records_subscription = NULL;	/* in TopMemoryContext; NULL: none */
static char *scopes_subscription = NULL;

static void
subscription_rel_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	cache_valid = false;
}

static void
relation_changed(Oid relid)
{
	int			i;

	if (!cache_valid)
		return;
	for (i = 0; i < NUM_WATCHED; i++)
		if (relid == InvalidOid || relid == watched[i])
			cache_valid = false;
}

/* The name of a subscription that has relid among its tables, or NULL. */
static char *
subscription_of(Oid relid)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			subid = InvalidOid;
	char	   *name = NULL;

	if (!OidIsValid(relid))
		return NULL;
	rel = table_open(SubscriptionRelRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_subscription_rel_srrelid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, SubscriptionRelSrrelidSrsubidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		subid = ((Form_pg_subscription_rel) GETSTRUCT(tuple))->srsubid;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (OidIsValid(subid))
		name = get_subscription_name(subid, true);
	if (OidIsValid(subid) && name == NULL)
		name = psprintf("%u", subid);
	return name;
}

static void
refresh(void)
{
	const IdempoCatalog *cat = idempo_catalog();
	char	   *sub = NULL;
	int			i;

	if (!callbacks_registered)
	{
		CacheRegisterSyscacheCallback(SUBSCRIPTIONRELMAP, subscription_rel_changed, (Datum) 0);
		idempo_catalog_watch_relcache(relation_changed);	/* catalog.c's one callback */
		callbacks_registered = true;
	}
	for (i = 0; i < lengthof(record_tables); i++)
	{
		watched[i] = get_relname_relid(record_tables[i], cat->namespace_oid);
		if (sub == NULL)
			sub = subscription_of(watched[i]);
	}
	watched[NUM_WATCHED - 1] = cat->scopes_relid;

	if (records_subscription)
		pfree(records_subscription);
	if (scopes_subscription)
		pfree(scopes_subscription);
	records_subscription = sub ? MemoryContextStrdup(TopMemoryContext, sub) : NULL;
	sub = subscription_of(cat->scopes_relid);
	scopes_subscription = sub ? MemoryContextStrdup(TopMemoryContext, sub) : NULL;
	cache_valid = true;
}

/*
 * The subscription this database receives idempo's records (operations,
 * reviews, conflicts, events) from, or NULL if it writes its own.
 */
const char *
idempo_records_subscription(void)
{
	if (unlikely(!cache_valid))
		refresh();
	return records_subscription;
}

/* The subscription this database receives idempo.scopes from, or NULL. */
const char *
idempo_scopes_subscription(void)
{
	if (unlikely(!cache_valid))
		refresh();
	return scopes_subscription;
}

/*
 * Refuses a write to the record of (scope, key) if the records are the
 * publisher's.  key may be NULL: scope NULL too, a batch of the sweep;
 * scope given, alter_scope() rescheduling the scope's records (a change of
 * retention or remember).  why, if given, says why a claim must write.
 */
void
idempo_refuse_on_subscriber(const char *scope, const char *key, const char *why)
{
	const char *sub = idempo_records_subscription();

	if (likely(sub == NULL))
		return;
	if (key == NULL && scope != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot reschedule the records of scope \"%s\": database \"%s\" receives idempo's records from subscription \"%s\"",
						scope, get_database_name(MyDatabaseId), sub),
				 errdetail("A change of retention or remember rewrites when the scope's records are swept, and only the publisher writes idempo's records; a row written here would collide with the rows it sends, and their replication would stop."),
				 errhint("Change retention and remember on the publisher: its alter_scope() reschedules the records, and they arrive here by replication. Publish idempo.scopes too to keep this database's scopes the same as the publisher's.")));
	ereport(ERROR,
			(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
			 key ?
			 errmsg("cannot write the record of key \"%s\" in scope \"%s\": database \"%s\" receives idempo's records from subscription \"%s\"",
					key, scope, get_database_name(MyDatabaseId), sub) :
			 errmsg("cannot write idempo's records: database \"%s\" receives them from subscription \"%s\"",
					get_database_name(MyDatabaseId), sub),
			 errdetail("%s%sOnly the publisher writes idempo's records; a row written here would collide with the rows it sends, and their replication would stop.",
					   why ? "The claim must write: " : "", why ? psprintf("%s. ", why) : ""),
			 errhint("Run claims that must write (a new key, an expired lease, a review, a conflict, an audit event), complete, fail, verify, resolve and resolve_conflict on the publisher. Here, lookup(), the views and claims answered from the replicated rows (replay, busy, unknown, in_review) work.")));
}

/* The sweep of a database whose records are the publisher's. */
void
idempo_refuse_sweep_on_subscriber(void)
{
	const char *sub = idempo_records_subscription();

	if (likely(sub == NULL))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
			 errmsg("idempo.sweep() cannot run in database \"%s\": it receives idempo's records from subscription \"%s\"",
					get_database_name(MyDatabaseId), sub),
			 errdetail("The publisher sweeps, and its changes arrive here by replication; rows changed here would make them fail to apply."),
			 errhint("Run idempo.sweep() on the publisher. To sweep here, stop receiving idempo's tables first (DROP SUBSCRIPTION, or remove them from the publication and ALTER SUBSCRIPTION ... REFRESH PUBLICATION).")));
}

/* A change of idempo.scopes where the scopes are the publisher's (the apply worker excepted). */
void
idempo_refuse_scope_change_on_subscriber(void)
{
	const char *sub;

	if (SessionReplicationRole == SESSION_REPLICATION_ROLE_REPLICA)
		return;
	sub = idempo_scopes_subscription();
	if (likely(sub == NULL))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
			 errmsg("cannot change idempo.scopes in database \"%s\": it receives the scopes from subscription \"%s\"",
					get_database_name(MyDatabaseId), sub),
			 errdetail("A scope changed here would collide with the publisher's, and replication would stop."),
			 errhint("Create, alter, disable and enable scopes on the publisher.")));
}

/*
 * idempo.refuse_on_subscriber(scope text, key text) RETURNS void: the write
 * check for SQL functions (resolve_conflict; alter_scope with key NULL).
 */
Datum
idempo_refuse_on_subscriber_sql(PG_FUNCTION_ARGS)
{
	idempo_refuse_on_subscriber(PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0)),
								PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1)), NULL);
	PG_RETURN_VOID();
}
