-- Anatomy step 5 (test/bench/anatomy): step 4 in a copy of idempo.operations with its sweep_at index:
-- the very record and indexes the one-call form writes, as one bare statement.
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
INSERT INTO record_copy (scope, key, fingerprint, status, attempt, first_seen_at, last_attempt_at,
                         completed_at, expires_at, sweep_at)
VALUES ('bench', 'k' || :k, sha256(convert_to(jsonb_build_object('sku', 'A-7', 'qty', :q::int)::text, 'UTF8')),
        'succeeded', 1, now(), now(), now(), now() + interval '7 days', now() + interval '7 days')
ON CONFLICT DO NOTHING RETURNING true;
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
END;
