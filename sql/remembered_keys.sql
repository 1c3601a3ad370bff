-- Remembered keys (scope option remember): a finished record past expires_at is shrunk to what
-- recognises the key and its request, claims answer 'expired', and it is purged at
-- expires_at + remember.  idempo.release() lets a person free one on purpose.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

-- The setting is validated like the other timings.
SELECT regress.err($$SELECT idempo.create_scope('bad', remember => '-1 day')$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', remember => '101 years')$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', remember => NULL)$$);
SELECT name, remember FROM idempo.create_scope('plain', retention => '1 day');
SELECT name, remember FROM idempo.create_scope('pay', retention => '1 day', remember => '1 year',
                                               store_params => true, audit => true);
SELECT regress.err($$SELECT idempo.alter_scope('pay', remember => '-1 second')$$);

-- A finished record, first replayed as always.
SELECT outcome, attempt FROM idempo.claim('pay', 'p-1', '{"amount":10}', run_id => 'run-1');
SELECT idempo.complete('pay', 'p-1', 1, result => '{"receipt":"R-1"}', target_ref => 'TX-1');
SELECT outcome, status, result, target_ref, completed_at IS NOT NULL AS completed_at
FROM idempo.claim('pay', 'p-1', '{"amount":10}');
SELECT outcome, attempt FROM idempo.claim('plain', 'p-1', '{"amount":10}');
SELECT idempo.complete('plain', 'p-1', 1, result => '{"receipt":"R-1"}');

-- Two days later the results have expired.  Without remember the key starts afresh;
-- with it the claim answers 'expired': it finished, the result is gone, do not execute again.
SET idempo.clock_offset = '2 days';
SELECT outcome, attempt FROM idempo.claim('plain', 'p-1', '{"amount":10}');
SELECT outcome, status, attempt, result, error, target_ref,
       completed_at = (SELECT completed_at FROM idempo.operations WHERE scope = 'pay' AND key = 'p-1') AS completed_at
FROM idempo.claim('pay', 'p-1', '{"amount":10}');
-- the claim shrank the record: what recognises the key and its request stays
SELECT status, attempt, fingerprint = idempo.fingerprint('{"amount":10}') AS fingerprint, target_ref,
       result IS NULL AS no_result, params IS NULL AS no_params, run_id IS NULL AS no_run_id,
       sweep_at = ((expires_at AT TIME ZONE 'UTC') + interval '1 year') AT TIME ZONE 'UTC' AS remembered_a_year
FROM idempo.lookup('pay', 'p-1');
-- again: still expired; with another request: a conflict (recorded, without stored params)
SELECT outcome FROM idempo.claim('pay', 'p-1', '{"amount":10}');
SELECT outcome, status, conflict_id IS NOT NULL AS recorded FROM idempo.claim('pay', 'p-1', '{"amount":11}');
SELECT key, stored_status, stored_target_ref, stored_params, changed_fields FROM idempo.conflict_queue WHERE scope = 'pay';
-- a claim without a fingerprint is expired as well
SELECT outcome FROM idempo.claim('pay', 'p-1');
-- complete, fail and verify refuse it like any finished record
SELECT regress.err($$SELECT idempo.complete('pay', 'p-1', 1)$$);
SELECT regress.err($$SELECT idempo.fail('pay', 'p-1', 1, 'x')$$);

-- A read-only transaction gets the answer too, and writes nothing (the sweep shrinks it later).
RESET idempo.clock_offset;
SELECT outcome FROM idempo.claim('pay', 'p-2', '{"amount":20}', complete_on_commit => true);
SET idempo.clock_offset = '2 days';
BEGIN READ ONLY;
SELECT outcome, status FROM idempo.claim('pay', 'p-2', '{"amount":20}');
COMMIT;
SELECT params IS NOT NULL AS still_full FROM idempo.lookup('pay', 'p-2');

-- The sweep shrinks instead of purging, and purges once expires_at + remember has passed.
RESET idempo.clock_offset;
SELECT count(*) FROM (SELECT idempo.claim('pay', 's-' || g, '{"n":1}', complete_on_commit => true)
                      FROM generate_series(1, 5) g) c;
