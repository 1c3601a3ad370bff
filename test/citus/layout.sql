-- idempo on Citus: the supported layout (docs/scale-out.md).
-- Run once on the coordinator, as a superuser, after CREATE EXTENSION citus on every node,
-- citus_set_coordinator_host() and citus_add_node() of the workers, and CREATE EXTENSION idempo
-- on the coordinator (Citus creates it on every node), before the first scope is created.
\set ON_ERROR_STOP on

-- Ids of reviews, conflicts and events are drawn on the node that writes the row: give every node
-- its own range (group id << 48, as Citus does for the sequences of tables it creates itself),
-- so that an id names one row in the whole cluster.  Never moves a sequence back: run it again
-- after citus_add_node() of a new worker.
SELECT nodeid, success, result FROM run_command_on_all_nodes($cmd$
    SELECT pg_catalog.string_agg(pg_catalog.setval(pg_catalog.format('idempo.%I', s.sequencename)::regclass,
               GREATEST((g.groupid::bigint << 48) + 1, COALESCE(s.last_value + 1, 1)), false)::text,
               ',' ORDER BY s.sequencename)
    FROM pg_catalog.pg_dist_local_group g, pg_catalog.pg_sequences s
    WHERE s.schemaname = 'idempo' AND s.sequencename IN ('conflicts_id_seq', 'reviews_id_seq', 'events_id_seq')
$cmd$) ORDER BY nodeid;

-- The rest in one transaction: the sweepers never see a half-distributed schema.
BEGIN;

-- Scopes are read by every claim on every node and change rarely: a reference table, with a
-- copy on every node.  Its statement trigger (which drops the backends' cached scopes) comes
-- along to every copy; Citus asks for enable_unsafe_triggers to allow that.
SET citus.enable_unsafe_triggers = on;
SELECT create_reference_table('idempo.scopes');
RESET citus.enable_unsafe_triggers;

-- The per-key tables: distributed by key, all in one co-location group, so that an operation,
-- its reviews, conflicts and events live in the same shard (every unique constraint of these
-- tables includes key: sql/schema_rules.sql checks it).
SELECT create_distributed_table('idempo.operations', 'key');
SELECT create_distributed_table('idempo.reviews', 'key', colocate_with => 'idempo.operations');
SELECT create_distributed_table('idempo.conflicts', 'key', colocate_with => 'idempo.operations');
SELECT create_distributed_table('idempo.events', 'key', colocate_with => 'idempo.operations');

-- The calls that name one key run on the node that holds the key's shard, in the caller's
-- transaction (force_delegation: also inside BEGIN ... COMMIT).  Every call of a transaction for
-- one key then lands in the same backend of that node, which is what complete(attempt => NULL)
-- and the unique-index wait between two claims of one key rely on.
SELECT create_distributed_function('idempo.claim(text,text,jsonb,bytea,text,timestamptz,boolean,boolean,interval,boolean)',
                                   'key', colocate_with => 'idempo.operations', force_delegation => true);
SELECT create_distributed_function('idempo.complete(text,text,integer,jsonb,text)',
                                   'key', colocate_with => 'idempo.operations', force_delegation => true);
SELECT create_distributed_function('idempo.fail(text,text,integer,text,boolean)',
                                   'key', colocate_with => 'idempo.operations', force_delegation => true);
SELECT create_distributed_function('idempo.heartbeat(text,text,integer,interval)',
                                   'key', colocate_with => 'idempo.operations', force_delegation => true);
SELECT create_distributed_function('idempo.verify(text,text,integer,boolean,text,jsonb)',
                                   'key', colocate_with => 'idempo.operations', force_delegation => true);
SELECT create_distributed_function('idempo.lookup(text,text)',
                                   'key', colocate_with => 'idempo.operations', force_delegation => true);

COMMIT;

-- Your business tables: distributed by the idempotency key (the same text you pass as key),
-- co-located with idempo.operations, so that the claim and the business write of one key are
-- on one shard and commit on one node.  For example:
--   CREATE TABLE shipments (order_key text PRIMARY KEY, sku text NOT NULL, qty int NOT NULL);
--   SELECT create_distributed_table('shipments', 'order_key', colocate_with => 'idempo.operations');
