-- idempo.complete() and idempo.fail(): transitions, fencing by attempt, attempt => NULL.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;


SELECT name FROM idempo.create_scope('pay', retention => '1 day', lease => '5 minutes');

-- complete: in_progress -> succeeded, result and target reference stored, expiry set
SELECT outcome, attempt FROM idempo.claim('pay', 'inv-1');
SELECT idempo.complete('pay', 'inv-1', 1, '{"charge":"ch_1"}', 'ch_1');
SELECT status, attempt, result, target_ref, lease_expires_at IS NULL AS lease_cleared,
       expires_at - completed_at AS kept_for
FROM idempo.operations WHERE key = 'inv-1';

-- attempt => NULL means the attempt this transaction acquired
BEGIN;
SELECT outcome, attempt FROM idempo.claim('pay', 'inv-2');
SELECT idempo.complete('pay', 'inv-2', result => '{"n":2}');
COMMIT;
SELECT status, result FROM idempo.operations WHERE key = 'inv-2';
-- ... and only in that transaction
SELECT outcome FROM idempo.claim('pay', 'inv-3');
SELECT regress.err($$SELECT idempo.complete('pay', 'inv-3')$$);
-- ... and not what a rolled-back savepoint acquired
BEGIN;
SAVEPOINT s;
SELECT outcome FROM idempo.claim('pay', 'inv-4');
ROLLBACK TO SAVEPOINT s;
SELECT regress.err($$SELECT idempo.complete('pay', 'inv-4')$$);
SAVEPOINT t;
SELECT outcome FROM idempo.claim('pay', 'inv-4');
RELEASE SAVEPOINT t;
SELECT idempo.complete('pay', 'inv-4');
COMMIT;
SELECT status FROM idempo.operations WHERE key = 'inv-4';

-- fail: retryable (no effect) and final (replayed)
SELECT idempo.fail('pay', 'inv-3', 1, 'card network timeout before send', retryable => true);
SELECT status, error, completed_at IS NULL AS not_completed, expires_at IS NULL AS no_expiry
FROM idempo.operations WHERE key = 'inv-3';
SELECT outcome, attempt FROM idempo.claim('pay', 'inv-3');
SELECT idempo.fail('pay', 'inv-3', 2, 'card declined', retryable => false);
SELECT status, attempt, error, completed_at IS NOT NULL AS completed, expires_at IS NOT NULL AS expires
FROM idempo.operations WHERE key = 'inv-3';

-- fencing: attempt 1 of inv-5 is superseded by attempt 2; its late complete is refused
SELECT outcome FROM idempo.claim('pay', 'inv-5');
SELECT idempo.fail('pay', 'inv-5', 1, 'reset');
SELECT outcome, attempt FROM idempo.claim('pay', 'inv-5');
SELECT regress.err($$SELECT idempo.complete('pay', 'inv-5', 1, '{"stale":true}')$$);
SELECT regress.err($$SELECT idempo.fail('pay', 'inv-5', 1, 'late')$$);
SELECT regress.err($$SELECT idempo.complete('pay', 'inv-5', 3)$$);
SELECT status, attempt, result FROM idempo.operations WHERE key = 'inv-5';
SELECT idempo.complete('pay', 'inv-5', 2, '{"ok":true}');

-- refusals on records that are not in progress, and on absent ones
SELECT regress.err($$SELECT idempo.complete('pay', 'inv-1', 1)$$);
SELECT regress.err($$SELECT idempo.fail('pay', 'inv-1', 1)$$);
SELECT regress.err($$SELECT idempo.complete('pay', 'nothing', 1)$$);
SELECT regress.err($$SELECT idempo.fail('pay', 'nothing', 1, 'x', NULL)$$);
SELECT outcome FROM idempo.claim('pay', 'inv-6', intent_at => now() - interval '2 days');
SELECT regress.err($$SELECT idempo.complete('pay', 'inv-6', 0)$$);
-- a late reply of the current attempt still counts after it was declared retryable
-- (it says what happened); once a new attempt is acquired, the old one is fenced
SELECT outcome FROM idempo.claim('pay', 'inv-7');
SELECT idempo.fail('pay', 'inv-7', 1);
SELECT idempo.complete('pay', 'inv-7', 1, '{"late":true}');
SELECT outcome FROM idempo.claim('pay', 'inv-8');
SELECT idempo.fail('pay', 'inv-8', 1);
SELECT outcome, attempt FROM idempo.claim('pay', 'inv-8');
SELECT regress.err($$SELECT idempo.complete('pay', 'inv-8', 1)$$);

-- audit: every claim outcome and transition is an event
SELECT name FROM idempo.create_scope('pay.audited', audit => true);
SELECT outcome FROM idempo.claim('pay.audited', 'inv-1', '{"a":1}', run_id => 'r1');
SELECT idempo.complete('pay.audited', 'inv-1', 1, '{"ok":1}');
SELECT outcome FROM idempo.claim('pay.audited', 'inv-1', '{"a":1}', run_id => 'r2');
SELECT outcome FROM idempo.claim('pay.audited', 'inv-1', '{"a":2}', run_id => 'r3');
SELECT outcome FROM idempo.claim('pay.audited', 'inv-2', run_id => 'r4');
SELECT idempo.fail('pay.audited', 'inv-2', 1, 'x', false);
SELECT scope, key, run_id, attempt, from_status, to_status, outcome, action, actor = current_user AS by_me
FROM idempo.events ORDER BY id;
SELECT count(*) AS events_of_unaudited_scopes FROM idempo.events WHERE scope = 'pay';
