-- The SQL API the client libraries need (issue 28): idempo.version(), claim(..., lease),
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
SELECT * FROM idempo.check_consistency();
