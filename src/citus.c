/*-------------------------------------------------------------------------
 *
 * citus.c
 *	  idempo on a Citus cluster: the one place that knows about Citus.
 *
 * Supported layout (docs/scale-out.md): idempo.scopes is a
 * reference table; idempo.operations, reviews, conflicts and events are
 * distributed by "key" and co-located with each other (and with the
 * business tables, distributed by the idempotency key); claim, complete,
 * fail, verify and lookup are distributed functions on their "key"
 * argument, so a call runs on the node that holds the key's shard.
 *
 * The claim path needs nothing from here: its statements all name one key
 * and Citus routes them to that key's shard (on the coordinator over a
 * connection, on the shard's node by local execution).  What is node-local
 * -- the attempts this transaction acquired (txn_attempts.c), the unique
 * index wait between two claims of one key, the conflict recorder worker,
 * the shared counters -- stays correct because every call for a key lands
 * on one node: the node of the key's shard, or the coordinator when the
 * function is not delegated.
 *
 * The sweep is different: its statements range over all due rows, and
 * Citus supports neither FOR UPDATE SKIP LOCKED across shards nor joins of
 * a distributed table with unnest().  So on a Citus node the sweep works
 * shard by shard on the placements of idempo.operations that this node
 * holds, with plain SQL on the shard relations (operations_<shardid> and
 * the co-located reviews_<shardid>): the same statements as plans.c's
 * PLAN_SWEEP_*, the same row locks as the claims on that shard.  Every
 * node runs its own idempo sweeper (the launcher starts one per database
 * with the extension, coordinator and workers alike), so each node sweeps
 * its own shards and nothing crosses the network; the coordinator, which
 * holds no shard of operations, finds nothing to do.  Events of audited
 * scopes go through the distributed idempo.events table, which Citus
 * routes to the co-located, local shard.
 *
 * Shard placements must be single (citus.shard_replication_factor = 1):
 * a node sweeping its copy directly would let copies drift apart, so the
 * sweep refuses to run otherwise.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "citus.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "op_row.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"


/*
 * True when the citus extension is installed in this database and
 * idempo.operations is one of its distributed tables.  Call inside SPI.
 * First waits for a create_distributed_table() of idempo.operations in
 * progress (it holds ExclusiveLock; we take the RowShareLock the sweep's
 * FOR UPDATE takes anyway), then reads with a fresh snapshot (not
 * read-only): Citus plans with its current metadata, so a sweep must not go
 * on believing the tables are local once the layout committed.
 */
bool
idempo_citus_distributed(void)
{
	int			rc;

	if (!OidIsValid(get_extension_oid("citus", true)))
		return false;
	LockRelationOid(idempo_catalog()->operations_relid, RowShareLock);
	rc = SPI_execute("SELECT FROM pg_catalog.pg_dist_partition "
					 "WHERE logicalrelid OPERATOR(pg_catalog.=) 'idempo.operations'::pg_catalog.regclass "
					 "AND partmethod OPERATOR(pg_catalog.=) 'h'",
					 false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading pg_dist_partition failed: %s", SPI_result_code_string(rc));
	return SPI_processed == 1;
}

/*
 * The shard placements of idempo.operations on this node (a List of
 * IdempoCitusShard), each with its co-located reviews shard.  Call inside
 * SPI; the list lives in the caller's memory context.
 */
List *
idempo_citus_local_shards(void)
{
	MemoryContext cxt = CurrentMemoryContext;
	List	   *shards = NIL;
	int			rc;
	uint64		i;
	bool		isnull;

	rc = SPI_execute("SELECT (SELECT o.colocationid FROM pg_catalog.pg_dist_partition o "
					 "        WHERE o.logicalrelid OPERATOR(pg_catalog.=) 'idempo.operations'::pg_catalog.regclass) "
					 "       IS NOT DISTINCT FROM "
					 "       (SELECT r.colocationid FROM pg_catalog.pg_dist_partition r "
					 "        WHERE r.logicalrelid OPERATOR(pg_catalog.=) 'idempo.reviews'::pg_catalog.regclass)",
					 false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "reading pg_dist_partition failed: %s", SPI_result_code_string(rc));
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idempo.reviews is not co-located with idempo.operations"),
				 errdetail("The sweep opens the review of an operation on the node that holds the operation's shard."),
				 errhint("Distribute it by key with the operations: SELECT create_distributed_table('idempo.reviews', 'key', colocate_with => 'idempo.operations');")));

	rc = SPI_execute("SELECT s.shardid FROM pg_catalog.pg_dist_shard s "
					 "JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid "
					 "WHERE s.logicalrelid OPERATOR(pg_catalog.=) 'idempo.operations'::pg_catalog.regclass "
					 "GROUP BY s.shardid HAVING pg_catalog.count(*) OPERATOR(pg_catalog.>) 1",
					 false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading pg_dist_placement failed: %s", SPI_result_code_string(rc));
	if (SPI_processed > 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("shard %s of idempo.operations has more than one placement",
						SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1)),
				 errdetail("Each node sweeps its own placements directly, which would let the copies drift apart."),
				 errhint("Distribute idempo's tables with citus.shard_replication_factor = 1 (the default); use streaming replicas for high availability.")));

	rc = SPI_execute("SELECT s.shardid, "
					 "  pg_catalog.format('idempo.%I', pg_catalog.concat('operations_', s.shardid)), "
					 "  (SELECT pg_catalog.format('idempo.%I', pg_catalog.concat('reviews_', r.shardid)) "
					 "     FROM pg_catalog.pg_dist_shard r "
					 "    WHERE r.logicalrelid OPERATOR(pg_catalog.=) 'idempo.reviews'::pg_catalog.regclass "
					 "      AND r.shardminvalue OPERATOR(pg_catalog.=) s.shardminvalue) "
					 "FROM pg_catalog.pg_dist_shard s "
					 "JOIN pg_catalog.pg_dist_placement p ON p.shardid OPERATOR(pg_catalog.=) s.shardid "
					 "WHERE s.logicalrelid OPERATOR(pg_catalog.=) 'idempo.operations'::pg_catalog.regclass "
					 "  AND p.groupid OPERATOR(pg_catalog.=) (SELECT groupid FROM pg_catalog.pg_dist_local_group) "
					 "  AND pg_catalog.to_regclass(pg_catalog.format('idempo.%I', "
					 "        pg_catalog.concat('operations_', s.shardid))) IS NOT NULL "
					 "ORDER BY s.shardid",
					 false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "reading pg_dist_shard failed: %s", SPI_result_code_string(rc));

	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		MemoryContext old = MemoryContextSwitchTo(cxt);
		IdempoCitusShard *shard = palloc(sizeof(IdempoCitusShard));

		shard->shard_id = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
		shard->operations = SPI_getvalue(tuple, desc, 2);
		shard->reviews = SPI_getvalue(tuple, desc, 3);
		if (shard->reviews == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("shard %lld of idempo.operations has no co-located shard of idempo.reviews",
							(long long) shard->shard_id),
					 errhint("Distribute idempo.reviews by key with colocate_with => 'idempo.operations'.")));
		shards = lappend(shards, shard);
		MemoryContextSwitchTo(old);
	}
	return shards;
}

