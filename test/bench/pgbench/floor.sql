-- Floor: the business transaction plus a bare dedup insert (no fingerprint, no result).
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
INSERT INTO dedup (scope, key) VALUES ('bench', 'k' || :k) ON CONFLICT DO NOTHING;
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
END;