SELECT outcome FROM idempo.claim('pay', 's-6', '{"n":6}', run_id => 'run-6');
SELECT idempo.complete('pay', 's-6', 1, result => '{"receipt":"R-6"}', target_ref => 'TX-6');
SET idempo.clock_offset = '2 days';
SELECT * FROM idempo.sweep();
SELECT status, result, params, run_id, target_ref,
       sweep_at = ((expires_at AT TIME ZONE 'UTC') + interval '1 year') AT TIME ZONE 'UTC' AS remembered_a_year
FROM idempo.lookup('pay', 's-6');
SELECT count(*) AS remembered FROM idempo.operations
WHERE scope = 'pay' AND result IS NULL AND params IS NULL
  AND sweep_at = ((expires_at AT TIME ZONE 'UTC') + interval '1 year') AT TIME ZONE 'UTC';  -- a calendar year
SELECT * FROM idempo.check_consistency();
-- a sweep before the year is over leaves them alone
SET idempo.clock_offset = '300 days';
SELECT * FROM idempo.sweep();
SELECT count(*) AS still_remembered FROM idempo.operations WHERE scope = 'pay';
SET idempo.clock_offset = '367 days';
SELECT * FROM idempo.sweep();
SELECT count(*) AS left FROM idempo.operations WHERE scope = 'pay';
-- forgotten: the key starts afresh
SELECT outcome, attempt FROM idempo.claim('pay', 'p-1', '{"amount":10}');
RESET idempo.clock_offset;

-- A record past expires_at + remember that the sweep has not reached yet counts as absent.
SELECT outcome FROM idempo.claim('pay', 'q-1', complete_on_commit => true);
SET idempo.clock_offset = '400 days';
SELECT outcome, attempt FROM idempo.claim('pay', 'q-1');
RESET idempo.clock_offset;

-- A person releases a remembered key on purpose: recorded as a closed review (and an event in an
-- audited scope); the next claim acquires it.
SELECT outcome FROM idempo.claim('pay', 'r-1', '{"x":1}', complete_on_commit => true);
SELECT regress.err($$SELECT idempo.release('pay', 'r-1', 'alice')$$);  -- its result is still stored
SET idempo.clock_offset = '2 days';
SELECT outcome FROM idempo.claim('pay', 'r-1', '{"x":1}');
SELECT regress.err($$SELECT idempo.release('pay', 'r-1', '')$$);
SELECT regress.err($$SELECT idempo.release('pay', 'no-such-key', 'alice')$$);
SELECT regress.err($$SELECT idempo.release('no-such-scope', 'r-1', 'alice')$$);
SELECT idempo.release('pay', 'r-1', 'alice', 'the customer asked for a second payment') > 0 AS released;
SELECT key, reason, resolution, resolved_by, note, (operation).status AS status_released,
       resolved_at = opened_at AS closed_at_once
FROM idempo.reviews WHERE scope = 'pay' AND key = 'r-1';
SELECT key, from_status, action FROM idempo.events WHERE scope = 'pay' AND key = 'r-1' ORDER BY id;
SELECT outcome, attempt FROM idempo.claim('pay', 'r-1', '{"x":1}');
SELECT regress.err($$SELECT idempo.release('pay', 'r-1', 'alice')$$);  -- in progress now
RESET idempo.clock_offset;

