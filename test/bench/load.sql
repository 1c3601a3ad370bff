-- Replaces idempo.operations with :n valid operations of scope :'scope', fast: TRUNCATE and INSERT in
-- one transaction (with wal_level = minimal the rows are not WAL-logged), then VACUUM ANALYZE.
-- :'status' = 'succeeded' (completed now, expire after :'ttl') or 'unknown' (review due after :'ttl').
-- Keys 'k' || 15 digits, evenly spread over the key space the pgbench scripts draw from, in
-- ascending order (so the indexes are built by appending, as dense as CREATE INDEX would make them).
BEGIN;
TRUNCATE idempo.operations;
INSERT INTO idempo.operations (scope, key, fingerprint, status, attempt, first_seen_at, last_attempt_at,
                               completed_at, expires_at, sweep_at, result, target_ref)
SELECT :'scope', 'k' || (100000000000000 + i * (900000000000000 / :n)), c.fp, c.status, 1, t, t,
       CASE WHEN c.done THEN t END, CASE WHEN c.done THEN t + c.ttl END, t + c.ttl,
       CASE WHEN c.done THEN '{"shipment_id": 17}'::jsonb END, CASE WHEN c.done THEN 'SHP-' || i END
FROM (SELECT :'status'::idempo.status AS status, :'status' = 'succeeded' AS done,
             :'ttl'::interval AS ttl, sha256('bench'::bytea) AS fp) c,
     generate_series(0, :n - 1) i,
     LATERAL (SELECT now() - (:n - 1 - i) * interval '1 microsecond' AS t) t;
COMMIT;
VACUUM ANALYZE idempo.operations;