/*
 * Runs one of the sweep's statements (PLAN_SWEEP_*, see plans.c) on a local
 * shard placement instead of on idempo's tables; returns SPI_processed.
 * The reviews shard carries no sequence default (Citus creates shards
 * without them), so the review id is drawn here, from this node's range of
 * idempo.reviews_id_seq.
 */
int
idempo_citus_sweep_execute(const IdempoCitusShard *shard, IdempoPlanId id, Datum *args)
{
	char	   *sql;
	Oid			types[FUNC_MAX_ARGS];
	int			nargs;
	int			rc;

	/* the statements of plans.c, on this shard's relations, with the same parameters */
	switch (id)
	{
		case PLAN_SWEEP_DUE:
			sql = psprintf("SELECT " SWEEP_DUE_COLUMNS " FROM %s " SWEEP_DUE_WHERE,
						   shard->operations);
			break;
		case PLAN_SWEEP_PURGE:
			sql = psprintf("DELETE FROM %s o " SWEEP_PURGE_WHERE, shard->operations);
			break;
		case PLAN_SWEEP_SHRINK:
			sql = psprintf("UPDATE %s o " SWEEP_SHRINK_REST, shard->operations);
			break;
		case PLAN_SWEEP_REVIEW:
		case PLAN_SWEEP_REVIEW_SAFE:
			sql = psprintf("INSERT INTO %s (id, scope, key, reason, opened_at, operation, detail) "
						   "SELECT pg_catalog.nextval('idempo.reviews_id_seq'), o.scope, o.key, "
						   "'retention_expired', $2, ROW(o.*)::idempo.operations, %s "
						   "FROM %s o " SWEEP_REVIEW_WHERE "%s",
						   shard->reviews, SWEEP_REVIEW_DETAIL, shard->operations,
						   id == PLAN_SWEEP_REVIEW_SAFE ? " " SWEEP_REVIEW_ON_CONFLICT : "");
			break;
		case PLAN_SWEEP_TO_REVIEW:
			sql = psprintf("UPDATE %s o " SWEEP_TO_REVIEW_REST, shard->operations);
			break;
		case PLAN_SWEEP_SET:
			sql = psprintf("UPDATE %s o " SWEEP_SET_REST, shard->operations);
			break;
		default:
			elog(ERROR, "statement %d is not a sweep statement", (int) id);
	}
	nargs = idempo_plan_arg_types(id, types);
	rc = SPI_execute_with_args(sql, nargs, types, args, NULL, false, 0);
	if (rc < 0)
		elog(ERROR, "sweeping shard %lld failed for \"%s\": %s", (long long) shard->shard_id, sql,
			 SPI_result_code_string(rc));
	pfree(sql);
	return (int) SPI_processed;
}
