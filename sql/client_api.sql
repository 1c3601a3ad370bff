-- The SQL API the client libraries need: idempo.version(), claim(..., lease),
-- heartbeat().  Leases are shown as lease_expires_at - last_attempt_at (the claim's now).
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

-- version(): the installed SQL objects, for everyone
SELECT idempo.version();
SELECT has_function_privilege('public', 'idempo.version()', 'EXECUTE') AS public_may;

SELECT name FROM idempo.create_scope('lease.s', lease => '5 minutes', retention => '1 day');
SELECT name FROM idempo.create_scope('lease.retry', lease => '5 minutes', retention => '1 day',
                                     on_lease_expiry => 'retry');
CREATE FUNCTION regress.lease_of(s text, k text) RETURNS interval LANGUAGE sql AS
$$ SELECT lease_expires_at - last_attempt_at FROM idempo.operations WHERE scope = s AND key = k $$;

-- per-claim lease: this attempt's lease instead of the scope's; none given: the scope's
SELECT outcome, attempt FROM idempo.claim('lease.s', 'k1', lease => '2 hours');
SELECT regress.lease_of('lease.s', 'k1');
SELECT outcome, attempt FROM idempo.claim('lease.s', 'k2');
SELECT regress.lease_of('lease.s', 'k2');
SELECT outcome, attempt FROM idempo.claim('lease.s', 'k3', lease => NULL);
SELECT regress.lease_of('lease.s', 'k3');
-- the returned lease_expires_at is the one written
CREATE TEMP TABLE k4 AS SELECT * FROM idempo.claim('lease.s', 'k4', lease => '90 seconds');
SELECT k4.lease_expires_at = o.lease_expires_at AS same, regress.lease_of('lease.s', 'k4')
FROM k4, idempo.operations o WHERE o.scope = 'lease.s' AND o.key = 'k4';

-- re-claims: each claim that acquires takes its own lease (or the scope's)
SELECT idempo.fail('lease.s', 'k1', 1, 'timeout', retryable => true);
SELECT outcome, attempt FROM idempo.claim('lease.s', 'k1');
SELECT regress.lease_of('lease.s', 'k1');
SELECT idempo.fail('lease.s', 'k1', 2, 'timeout', retryable => true);
SELECT outcome, attempt FROM idempo.claim('lease.s', 'k1', lease => '10 minutes');
SELECT regress.lease_of('lease.s', 'k1');

-- a claim of a key this transaction acquired answers the same attempt, its lease unchanged
BEGIN;
SELECT outcome, attempt FROM idempo.claim('lease.s', 'k5', lease => '1 hour');
SELECT outcome, attempt FROM idempo.claim('lease.s', 'k5', lease => '3 hours');
SELECT regress.lease_of('lease.s', 'k5');
COMMIT;

-- complete_on_commit: the attempt has no lease, whatever lease says
SELECT outcome, status, lease_expires_at IS NULL AS no_lease
FROM idempo.claim('lease.s', 'k6', complete_on_commit => true, lease => '1 hour');

-- a live lease longer than the scope's: the next claim is busy, past the scope's lease too
SET idempo.clock_offset = '30 minutes';
SELECT outcome, attempt FROM idempo.claim('lease.s', 'k5');
-- 'retry' scope: the next attempt once the claim's own lease has run out, with its own lease
RESET idempo.clock_offset;
SELECT outcome, attempt FROM idempo.claim('lease.retry', 'r1', lease => '1 minute');
SET idempo.clock_offset = '2 minutes';
SELECT outcome, attempt FROM idempo.claim('lease.retry', 'r1', lease => '20 minutes');
SELECT regress.lease_of('lease.retry', 'r1');

-- the verification lease of an unknown outcome is the claim's lease too
RESET idempo.clock_offset;
SELECT outcome, attempt FROM idempo.claim('lease.s', 'u1', lease => '1 minute');
SET idempo.clock_offset = '2 minutes';
SELECT outcome, status FROM idempo.claim('lease.s', 'u1', lease => '45 minutes');
SELECT lease_expires_at - idempo.now() BETWEEN '44 minutes' AND '45 minutes' AS verification_lease
FROM idempo.operations WHERE scope = 'lease.s' AND key = 'u1';
RESET idempo.clock_offset;

-- bounds: positive, shorter than the scope's retention (as the scope's own lease)
SELECT regress.err($$SELECT idempo.claim('lease.s', 'b1', lease => '0')$$);
SELECT regress.err($$SELECT idempo.claim('lease.s', 'b1', lease => '-1 minute')$$);
SELECT regress.err($$SELECT idempo.claim('lease.s', 'b1', lease => '1 day')$$);
SELECT regress.err($$SELECT idempo.claim('lease.s', 'b1', lease => '2 months')$$);
SELECT regress.err($$SELECT idempo.claim('lease.s', 'b1', lease => '1 mon -40 days')$$);
SELECT regress.err($$SELECT idempo.claim('lease.s', 'b1', lease => '1 day -23 hours')$$);
SELECT count(*) AS nothing_written FROM idempo.operations WHERE scope = 'lease.s' AND key = 'b1';

-- heartbeat(scope, key, attempt, extend): a running attempt extends its lease
CREATE FUNCTION regress.err_t(stmt text) RETURNS text LANGUAGE sql AS
$$ SELECT regexp_replace(regress.err(stmt), '\d{4}-\d\d-\d\d [0-9:.+-]+', 'T', 'g') $$;
CREATE FUNCTION regress.left_of(s text, k text) RETURNS interval LANGUAGE sql AS
$$ SELECT date_trunc('minute', lease_expires_at - idempo.now() + interval '30 seconds')
   FROM idempo.operations WHERE scope = s AND key = k $$;
SELECT name FROM idempo.create_scope('hb.s', lease => '5 minutes', retention => '1 day');
SELECT name FROM idempo.create_scope('hb.retry', lease => '5 minutes', retention => '1 day',
                                     on_lease_expiry => 'retry');
SELECT name FROM idempo.create_scope('hb.hashed', lease => '5 minutes', retention => '1 day',
                                     hash_keys => true);
SELECT outcome, attempt FROM idempo.claim('hb.s', 'h1');
CREATE TEMP TABLE hb AS SELECT idempo.heartbeat('hb.s', 'h1', 1, '1 hour') AS until;
SELECT hb.until = o.lease_expires_at AS returned_written, regress.left_of('hb.s', 'h1'),
       o.sweep_at = o.lease_expires_at AS sweep_follows, o.status
FROM hb, idempo.operations o WHERE o.scope = 'hb.s' AND o.key = 'h1';
-- never shortens: a shorter extend leaves the lease as it is, and returns it
SELECT idempo.heartbeat('hb.s', 'h1', 1, '1 minute') = (SELECT until FROM hb) AS unchanged;
SELECT regress.left_of('hb.s', 'h1');
-- extend NULL: the scope's lease (a claim's own lease is not remembered)
SELECT outcome, attempt FROM idempo.claim('hb.s', 'h2', lease => '1 minute');
SELECT idempo.heartbeat('hb.s', 'h2', 1) IS NOT NULL AS extended, regress.left_of('hb.s', 'h2');
-- the extended lease makes the next claim busy past the old one, and the sweep leaves it
SET idempo.clock_offset = '30 minutes';
SELECT outcome, attempt FROM idempo.claim('hb.s', 'h1');
SELECT lease_expired FROM idempo.sweep();
SELECT status FROM idempo.operations WHERE scope = 'hb.s' AND key = 'h1';
RESET idempo.clock_offset;

