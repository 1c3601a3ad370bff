-- Anatomy step 4 (test/bench/anatomy): step 3 with the whole row the one-call form stores (status,
-- attempt, the times leases and retention need), in a copy of idempo.operations without the sweep_at
-- index.
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
INSERT INTO record_noidx (scope, key, fingerprint, status, attempt, first_seen_at, last_attempt_at,
                          completed_at, expires_at, sweep_at)
VALUES ('bench', 'k' || :k, sha256(convert_to(jsonb_build_object('sku', 'A-7', 'qty', :q::int)::text, 'UTF8')),
        'succeeded', 1, now(), now(), now(), now() + interval '7 days', now() + interval '7 days')
ON CONFLICT DO NOTHING RETURNING true;
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
END;
