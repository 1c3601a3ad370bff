-- Anatomy step 3 (test/bench/anatomy): step 2 plus the request's fingerprint, computed from its params
-- in SQL and stored beside the key.
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
INSERT INTO dedup_fp (scope, key, fingerprint)
VALUES ('bench', 'k' || :k, sha256(convert_to(jsonb_build_object('sku', 'A-7', 'qty', :q::int)::text, 'UTF8')))
ON CONFLICT DO NOTHING RETURNING true;
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
END;
