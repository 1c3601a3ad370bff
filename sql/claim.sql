-- idempo.claim(): every outcome, with the record it leaves.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;


-- The record of one key, without times that change from run to run.
CREATE FUNCTION pg_temp.op(s text, k text) RETURNS TABLE (status idempo.status, attempt int, run_id text,
    has_fp boolean, has_lease boolean, completed boolean, expires boolean, result jsonb, target_ref text, error text)
LANGUAGE sql AS $$
    SELECT o.status, o.attempt, o.run_id, o.fingerprint IS NOT NULL, o.lease_expires_at IS NOT NULL,
           o.completed_at IS NOT NULL, o.expires_at IS NOT NULL, o.result, o.target_ref, o.error
    FROM idempo.lookup(s, k) o WHERE o.scope IS NOT NULL
$$;

SELECT name FROM idempo.create_scope('ship', retention => '1 day', lease => '5 minutes',
                                     verify_settle => '1 minute');

-- acquired: a new key
SELECT outcome, status, attempt, result, target_ref, error, first_seen_at IS NOT NULL AS seen,
       lease_expires_at > first_seen_at AS leased, conflict_id, review_id
FROM idempo.claim('ship', 'order-1', '{"sku":"A","qty":2}', run_id => 'run-1');
SELECT * FROM pg_temp.op('ship', 'order-1');

-- busy: a committed attempt holds a live lease
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-1', '{"sku":"A","qty":2}');

-- replay: after complete, the same request gets the stored answer
SELECT idempo.complete('ship', 'order-1', 1, '{"shipment":"S-1"}', 'S-1');
SELECT outcome, status, attempt, result, target_ref, error
FROM idempo.claim('ship', 'order-1', '{"qty":2.0,"sku":"A"}', run_id => 'run-2');
SELECT * FROM pg_temp.op('ship', 'order-1');

-- conflict: same key, different parameters; the record is untouched and the conflict kept
SELECT outcome, status, attempt, result, target_ref, conflict_id IS NOT NULL AS has_conflict_id
FROM idempo.claim('ship', 'order-1', '{"sku":"A","qty":3}', run_id => 'run-3');
SELECT outcome FROM idempo.claim('ship', 'order-1', '{"sku":"A","qty":3}', run_id => 'run-4');
SELECT outcome FROM idempo.claim('ship', 'order-1', '{"sku":"A","qty":4}', run_id => 'run-5');
SELECT * FROM pg_temp.op('ship', 'order-1');
SELECT scope, key, occurrences, run_id, stored_fingerprint = idempo.fingerprint('{"sku":"A","qty":2}') AS stored_ok,
       incoming_params, resolved_at
FROM idempo.conflicts ORDER BY id;

-- a claim without params skips the comparison and replays
SELECT outcome, result FROM idempo.claim('ship', 'order-1');
-- a fingerprint computed by the caller is compared like params
SELECT outcome FROM idempo.claim('ship', 'order-1', fingerprint => idempo.fingerprint('{"sku":"A","qty":2}'));
SELECT outcome FROM idempo.claim('ship', 'order-1', fingerprint => sha256('something else'));

-- replay of a final failure returns the error
SELECT outcome FROM idempo.claim('ship', 'order-2', '{"x":1}');
SELECT idempo.fail('ship', 'order-2', 1, 'address rejected', retryable => false);
SELECT outcome, status, attempt, error FROM idempo.claim('ship', 'order-2', '{"x":1}');
SELECT * FROM pg_temp.op('ship', 'order-2');

-- retryable: the next claim acquires attempt 2
SELECT outcome FROM idempo.claim('ship', 'order-3', '{"x":1}');
SELECT idempo.fail('ship', 'order-3', 1, 'timeout before sending');
SELECT * FROM pg_temp.op('ship', 'order-3');
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-3', '{"x":1}', run_id => 'run-b');
SELECT * FROM pg_temp.op('ship', 'order-3');

