-- The stale guard when a record exists but has expired and was not swept yet: a claim whose
-- intent_at is older than the scope's retention is not executed, whether the old record is
-- gone or still there past its expires_at (a redelivery months later must not run again).
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('late', retention => '1 hour', lease => '5 minutes');
SELECT outcome FROM idempo.claim('late', 'order-1', '{"x":1}', complete_on_commit => true);
SELECT outcome FROM idempo.claim('late', 'order-2', '{"x":1}', complete_on_commit => true);

-- two hours later, no sweep has run: both records are still there, past expires_at
SET idempo.clock_offset = '2h';
SELECT key, status, expires_at < idempo.now() AS expired FROM idempo.operations ORDER BY key;

-- the redelivery of an intent older than retention: stale, in review, not acquired
SELECT outcome, status, attempt, review_id IS NOT NULL AS has_review
FROM idempo.claim('late', 'order-1', '{"x":1}', intent_at => idempo.now() - interval '90 minutes');
SELECT status, attempt, result IS NULL AS no_result FROM idempo.lookup('late', 'order-1');
SELECT key, reason, detail LIKE 'intent_at % is older than the scope''s retention%' AS detail_ok,
       (operation).status AS status_at_entry
FROM idempo.reviews ORDER BY key;
-- and it stays so: the next delivery is in review, not executed
SELECT outcome FROM idempo.claim('late', 'order-1', '{"x":1}');

-- an intent within retention starts the expired key afresh
SELECT outcome, status, attempt
FROM idempo.claim('late', 'order-2', '{"x":1}', intent_at => idempo.now() - interval '30 minutes');
RESET idempo.clock_offset;

SELECT * FROM idempo.check_consistency();