-- fenced by attempt, as complete(): superseded 55000, not yet existing 22023, no operation 42704
SELECT outcome, attempt FROM idempo.claim('hb.s', 'h3');
SELECT idempo.fail('hb.s', 'h3', 1, 'timeout', retryable => true);
SELECT outcome, attempt FROM idempo.claim('hb.s', 'h3');
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h3', 1)$$);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h3', 3)$$);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'nobody', 1)$$);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'nobody', NULL)$$);
SELECT regress.err($$SELECT idempo.heartbeat('hb.nowhere', 'h3', 1)$$);
-- attempt NULL outside the transaction that acquired it: refused, naming the attempt
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h3', NULL)$$);
-- not running: finished, retryable, complete_on_commit (never had a lease)
SELECT idempo.complete('hb.s', 'h3', 2);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h3', 2)$$);
SELECT outcome FROM idempo.claim('hb.s', 'h4', complete_on_commit => true);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h4', 1)$$);
SELECT outcome FROM idempo.claim('hb.s', 'h5');
SELECT idempo.fail('hb.s', 'h5', 1, 'timeout', retryable => true);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h5', 1)$$);

-- a lease that ran out is never extended, though nothing has moved the record yet: from that
-- instant a claim may take it over ('retry') or make it unknown
SELECT outcome, attempt FROM idempo.claim('hb.s', 'e1', lease => '1 minute');
SELECT outcome, attempt FROM idempo.claim('hb.retry', 'e2', lease => '1 minute');
SET idempo.clock_offset = '2 minutes';
SELECT regress.err_t($$SELECT idempo.heartbeat('hb.s', 'e1', 1)$$);
SELECT regress.err_t($$SELECT idempo.heartbeat('hb.retry', 'e2', 1, '1 hour')$$);
SELECT scope, key, status, attempt FROM idempo.operations WHERE key IN ('e1', 'e2') ORDER BY 1;
-- moved by the sweep: unknown
SELECT lease_expired FROM idempo.sweep();
SELECT regress.err_t($$SELECT idempo.heartbeat('hb.s', 'e1', 1)$$);
-- taken over by the next attempt
SELECT outcome, attempt FROM idempo.claim('hb.retry', 'e2');
SELECT regress.err($$SELECT idempo.heartbeat('hb.retry', 'e2', 1)$$);
SELECT idempo.heartbeat('hb.retry', 'e2', 2) IS NOT NULL AS the_new_attempt_may;
-- retention over: review, whatever the lease
RESET idempo.clock_offset;
SELECT outcome FROM idempo.claim('hb.s', 'e3');
SELECT idempo.heartbeat('hb.s', 'e3', 1, '23 hours') IS NOT NULL AS extended;
SET idempo.clock_offset = '1 day 1 minute';
SELECT regress.err_t($$SELECT idempo.heartbeat('hb.s', 'e3', 1)$$);
RESET idempo.clock_offset;

