/*-------------------------------------------------------------------------
 *
 * catalog.c
 *	  OIDs of idempo's own objects in the current database, looked up once
 *	  and kept until a relcache invalidation says they may have changed.
 *
 * The hot path must not look objects up by name on every call.  We cache
 * the OIDs (schema, tables, enum labels, owner) and drop the cache when an
 * invalidation names one of our tables (DROP/CREATE EXTENSION, ALTER TABLE
 * ... OWNER, and the statement trigger on idempo.scopes) or when the
 * invalidation queue overflowed.  The callback only sets a flag.
 *
 * This file is the bottom of idempo's own lookups: it calls nothing of
 * replication.c, plans.c or scope_cache.c, which all build on it.  It owns
 * idempo's one relcache callback (PostgreSQL has room for only ten in a
 * backend, and Citus takes most of them): the scope cache, the direct
 * writes' layout and the replication check watch through
 * idempo_catalog_watch_relcache().
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_class.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

const char *const idempo_status_names[NUM_STATUSES] = {
	"in_progress", "succeeded", "failed", "retryable", "unknown", "in_review"
};

const char *const idempo_outcome_names[NUM_OUTCOMES] = {
	"acquired", "replay", "busy", "conflict", "unknown", "in_review", "stale", "expired"
};

/* What an operation in this status is, for messages: "cannot complete ...: <phrase>". */
const char *
idempo_status_phrase(IdempoStatus s)
{
	static const char *const phrases[NUM_STATUSES] = {
		"it is in progress", "it has already succeeded", "it has already failed",
		"it is retryable", "its outcome is unknown", "it is in review"
	};

	Assert(s >= 0 && s < NUM_STATUSES);
	return phrases[s];
}

/*
 * The versions of idempo's SQL objects (pg_extension.extversion) this
 * library works with.  One library serves every database of the server, and
 * a database keeps its version until ALTER EXTENSION idempo UPDATE: a
 * version drops out of this list when a later schema change makes the C
 * code depend on objects that version does not have.
 */
static const char *const supported_versions[] = {"0.1.0", "0.2.0", "0.3.0", "1.0.0", "1.0.1"};

static IdempoCatalog catalog;
static bool catalog_valid = false;

/* What else watches the relcache through our callback (scope cache, direct writes, replication). */
static idempo_relcache_watcher relcache_watchers[4];
static int	nrelcache_watchers = 0;

/* Relcache invalidation: one of our tables changed, or everything did. */
static void
idempo_relcache_callback(Datum arg, Oid relid)
{
	int			i;

	for (i = 0; i < nrelcache_watchers; i++)
		relcache_watchers[i] (relid);
	if (!catalog_valid)
		return;
	if (relid == InvalidOid || relid == catalog.scopes_relid ||
		relid == catalog.operations_relid)
		catalog_valid = false;
}

void
idempo_catalog_register_callbacks(void)
{
	CacheRegisterRelcacheCallback(idempo_relcache_callback, (Datum) 0);
}

/* Calls watcher(relid) on every relcache invalidation, from our one callback (see the header). */
void
idempo_catalog_watch_relcache(idempo_relcache_watcher watcher)
{
	if (nrelcache_watchers >= lengthof(relcache_watchers))
		elog(FATAL, "too many idempo relcache watchers");
	relcache_watchers[nrelcache_watchers++] = watcher;
}

/*
 * OID of one label of one of our enums; the extension script must be intact.
 * missing_ok: a label that older versions' objects do not have.
 */
static Oid
enum_label_oid(Oid typid, const char *label, bool missing_ok)
{
	Oid			oid;

	oid = GetSysCacheOid2(ENUMTYPOIDNAME, Anum_pg_enum_oid,
						  ObjectIdGetDatum(typid), CStringGetDatum(label));
	if (!OidIsValid(oid) && !missing_ok)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("label \"%s\" of an idempo enum type is missing", label),
				 errhint("Reinstall the extension: DROP EXTENSION idempo; CREATE EXTENSION idempo;")));
	return oid;
}

static Oid
relation_oid(const char *name, Oid nsp)
{
	Oid			relid = get_relname_relid(name, nsp);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("table idempo.%s does not exist", name),
				 errhint("Is the idempo extension installed in this database? CREATE EXTENSION idempo;")));
	return relid;
}