-- unknown: the lease ran out with no outcome (evaluated 6 minutes later)
SELECT outcome FROM idempo.claim('ship', 'order-4', '{"x":1}');
SET idempo.clock_offset = '6min';
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-4', '{"x":1}');
-- that claim took the verification lease (has_lease): until it runs out, or a verify or a late
-- reply ends it, another claim answers busy
SELECT * FROM pg_temp.op('ship', 'order-4');
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-4', '{"x":1}');
-- a late reply of the same attempt still resolves it
SELECT idempo.complete('ship', 'order-4', 1, '{"late":true}', 'S-4');
SELECT outcome, result, target_ref FROM idempo.claim('ship', 'order-4', '{"x":1}');
RESET idempo.clock_offset;

-- a scope whose target honours the key: an expired lease is retried as attempt + 1
SELECT name FROM idempo.create_scope('ship.retry', on_lease_expiry => 'retry', max_attempts => 2);
SELECT outcome, attempt FROM idempo.claim('ship.retry', 'order-5', '{"x":1}');
SET idempo.clock_offset = '6min';
SELECT outcome, status, attempt FROM idempo.claim('ship.retry', 'order-5', '{"x":1}');
SELECT regress.err($$SELECT idempo.complete('ship.retry', 'order-5', 1)$$);
SET idempo.clock_offset = '12min';
-- max_attempts (2) used: review instead of a third attempt
SELECT outcome, status, attempt, review_id IS NOT NULL AS has_review FROM idempo.claim('ship.retry', 'order-5', '{"x":1}');
SELECT scope, key, reason, (operation).status AS status_at_entry, (operation).attempt AS attempt_at_entry, detail
FROM idempo.reviews WHERE key = 'order-5';
SELECT outcome, status FROM idempo.claim('ship.retry', 'order-5', '{"x":1}');
RESET idempo.clock_offset;

-- max_attempts also stops a retryable operation
SELECT outcome FROM idempo.claim('ship.retry', 'order-6');
SELECT idempo.fail('ship.retry', 'order-6', 1, 'e1');
SELECT outcome, attempt FROM idempo.claim('ship.retry', 'order-6');
SELECT idempo.fail('ship.retry', 'order-6', 2, 'e2');
SELECT outcome, status, attempt FROM idempo.claim('ship.retry', 'order-6');
SELECT reason, detail FROM idempo.reviews WHERE key = 'order-6';

-- retention: unfinished work past first_seen_at + retention goes to review, never retried
SELECT outcome FROM idempo.claim('ship', 'order-7', '{"x":1}');
SELECT idempo.fail('ship', 'order-7', 1, 'e');
SET idempo.clock_offset = '25h';
SELECT outcome, status, attempt, review_id IS NOT NULL AS has_review FROM idempo.claim('ship', 'order-7', '{"x":1}');
SELECT reason, (operation).status AS status_at_entry FROM idempo.reviews WHERE key = 'order-7';
-- ... and a finished record past expires_at counts as absent: the key starts afresh
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-1', '{"sku":"B"}');
SELECT * FROM pg_temp.op('ship', 'order-1');
RESET idempo.clock_offset;

-- stale: no record and intent_at older than retention
SELECT outcome, status, attempt, review_id IS NOT NULL AS has_review
FROM idempo.claim('ship', 'order-8', '{"x":1}', intent_at => now() - interval '3 days');
SELECT * FROM pg_temp.op('ship', 'order-8');
SELECT reason, detail LIKE 'intent_at % is older than the scope''s retention%' AS detail_ok FROM idempo.reviews WHERE key = 'order-8';
SELECT outcome FROM idempo.claim('ship', 'order-8', '{"x":1}', intent_at => now() - interval '3 days');
-- a recent intent_at is fine, and an old one does not matter when the record exists
SELECT outcome FROM idempo.claim('ship', 'order-9', intent_at => now() - interval '1 hour');
SELECT outcome FROM idempo.claim('ship', 'order-9', intent_at => now() - interval '3 days');

