-- test/bench/managed_ladder's floor with the attempt's note (managed_floor.sql), in
-- idempo_one_call's transaction.
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
SELECT bench_floor('bench', 'n' || :k, jsonb_build_object('sku', 'A-7', 'qty', :q::int), p_note => true);
INSERT INTO shipments (order_ref, sku, qty) VALUES ('n' || :k, 'A-7', :q);
END;
