-- A claim by the transaction that acquired the key answers 'acquired' again only while that
-- attempt is open; once the same transaction completed or failed it, the usual answers apply
-- (replay, or the next attempt of a retryable one).
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('own');
BEGIN;
SELECT outcome, status, attempt FROM idempo.claim('own', 'k1', '{"a":1}');
SELECT outcome, status, attempt FROM idempo.claim('own', 'k1', '{"a":1}');
SELECT idempo.complete('own', 'k1', result => '{"done":1}');
SELECT outcome, status, attempt, result FROM idempo.claim('own', 'k1', '{"a":1}');
COMMIT;

BEGIN;
SELECT outcome, status, attempt FROM idempo.claim('own', 'k2', '{"a":1}');
SELECT idempo.fail('own', 'k2', error => 'timeout', retryable => true);
SELECT outcome, status, attempt FROM idempo.claim('own', 'k2', '{"a":1}');
SELECT idempo.fail('own', 'k2', error => 'rejected', retryable => false);
SELECT outcome, status, attempt, error FROM idempo.claim('own', 'k2', '{"a":1}');
COMMIT;

-- complete_on_commit: the row is already succeeded in this transaction; the claim is still open
BEGIN;
SELECT outcome, status, attempt FROM idempo.claim('own', 'k3', complete_on_commit => true);
SELECT outcome, status, attempt FROM idempo.claim('own', 'k3');
COMMIT;
SELECT outcome, status, attempt FROM idempo.claim('own', 'k3');

-- finished in this transaction by another path than complete/fail (a reviewer's resolve, a
-- verify after the lease): the record decides, not the memory of the acquired attempt
BEGIN;
SELECT outcome, status, attempt FROM idempo.claim('own', 'k4', '{"a":1}');
SELECT idempo.request_review('own', 'k4', 'hold') > 0 AS in_review;
SELECT idempo.resolve('own', 'k4', 'succeeded', 'reviewer', target_ref => 'T-4');
SELECT outcome, status, attempt, target_ref FROM idempo.claim('own', 'k4', '{"a":1}');
COMMIT;
SELECT name FROM idempo.create_scope('own.retry', lease => '1 minute', on_lease_expiry => 'retry');
BEGIN;
SELECT outcome, status, attempt FROM idempo.claim('own.retry', 'k5');
SET LOCAL idempo.clock_offset = '2min';
SELECT lease_expired FROM idempo.sweep();
SELECT outcome, status, attempt FROM idempo.claim('own.retry', 'k5');
COMMIT;
