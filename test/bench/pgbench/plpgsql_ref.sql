-- Reference: the protection hand-written in PL/pgSQL (ref_claim, ref_complete in ../setup.sql).
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
SELECT ref_claim('bench', 'k' || :k, jsonb_build_object('sku', 'A-7', 'qty', :q::int));
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
SELECT ref_complete('bench', 'k' || :k, '{"shipment_id": 17}', 'SHP-' || :k);
END;