static Oid
type_oid(const char *name, Oid nsp)
{
	Oid			typid;

	typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
							CStringGetDatum(name), ObjectIdGetDatum(nsp));
	if (!OidIsValid(typid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("type idempo.%s does not exist", name),
				 errhint("Is the idempo extension installed in this database? CREATE EXTENSION idempo;")));
	return typid;
}

/* pg_extension.extversion of idempo in this database. */
static char *
installed_version(void)
{
	Oid			ext = get_extension_oid("idempo", true);
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *version = NULL;

	if (!OidIsValid(ext))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("extension \"idempo\" is not installed in this database"),
				 errhint("Install the extension in this database: CREATE EXTENSION idempo;")));
	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(ext));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * Refuses to run against SQL objects of a version this library does not
 * know; returns the version's position in supported_versions.
 */
static int
check_version(void)
{
	char	   *version = installed_version();
	int			i;

	for (i = 0; i < lengthof(supported_versions); i++)
		if (version != NULL && strcmp(version, supported_versions[i]) == 0)
			return i;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("the idempo library does not support version %s of the extension installed in this database",
					version ? version : "(none)"),
			 errdetail("This library supports versions %s to %s.", supported_versions[0],
					   supported_versions[lengthof(supported_versions) - 1]),
			 errhint("If that version is older, run ALTER EXTENSION idempo UPDATE in this database; if it is newer, install the idempo library of that version.")));
	return -1;
}

/* The cached OIDs, looked up again if an invalidation arrived since. */
const IdempoCatalog *
idempo_catalog(void)
{
	IdempoCatalog fresh;
	HeapTuple	tuple;
	int			i;

	if (likely(catalog_valid))
		return &catalog;

	fresh.namespace_oid = get_namespace_oid("idempo", true);
	if (!OidIsValid(fresh.namespace_oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_SCHEMA),
				 errmsg("schema \"idempo\" does not exist"),
				 errhint("Install the extension in this database: CREATE EXTENSION idempo;")));
	check_version();
	fresh.scopes_relid = relation_oid("scopes", fresh.namespace_oid);
	fresh.operations_relid = relation_oid("operations", fresh.namespace_oid);

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(fresh.operations_relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", fresh.operations_relid);
	fresh.owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);

	fresh.scope_rules = get_attnum(fresh.scopes_relid, "durability") != InvalidAttrNumber &&
		get_attnum(fresh.scopes_relid, "remember") != InvalidAttrNumber &&
		get_attnum(fresh.scopes_relid, "fingerprint_ignore") != InvalidAttrNumber;

	fresh.status_typid = type_oid("status", fresh.namespace_oid);
	fresh.outcome_typid = type_oid("outcome", fresh.namespace_oid);
	for (i = 0; i < NUM_STATUSES; i++)
		fresh.status_label[i] = enum_label_oid(fresh.status_typid, idempo_status_names[i], false);
	/* 'expired' came with 0.3.0 (remembered keys, which older objects cannot configure) */
	for (i = 0; i < NUM_OUTCOMES; i++)
		fresh.outcome_label[i] = enum_label_oid(fresh.outcome_typid, idempo_outcome_names[i],
												i == OUTCOME_EXPIRED && !fresh.scope_rules);

	catalog = fresh;
	catalog_valid = true;
	return &catalog;
}

/* idempo.status value (an enum label OID) to the C enum. */
IdempoStatus
idempo_status_from_datum(Datum d)
{
	const IdempoCatalog *cat = idempo_catalog();
	Oid			label = DatumGetObjectId(d);
	int			i;

	for (i = 0; i < NUM_STATUSES; i++)
		if (cat->status_label[i] == label)
			return (IdempoStatus) i;
	elog(ERROR, "unrecognized idempo.status label OID %u", label);
	pg_unreachable();
}

Datum
idempo_status_datum(IdempoStatus s)
{
	Assert(s >= 0 && s < NUM_STATUSES);
	return ObjectIdGetDatum(idempo_catalog()->status_label[s]);
}

Datum
idempo_outcome_datum(IdempoOutcome o)
{
	Oid			label;

	Assert(o >= 0 && o < NUM_OUTCOMES);
	label = idempo_catalog()->outcome_label[o];
	if (!OidIsValid(label))
		elog(ERROR, "outcome \"%s\" needs the objects of idempo 0.3.0", idempo_outcome_names[o]);
	return ObjectIdGetDatum(label);
}