-- bounds of extend: those of a claim's lease
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h2', 1, '0')$$);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h2', 1, '-5 minutes')$$);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h2', 1, '1 day')$$);
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h2', 1, '1 day -1 hour')$$);

-- in the transaction that claimed it: attempt NULL is that attempt; complete() afterwards
BEGIN;
SELECT outcome, attempt FROM idempo.claim('hb.s', 't1', lease => '1 minute');
SELECT idempo.heartbeat('hb.s', 't1', NULL, '10 minutes') IS NOT NULL AS extended;
SELECT regress.left_of('hb.s', 't1');
SELECT idempo.complete('hb.s', 't1', result => '{"ok":true}');
COMMIT;
SELECT status, lease_expires_at IS NULL AS no_lease FROM idempo.operations WHERE scope = 'hb.s' AND key = 't1';
-- a read-only transaction cannot extend
BEGIN READ ONLY;
SELECT regress.err($$SELECT idempo.heartbeat('hb.s', 'h2', 1)$$);
ROLLBACK;
-- hash_keys scopes: the key as the caller knows it
SELECT outcome, attempt FROM idempo.claim('hb.hashed', 'customer@example.com', lease => '1 minute');
SELECT idempo.heartbeat('hb.hashed', 'customer@example.com', 1, '20 minutes') IS NOT NULL AS extended;
SELECT regress.left_of('hb.hashed', idempo.stored_key('hb.hashed', 'customer@example.com'));
SELECT regress.err($$SELECT idempo.heartbeat('hb.hashed', 'other@example.com', 1)$$);
SELECT * FROM idempo.check_consistency();
-- the settle window counts from the last heartbeat, as from a claim: a request the worker
-- sent under a heartbeat's lease may still be in flight when it runs out, so an empty lookup
-- is proof only once verify_settle has passed since that heartbeat (counted from the claim,
-- the next attempt would do the action a second time)
SELECT name FROM idempo.create_scope('hb.settle', lease => '1 minute', verify_settle => '10 minutes');
SELECT outcome, attempt FROM idempo.claim('hb.settle', 's1');
DO $$ BEGIN
    FOR i IN 1..30 LOOP   -- every 50 seconds for 25 minutes
        PERFORM set_config('idempo.clock_offset', (i * 50) || ' seconds', false);
        PERFORM idempo.heartbeat('hb.settle', 's1', 1, '1 minute');
    END LOOP;
END $$;
SELECT date_trunc('minute', last_attempt_at - first_seen_at) AS counts_from,
       date_trunc('minute', lease_expires_at - first_seen_at) AS lease_until
  FROM idempo.operations WHERE scope = 'hb.settle' AND key = 's1';
SET idempo.clock_offset = '27 minutes';
SELECT outcome, status, attempt FROM idempo.claim('hb.settle', 's1');
SET client_min_messages = warning;   -- the NOTICE names the time the window ends
SELECT idempo.verify('hb.settle', 's1', 1, found => false) AS inside_settle_window;
RESET client_min_messages;
SELECT outcome, status, attempt FROM idempo.claim('hb.settle', 's1');
SET idempo.clock_offset = '36 minutes';
SELECT idempo.verify('hb.settle', 's1', 1, found => false) AS after_it;
SELECT outcome, attempt FROM idempo.claim('hb.settle', 's1');
RESET idempo.clock_offset;
SELECT * FROM idempo.check_consistency();