-- A remembered key cannot be put in review: resolved, it would answer replay with a NULL result
-- (its result is gone) where it answers expired.  A finished record whose result is still there
-- can, and keeps its result through the review.  idempo.stats counts remembered keys apart.
SELECT outcome FROM idempo.claim('pay', 'v-1', '{"x":1}', complete_on_commit => true);
SELECT outcome FROM idempo.claim('pay', 'v-2', '{"x":1}');
SELECT idempo.complete('pay', 'v-2', 1, result => '{"paid":true}');
SET idempo.clock_offset = '2 days';
SELECT outcome FROM idempo.claim('pay', 'v-1', '{"x":1}');
SELECT succeeded, remembered FROM idempo.stats WHERE scope = 'pay';
SELECT regress.err($$SELECT idempo.request_review('pay', 'v-1', 'was it paid twice?')$$);
SELECT outcome, status, result FROM idempo.claim('pay', 'v-1', '{"x":1}');
-- v-2 is past expires_at but not shrunk yet (no claim, no sweep): a claim would answer expired,
-- so it is refused too (resolved, it would replay its expired result for a fresh retention)
SELECT status, result IS NOT NULL AS has_result, sweep_at > expires_at AS shrunk FROM idempo.lookup('pay', 'v-2');
SELECT regress.err($$SELECT idempo.request_review('pay', 'v-2', 'was it paid twice?')$$);
RESET idempo.clock_offset;
SELECT idempo.request_review('pay', 'v-2', 'was it paid twice?') > 0 AS in_review;
SELECT succeeded, in_review, remembered FROM idempo.stats WHERE scope = 'pay';
SELECT idempo.resolve('pay', 'v-2', 'succeeded', 'bob', target_ref => 'TX-9');
SELECT outcome, status, target_ref, result FROM idempo.claim('pay', 'v-2', '{"x":1}');

-- Hashed keys: the same, with the key's digest stored.
SELECT name FROM idempo.create_scope('hashed', hash_keys => true, remember => '30 days');
SELECT outcome FROM idempo.claim('hashed', 'secret-1', complete_on_commit => true);
SET idempo.clock_offset = '2 days';
SELECT outcome FROM idempo.claim('hashed', 'secret-1');
SELECT idempo.release('hashed', 'secret-1', 'alice') > 0 AS released;
SELECT outcome FROM idempo.claim('hashed', 'secret-1');
RESET idempo.clock_offset;

-- A changed remember applies to the keys remembered so far too.  Set to 0, they are forgotten:
-- secret-2 (already remembered) and secret-3 (not yet shrunk) both start afresh.
SELECT outcome FROM idempo.claim('hashed', 'secret-2', complete_on_commit => true);
SELECT outcome FROM idempo.claim('hashed', 'secret-3', complete_on_commit => true);
SET idempo.clock_offset = '2 days';
SELECT outcome FROM idempo.claim('hashed', 'secret-2');
RESET idempo.clock_offset;
SELECT name, remember FROM idempo.alter_scope('hashed', remember => '0');
SET idempo.clock_offset = '3 days';
SELECT outcome FROM idempo.claim('hashed', 'secret-2');
SELECT outcome FROM idempo.claim('hashed', 'secret-3');
RESET idempo.clock_offset;

-- Made longer, a key remembered under the old period is remembered for the new one: it must not
-- be forgotten (and its action run again) at the old horizon.  (Before: acquired at +12 days.)
SELECT name FROM idempo.create_scope('longer', retention => '1 day', remember => '10 days');
SELECT outcome FROM idempo.claim('longer', 'k1', '{"qty":1}', complete_on_commit => true);
SET idempo.clock_offset = '2 days';
SELECT outcome FROM idempo.claim('longer', 'k1', '{"qty":1}');
RESET idempo.clock_offset;
SELECT name, remember FROM idempo.alter_scope('longer', remember => '1 year');
SET idempo.clock_offset = '12 days';
SELECT outcome, status FROM idempo.claim('longer', 'k1', '{"qty":1}');
SELECT * FROM idempo.sweep(100);
SELECT outcome, status FROM idempo.claim('longer', 'k1', '{"qty":1}');
-- and made shorter, it is forgotten at the new horizon: the sweep purges it
SELECT name, remember FROM idempo.alter_scope('longer', remember => '5 days');
SELECT * FROM idempo.sweep(100);
SELECT count(*) AS kept FROM idempo.operations WHERE scope = 'longer';
RESET idempo.clock_offset;

SELECT name FROM idempo.counters() WHERE name = 'claims_expired' AND value > 0;
SELECT * FROM idempo.check_consistency();
