-- The review console's benchmark data (test/bench/console): :n operations over four scopes, of
-- which :reviews in review (each with its open review and three audit events), :unknown unknown
-- and :conflicts succeeded with an open conflict; the rest succeeded.  Written directly, in one
-- transaction, as rows idempo itself writes (check_consistency() is asked afterwards): the
-- benchmark measures reading, and claiming a million keys through the API would take most of
-- its time.  Key 'k-' || 8 digits, in key order within each scope.
CREATE ROLE bench_billing_app;
CREATE ROLE bench_shop_app;
CREATE ROLE bench_billing_reviewers;
CREATE ROLE bench_reviewers;
CREATE ROLE bench_rita LOGIN PASSWORD 'rita-pw' IN ROLE bench_reviewers, bench_billing_reviewers;
GRANT USAGE ON SCHEMA idempo TO bench_reviewers;
GRANT SELECT ON idempo.scopes, idempo.stats TO bench_reviewers;
GRANT EXECUTE ON FUNCTION
    idempo.review_queue_page(text, text, text, interval, timestamptz, bigint, integer),
    idempo.conflict_queue_page(text, text, interval, timestamptz, bigint, integer),
    idempo.unknown_queue_page(text, text, interval, timestamptz, text, text, integer),
    idempo.reviewable_operations_of(text[], text[]),
    idempo.open_reviews_of(text[], text[]),
    idempo.open_conflicts_of(text[], text[]),
    idempo.reviewable_events_of(text, text),
    idempo.reviewable_events_since(timestamptz),
    idempo.resolve(text, text, text, text, text, jsonb, text),
    idempo.verify(text, text, integer, boolean, text, jsonb),
    idempo.resolve_conflict(bigint, text, text, text),
    idempo.request_review(text, text, text),
    idempo.release(text, text, text, text),
    idempo.lookup(text, text)
TO bench_reviewers;
-- rita reviews billing (40 % of the records) and ops (10 %, no roles); not shop (40 %) nor
-- signup (10 %, hashed keys)
SELECT name FROM idempo.create_scope('billing.charge', allowed_role => 'bench_billing_app',
    review_role => 'bench_billing_reviewers', store_params => true, audit => true);
SELECT name FROM idempo.create_scope('shop.order', allowed_role => 'bench_shop_app', store_params => true,
    audit => true);
SELECT name FROM idempo.create_scope('signup.mail', allowed_role => 'bench_shop_app', hash_keys => true,
    audit => true);
SELECT name FROM idempo.create_scope('ops.misc', audit => true);

BEGIN;
CREATE TEMP TABLE bench_rows ON COMMIT DROP AS
SELECT i,
       CASE i % 10 WHEN 0 THEN 'signup.mail' WHEN 1 THEN 'ops.misc'
            WHEN 2 THEN 'billing.charge' WHEN 3 THEN 'billing.charge' WHEN 4 THEN 'billing.charge'
            WHEN 5 THEN 'billing.charge' ELSE 'shop.order' END AS scope,
       CASE WHEN i % 10 = 0 THEN encode(sha256(convert_to('k-' || lpad(i::text, 8, '0'), 'UTF8')), 'hex')
            ELSE 'k-' || lpad(i::text, 8, '0') END AS key,
       CASE WHEN i < :reviews THEN 'in_review'
            WHEN i < :reviews + :unknown THEN 'unknown'
            ELSE 'succeeded' END::idempo.status AS status,
       i >= :reviews + :unknown AND i < :reviews + :unknown + :conflicts AS conflicted,
       now() - interval '2 hours' + i * interval '1 millisecond' AS t
FROM generate_series(0, :n - 1) i;

INSERT INTO idempo.operations (scope, key, fingerprint, status, attempt, run_id, first_seen_at,
                               last_attempt_at, lease_expires_at, completed_at, expires_at, sweep_at,
                               result, target_ref, params)
SELECT scope, key, sha256(convert_to('{"amount":' || i || '}', 'UTF8')), status, 1, 'run-' || (i % 97), t,
       t, NULL,
       CASE WHEN status = 'succeeded' THEN t END,
       CASE WHEN status = 'succeeded' THEN t + interval '24 hours' END,
       CASE WHEN status = 'in_review' THEN NULL ELSE t + interval '24 hours' END,
       CASE WHEN status = 'succeeded' THEN jsonb_build_object('charge', i) END,
       CASE WHEN status = 'succeeded' THEN 'ch_' || i END,
       CASE WHEN scope IN ('billing.charge', 'shop.order') THEN jsonb_build_object('amount', i) END
FROM bench_rows ORDER BY scope, key;

INSERT INTO idempo.reviews (scope, key, reason, opened_at, operation, detail)
SELECT r.scope, r.key, CASE WHEN r.i % 3 = 0 THEN 'manual' ELSE 'retention_expired' END,
       r.t + interval '1 hour', o, 'benchmark'
FROM bench_rows r JOIN idempo.operations o ON o.scope = r.scope AND o.key = r.key
WHERE r.status = 'in_review';

INSERT INTO idempo.conflicts (scope, key, stored_fingerprint, incoming_fingerprint, stored_params,
                              incoming_params, run_id, first_detected_at, last_detected_at)
SELECT r.scope, r.key, o.fingerprint, sha256(convert_to('other' || r.i, 'UTF8')), o.params,
       CASE WHEN o.params IS NOT NULL THEN jsonb_build_object('amount', r.i + 1) END, 'run-x', r.t, r.t
FROM bench_rows r JOIN idempo.operations o ON o.scope = r.scope AND o.key = r.key
WHERE r.conflicted;

INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, outcome, action, actor)
SELECT r.t + e.d, r.scope, r.key, 'run-1', 1, e.f::idempo.status, e.tt::idempo.status, e.o::idempo.outcome,
       e.a, 'bench_app'
FROM bench_rows r,
     (VALUES (interval '0', NULL, 'in_progress', 'acquired', 'claim'),
             (interval '10 minutes', 'in_progress', 'unknown', NULL, 'lease_expired'),
             (interval '1 hour', 'unknown', 'in_review', NULL, 'retention_expired')) e(d, f, tt, o, a)
WHERE r.status = 'in_review';
COMMIT;
VACUUM ANALYZE idempo.operations, idempo.reviews, idempo.conflicts, idempo.events;
SELECT count(*) AS inconsistent FROM idempo.check_consistency();
