-- plain_sql.sql answering the client as idempo's two calls do (a row each): test/bench/anatomy.
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
INSERT INTO plain_ops (scope, key, fingerprint)
VALUES ('bench', 'k' || :k, sha256(convert_to(jsonb_build_object('sku', 'A-7', 'qty', :q::int)::text, 'UTF8')))
ON CONFLICT DO NOTHING RETURNING true;
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
UPDATE plain_ops SET status = 'succeeded', result = '{"shipment_id": 17}', target_ref = 'SHP-' || :k,
                     completed_at = now()
WHERE scope = 'bench' AND key = 'k' || :k RETURNING true;
END;