-- complete_on_commit: one call; the row is succeeded when the transaction commits
BEGIN;
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-10', '{"x":1}', complete_on_commit => true);
SELECT idempo.complete('ship', 'order-10', result => '{"reserved":3}', target_ref => 'R-10');
COMMIT;
SELECT outcome, status, result, target_ref FROM idempo.claim('ship', 'order-10', '{"x":1}');
BEGIN;
SELECT outcome FROM idempo.claim('ship', 'order-11', complete_on_commit => true);
ROLLBACK;
SELECT * FROM pg_temp.op('ship', 'order-11');
BEGIN;
SELECT outcome FROM idempo.claim('ship', 'order-11', complete_on_commit => true);
SELECT idempo.fail('ship', 'order-11', error => 'stock gone', retryable => true);
COMMIT;
SELECT * FROM pg_temp.op('ship', 'order-11');

-- require_fingerprint
SELECT name FROM idempo.create_scope('strict', require_fingerprint => true);
SELECT regress.err($$SELECT idempo.claim('strict', 'k')$$);
SELECT outcome FROM idempo.claim('strict', 'k', '{"a":1}');

-- hash_keys: only the digest is stored; lookup and complete take the clear key
SELECT name FROM idempo.create_scope('private', hash_keys => true);
SELECT outcome FROM idempo.claim('private', 'customer:alice@example.com', '{"a":1}');
SELECT idempo.complete('private', 'customer:alice@example.com', 1, '{"ok":true}');
SELECT key = encode(sha256(convert_to('customer:alice@example.com', 'UTF8')), 'hex') AS digest_stored,
       key = idempo.stored_key('private', 'customer:alice@example.com') AS stored_key_agrees
FROM idempo.operations WHERE scope = 'private';
SELECT count(*) AS clear_keys FROM idempo.operations WHERE key LIKE '%alice%';
SELECT status, result FROM idempo.lookup('private', 'customer:alice@example.com');
SELECT outcome FROM idempo.claim('private', 'customer:alice@example.com', '{"a":2}');
SELECT count(*) AS clear_keys_in_conflicts FROM idempo.conflicts WHERE key LIKE '%alice%';

-- lookup of a key that does not exist
SELECT idempo.lookup('ship', 'no-such-key') IS NULL AS absent;

-- A key this transaction acquired answers 'acquired' again, with the same attempt (it answered
-- 'busy' before): a second claim in the owning transaction is not another worker.
BEGIN;
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-20', '{"x":1}');
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-20', '{"x":1}');
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-20');
-- (claim(...)).* calls claim once per column: every column from the same answer
SELECT (idempo.claim('ship', 'order-20', '{"x":1}')).*  \gset r_
SELECT :'r_outcome' AS outcome, :'r_status' AS status, :'r_attempt' AS attempt,
       :'r_lease_expires_at' = lease_expires_at::text AS same_lease
FROM idempo.lookup('ship', 'order-20');
-- different parameters are still a conflict
SELECT outcome, attempt FROM idempo.claim('ship', 'order-20', '{"x":2}');
-- a rolled-back complete leaves the attempt held; once completed, a claim replays
SAVEPOINT s;
SELECT idempo.complete('ship', 'order-20', result => '{"n":20}');
ROLLBACK TO SAVEPOINT s;
SELECT outcome, attempt FROM idempo.claim('ship', 'order-20', '{"x":1}');
SELECT idempo.complete('ship', 'order-20', result => '{"n":20}');
SELECT outcome, status, result FROM idempo.claim('ship', 'order-20', '{"x":1}');
COMMIT;
-- the one-call form too, until it is completed or failed in the transaction
BEGIN;
SELECT outcome, attempt FROM idempo.claim('ship', 'order-21', complete_on_commit => true);
SELECT outcome, attempt FROM idempo.claim('ship', 'order-21', complete_on_commit => true);
SELECT idempo.fail('ship', 'order-21', error => 'no stock');
SELECT outcome, status, attempt FROM idempo.claim('ship', 'order-21');
COMMIT;
SELECT status, attempt FROM idempo.lookup('ship', 'order-21');

