-- idempo, two-call form: claim (with params), the business write, complete (result, target_ref).
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
SELECT (idempo.claim('bench', 'k' || :k, params => jsonb_build_object('sku', 'A-7', 'qty', :q::int))).outcome;
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
SELECT idempo.complete('bench', 'k' || :k, result => '{"shipment_id": 17}', target_ref => 'SHP-' || :k);
END;
