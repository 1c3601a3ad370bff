-- verify(found => false) frees a key only after the settle window measured from the end of
-- the LAST attempt's lease: on attempt 2 an empty lookup shortly after its lease ran out is not
-- proof, even though the first attempt is long past (first_seen_at + verify_settle is over).
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
-- 6 minutes after attempt 2 (36 after the first), 1 after its lease's end: inside its settle window
\set VERBOSITY terse
SELECT idempo.verify('wh', 'order-1', 2, found => false);
\set VERBOSITY default
SELECT status, attempt FROM idempo.lookup('wh', 'order-1');
SELECT outcome, status FROM idempo.claim('wh', 'order-1', '{"qty":1}');
-- 11 minutes after attempt 2's lease ran out: now an empty lookup counts as not executed
SET idempo.clock_offset = '46min';
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

-- The settle window counts from the END of the attempt's lease, the last moment it could act:
-- a worker may send its request at any time under its lease.  Claimed at t0 (lease 5 minutes,
-- settle 1 minute), it sends at t0+4:50 and dies; the request lands at t0+5:30.  An empty
-- lookup at t0+5:05 is not proof: counted from the claim, verify would free the key and
-- attempt 2 would do the action a second time.  Each way the lease's end is noticed: by a
-- claim, by the sweep, by verify itself; with a per-claim lease and after a heartbeat.
SELECT name FROM idempo.create_scope('late', lease => '5 minutes', verify_settle => '1 minute');
SELECT outcome, attempt FROM idempo.claim('late', 'by-claim', '{"qty":1}');
SELECT outcome, attempt FROM idempo.claim('late', 'by-sweep', '{"qty":1}');
SELECT outcome, attempt FROM idempo.claim('late', 'by-verify', '{"qty":1}');
SELECT outcome, attempt FROM idempo.claim('late', 'long-lease', '{"qty":1}', lease => '1 hour');
SELECT outcome, attempt FROM idempo.claim('late', 'heartbeat', '{"qty":1}');
SET idempo.clock_offset = '50s';
SELECT idempo.heartbeat('late', 'heartbeat', 1, '5 minutes') IS NOT NULL AS extended;
SET idempo.clock_offset = '5min 5s';
SELECT outcome, status, attempt FROM idempo.claim('late', 'by-claim', '{"qty":1}');
-- the empty lookups, 5 seconds after the lease ran out: not proof, the keys stay unknown
SET client_min_messages = warning;   -- the NOTICE names the time the window ends
SELECT idempo.verify('late', 'by-verify', 1, found => false) AS by_verify;
SELECT lease_expired FROM idempo.sweep();
SELECT outcome, status, attempt FROM idempo.claim('late', 'by-sweep', '{"qty":1}');
SELECT key, status, date_trunc('second', last_attempt_at - first_seen_at) AS could_act_until
  FROM idempo.operations WHERE scope = 'late' ORDER BY key;
SELECT idempo.verify('late', 'by-claim', 1, found => false) AS by_claim,
       idempo.verify('late', 'by-sweep', 1, found => false) AS by_sweep;
RESET client_min_messages;
SELECT key, outcome, status, attempt FROM unnest(array['by-claim', 'by-sweep', 'by-verify']) AS k(key),
       LATERAL idempo.claim('late', k.key, '{"qty":1}') ORDER BY key;
-- an hour's lease: the same, an hour later
SET idempo.clock_offset = '1h 5s';
SELECT outcome, status, attempt FROM idempo.claim('late', 'long-lease', '{"qty":1}');
SET client_min_messages = warning;
SELECT idempo.verify('late', 'long-lease', 1, found => false) AS long_lease;
RESET client_min_messages;
SELECT outcome, status, attempt FROM idempo.claim('late', 'long-lease', '{"qty":1}');
-- the heartbeat's lease ran out at 5:50: a lookup at 5:55 is inside the window, at 6:50 after it
SET idempo.clock_offset = '5min 55s';
SELECT outcome, status, attempt FROM idempo.claim('late', 'heartbeat', '{"qty":1}');
SET client_min_messages = warning;
SELECT idempo.verify('late', 'heartbeat', 1, found => false) AS heartbeat;
RESET client_min_messages;
-- a minute after the lease's end, the empty lookups are believed: attempt 2
SET idempo.clock_offset = '6min 5s';
SELECT idempo.verify('late', 'by-claim', 1, found => false) AS by_claim,
       idempo.verify('late', 'by-sweep', 1, found => false) AS by_sweep,
       idempo.verify('late', 'by-verify', 1, found => false) AS by_verify;
SELECT key, outcome, attempt FROM unnest(array['by-claim', 'by-sweep', 'by-verify']) AS k(key),
       LATERAL idempo.claim('late', k.key, '{"qty":1}') ORDER BY key;
SET idempo.clock_offset = '6min 50s';
SELECT outcome, status, attempt FROM idempo.claim('late', 'heartbeat', '{"qty":1}');
SELECT idempo.verify('late', 'heartbeat', 1, found => false) AS heartbeat;
SELECT outcome, attempt FROM idempo.claim('late', 'heartbeat', '{"qty":1}');
SET idempo.clock_offset = '1h 1min 5s';
SELECT idempo.verify('late', 'long-lease', 1, found => false) AS long_lease;
SELECT outcome, attempt FROM idempo.claim('late', 'long-lease', '{"qty":1}');
RESET idempo.clock_offset;
SELECT * FROM idempo.check_consistency();