-- Read-only transactions (and standbys): the answers that need no write are given, the others
-- refused with 25006 and the reason (it was PostgreSQL's raw INSERT error before, even for a replay).
BEGIN READ ONLY;
SELECT outcome, status, result FROM idempo.claim('ship', 'order-20', '{"x":1}');
SELECT status FROM idempo.lookup('ship', 'order-20');
COMMIT;
SELECT outcome FROM idempo.claim('ship', 'order-22', '{"x":1}');
SELECT outcome FROM idempo.claim('ship', 'order-23', '{"x":1}');
SELECT idempo.fail('ship', 'order-23', 1, 'timeout before sending');
SET default_transaction_read_only = on;
SELECT outcome, status FROM idempo.claim('ship', 'order-22', '{"x":1}');
SELECT outcome, status FROM idempo.claim('ship', 'order-22', '{"x":1}', wait => false);
SELECT idempo.claim('ship', 'order-new', '{"x":1}');
SELECT idempo.claim('ship', 'order-22', '{"x":2}');
SELECT idempo.claim('ship', 'order-23', '{"x":1}');
SET idempo.clock_offset = '10min';
SELECT idempo.claim('ship', 'order-22', '{"x":1}');
RESET idempo.clock_offset;
RESET default_transaction_read_only;
-- nothing was written by the refused claims
SELECT key, status, attempt FROM idempo.operations WHERE key IN ('order-22', 'order-23', 'order-new') ORDER BY key;
SELECT count(*) AS conflicts_of_order_22 FROM idempo.conflicts WHERE key = 'order-22';
-- 'unknown' writes: the claim that answers it takes the verification lease.  Read-only, a claim
-- answers busy while another caller's lease is live, and is refused once it has run out.
SET idempo.clock_offset = '10min';
SELECT outcome, status, lease_expires_at > idempo.now() AS leased FROM idempo.claim('ship', 'order-22', '{"x":1}');
SET default_transaction_read_only = on;
SELECT outcome, status FROM idempo.claim('ship', 'order-22', '{"x":1}');
SELECT outcome, status FROM idempo.claim('ship', 'order-22', '{"x":1}', wait => false);
SET idempo.clock_offset = '16min';
SELECT idempo.claim('ship', 'order-22', '{"x":1}');
-- a caller that cannot verify (verify_unknown => false) takes no lease, so writes nothing: it is
-- answered unknown, read-only too
SELECT outcome, status, lease_expires_at > idempo.now() AS leased FROM idempo.claim('ship', 'order-22', '{"x":1}', verify_unknown => false);
RESET default_transaction_read_only;
SELECT outcome, status, lease_expires_at > idempo.now() AS leased FROM idempo.claim('ship', 'order-22', '{"x":1}', verify_unknown => false);
SELECT regress.err($$SELECT idempo.claim('ship', 'order-22', '{"x":1}', verify_unknown => NULL)$$);
-- in one transaction the holder gets unknown again, once per column too
BEGIN;
SELECT outcome, status, attempt FROM (SELECT (idempo.claim('ship', 'order-22', '{"x":1}')).*) c;
SELECT outcome, status FROM idempo.claim('ship', 'order-22', '{"x":1}');
COMMIT;
RESET idempo.clock_offset;
-- however many it took: a transaction that takes ten verification leases still holds the first
-- (it is not told busy about its own key)
SELECT name FROM idempo.create_scope('verifiers', retention => '1 hour', lease => '1 minute');
SELECT count(*) FROM generate_series(1, 10) AS i, idempo.claim('verifiers', 'v-' || i) AS c WHERE c.outcome = 'acquired';
SET idempo.clock_offset = '2min';
BEGIN;
SELECT outcome, count(*) FROM generate_series(1, 10) AS i, idempo.claim('verifiers', 'v-' || i) AS c GROUP BY 1;
SELECT outcome, status FROM idempo.claim('verifiers', 'v-1');
COMMIT;
RESET idempo.clock_offset;
