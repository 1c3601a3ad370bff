-- verify(found => false) frees a key only after the settle window measured from the LAST
-- attempt: on attempt 2 an empty lookup shortly after its lease ran out is not proof, even
-- though the first attempt is long past (first_seen_at + verify_settle is over).
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('wh', retention => '1 day', lease => '5 minutes',
                                     verify_settle => '10 minutes');
SELECT outcome, attempt FROM idempo.claim('wh', 'order-1', '{"qty":1}');
SELECT idempo.fail('wh', 'order-1', 1, 'connection refused', retryable => true);
-- attempt 2, half an hour after the first; its reply is lost and its lease runs out
SET idempo.clock_offset = '30min';
SELECT outcome, attempt FROM idempo.claim('wh', 'order-1', '{"qty":1}');
SET idempo.clock_offset = '36min';
SELECT outcome, status, attempt FROM idempo.claim('wh', 'order-1', '{"qty":1}');
SELECT last_attempt_at - first_seen_at >= interval '30 minutes' AS attempt_2_half_an_hour_later FROM idempo.lookup('wh', 'order-1');
-- 6 minutes after attempt 2 (36 after the first): inside attempt 2's settle window
\set VERBOSITY terse
SELECT idempo.verify('wh', 'order-1', 2, found => false);
\set VERBOSITY default
SELECT status, attempt FROM idempo.lookup('wh', 'order-1');
SELECT outcome, status FROM idempo.claim('wh', 'order-1', '{"qty":1}');
-- 11 minutes after attempt 2: now an empty lookup counts as not executed
SET idempo.clock_offset = '41min';
SELECT idempo.verify('wh', 'order-1', 2, found => false);
SELECT status, attempt, error FROM idempo.lookup('wh', 'order-1');
SELECT outcome, status, attempt FROM idempo.claim('wh', 'order-1', '{"qty":1}');
RESET idempo.clock_offset;

-- verify in a hash_keys scope takes the clear key
SELECT name FROM idempo.create_scope('pii', hash_keys => true, lease => '1 minute', verify_settle => '1 minute');
SELECT outcome FROM idempo.claim('pii', 'alice@example.com', '{"a":1}');
SET idempo.clock_offset = '2min';
SELECT outcome FROM idempo.claim('pii', 'alice@example.com', '{"a":1}');
SELECT idempo.verify('pii', 'alice@example.com', 1, found => true, target_ref => 'T-1');
SELECT key = encode(sha256(convert_to('alice@example.com', 'UTF8')), 'hex') AS digest, status, target_ref
FROM idempo.lookup('pii', 'alice@example.com');
RESET idempo.clock_offset;
SELECT * FROM idempo.check_consistency();
