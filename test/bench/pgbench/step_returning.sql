-- Anatomy step 2 (test/bench/anatomy): the floor's bare dedup insert, answering the client as a claim
-- does (a row: was the key new?).
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
INSERT INTO dedup (scope, key) VALUES ('bench', 'k' || :k) ON CONFLICT DO NOTHING RETURNING true;
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
END;
