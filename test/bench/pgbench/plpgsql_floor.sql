-- test/bench/managed_ladder's floor (managed_floor.sql; test/bench/run's is floor.sql): the
-- least a PL/pgSQL claim of a new key does, in idempo_one_call's transaction.
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
SELECT bench_floor('bench', 'f' || :k, jsonb_build_object('sku', 'A-7', 'qty', :q::int));
INSERT INTO shipments (order_ref, sku, qty) VALUES ('f' || :k, 'A-7', :q);
END;
