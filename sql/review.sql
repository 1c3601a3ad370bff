-- Doubt and the review loop: verify, request_review, resolve, review_queue, stats, events.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;


SELECT name FROM idempo.create_scope('wh', retention => '1 day', lease => '5 minutes',
                                     verify_settle => '10 minutes', audit => true);

-- The seam from the field: the warehouse created the shipment, the reply was lost, the worker
-- died before complete().  After the lease the next claim gets unknown, not acquired.
SELECT outcome, attempt FROM idempo.claim('wh', 'order-1', '{"qty":1}', run_id => 'run-1');
SET idempo.clock_offset = '6min';
SELECT outcome, status, attempt FROM idempo.claim('wh', 'order-1', '{"qty":1}', run_id => 'run-2');
-- the workflow looks the shipment up and finds it
SELECT idempo.verify('wh', 'order-1', attempt => 1, found => true, target_ref => 'SHP-501', result => '{"shipment":501}');
-- a duplicate now replays with the target id
SELECT outcome, status, attempt, result, target_ref FROM idempo.claim('wh', 'order-1', '{"qty":1}', run_id => 'run-3');
RESET idempo.clock_offset;

-- verify(found => false) inside the settle window: stays unknown, and says so
SELECT outcome FROM idempo.claim('wh', 'order-2', '{"qty":1}');
SET idempo.clock_offset = '6min';
SELECT outcome FROM idempo.claim('wh', 'order-2', '{"qty":1}');
\set VERBOSITY terse
SELECT idempo.verify('wh', 'order-2', attempt => 1, found => false);
\set VERBOSITY default
SELECT outcome, status FROM idempo.claim('wh', 'order-2', '{"qty":1}');
-- after the settle window (10 minutes since the last attempt's lease ran out) an empty lookup counts
SET idempo.clock_offset = '16min';
SELECT idempo.verify('wh', 'order-2', 1, false);
SELECT status, error FROM idempo.lookup('wh', 'order-2');
SELECT outcome, status, attempt FROM idempo.claim('wh', 'order-2', '{"qty":1}');
RESET idempo.clock_offset;

-- verify refuses what is not unknown
SELECT regress.err($$SELECT idempo.verify('wh', 'order-2', 2, true)$$);
SELECT regress.err($$SELECT idempo.verify('wh', 'order-1', 1, true)$$);
SELECT regress.err($$SELECT idempo.verify('wh', 'nothing', 1, true)$$);
SELECT regress.err($$SELECT idempo.verify('wh', 'order-2', 2, NULL)$$);
SELECT regress.err($$SELECT idempo.verify('wh', 'order-2', NULL, true)$$);
-- the form without the attempt (0.2.0) is refused with a hint, positional or named
SELECT regress.err($$SELECT idempo.verify('wh', 'order-2', true)$$);
SELECT regress.err($$SELECT idempo.verify('wh', 'order-2', found => false)$$);

-- The fence.  Attempt 1's outcome is lost; observer B looks it up (nothing, settled) and frees
-- the key; attempt 2 runs, does the work and dies before complete(), so it is unknown too.
-- Observer A's lookup, made while attempt 1 was in doubt, arrives now: it says nothing about
-- attempt 2 and is refused.  Before the fence it made the key retryable and attempt 3 ran the
-- action a second time.
SELECT outcome, attempt FROM idempo.claim('wh', 'order-5', '{"qty":1}');
SET idempo.clock_offset = '16min';
SELECT outcome, attempt FROM idempo.claim('wh', 'order-5', '{"qty":1}');
SELECT idempo.verify('wh', 'order-5', attempt => 1, found => false);
SELECT outcome, attempt FROM idempo.claim('wh', 'order-5', '{"qty":1}');
SET idempo.clock_offset = '30min';
SELECT outcome, attempt FROM idempo.claim('wh', 'order-5', '{"qty":1}');
SELECT regress.err($$SELECT idempo.verify('wh', 'order-5', attempt => 1, found => false)$$);
SELECT regress.err($$SELECT idempo.verify('wh', 'order-5', attempt => 3, found => false)$$);
-- the claim before took the verification lease: another one is busy meanwhile
SELECT outcome, status, attempt FROM idempo.claim('wh', 'order-5', '{"qty":1}');
-- attempt 2's own lookup decides
SELECT idempo.verify('wh', 'order-5', attempt => 2, found => true, target_ref => 'SHP-505');
SELECT outcome, status, attempt, target_ref FROM idempo.claim('wh', 'order-5', '{"qty":1}');
RESET idempo.clock_offset;

-- request_review: a person takes over; a running attempt can no longer finish
SELECT idempo.request_review('wh', 'order-2', 'customer called: hold it') > 0 AS opened;
SELECT idempo.request_review('wh', 'order-2', 'again') = (SELECT id FROM idempo.reviews WHERE key = 'order-2') AS same_review;
SELECT regress.err($$SELECT idempo.complete('wh', 'order-2', 2)$$);
SELECT outcome, status FROM idempo.claim('wh', 'order-2', '{"qty":1}');
SELECT scope, key, reason, status, detail, snapshot->>'status' AS status_at_entry, waiting >= '0' AS waiting
FROM idempo.review_queue;

-- resolve: a reviewer decides; refusals first
SELECT regress.err($$SELECT idempo.resolve('wh', 'order-2', 'maybe', 'alice')$$);
SELECT regress.err($$SELECT idempo.resolve('wh', 'order-2', 'succeeded', '')$$);
SELECT regress.err($$SELECT idempo.resolve('wh', 'order-1', 'succeeded', 'alice')$$);
SELECT idempo.resolve('wh', 'order-2', 'not_executed', 'alice', note => 'nothing in the WMS');
SELECT status, attempt, attempt_base, error, first_seen_at > now() - interval '1 minute' AS fresh_window
FROM idempo.lookup('wh', 'order-2');
SELECT key, reason, resolved_by, resolution, note FROM idempo.reviews ORDER BY id;
SELECT count(*) AS open_reviews FROM idempo.review_queue;
SELECT outcome, attempt FROM idempo.claim('wh', 'order-2', '{"qty":1}');

-- resolve as succeeded / failed from unknown
SELECT outcome FROM idempo.claim('wh', 'order-3');
SELECT outcome FROM idempo.claim('wh', 'order-4');
SET idempo.clock_offset = '6min';
SELECT idempo.resolve('wh', 'order-3', 'succeeded', 'bob', 'SHP-9', '{"shipment":9}');
SELECT idempo.resolve('wh', 'order-4', 'failed', 'bob', note => 'address does not exist');
RESET idempo.clock_offset;
SELECT key, status, target_ref, result, error FROM idempo.operations WHERE key IN ('order-3', 'order-4') ORDER BY key;

-- max_attempts: a reviewer's not_executed grants a fresh allowance
SELECT name FROM idempo.create_scope('wh.limited', max_attempts => 1);
SELECT outcome FROM idempo.claim('wh.limited', 'k');
SELECT idempo.fail('wh.limited', 'k', 1);
SELECT outcome FROM idempo.claim('wh.limited', 'k');
SELECT idempo.resolve('wh.limited', 'k', 'not_executed', 'carol');
SELECT outcome, attempt FROM idempo.claim('wh.limited', 'k');
SELECT idempo.fail('wh.limited', 'k', 2);
SELECT outcome FROM idempo.claim('wh.limited', 'k');

-- stats and the audit trail of the first order
SELECT scope, in_progress, succeeded, failed, retryable, unknown, in_review, open_reviews,
       oldest_review_wait IS NOT NULL AS has_wait, open_conflicts
FROM idempo.stats ORDER BY scope;
SELECT run_id, attempt, from_status, to_status, outcome, action FROM idempo.events WHERE key = 'order-1' ORDER BY id;
SELECT * FROM idempo.check_consistency();
