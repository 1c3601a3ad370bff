-- Scopes and helpers of test/bench/soak, in database "soak".  Retention of one minute everywhere,
-- so that the sweeper purges, expires leases and opens reviews the whole run.
--   soak        new keys (one-call), replays and conflicts on keys reused for 5 s, failures retried
--   soak_lease  leases of 2 s that workers let run out (claimed, never finished): the sweeper turns
--               them unknown; soak_verify() settles them as a person or a job would, and what is not
--               settled within retention goes to review, which soak_review() resolves.
SELECT idempo.create_scope('soak', retention => '1 minute', lease => '30 seconds', verify_settle => '30 seconds') \gset
SELECT idempo.create_scope('soak_lease', retention => '1 minute', lease => '2 seconds',
                           verify_settle => '10 seconds') \gset

-- claim a key of the failing pool; if this attempt is ours, it fails (retryable: the next claim of
-- the key, a few seconds later, acquires attempt n + 1).
CREATE FUNCTION soak_fail(k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE c idempo.claim_result;
BEGIN
  c := idempo.claim('soak', k, params => '{"sku": "B-1", "qty": 1}');
  IF c.outcome = 'acquired' THEN
    PERFORM idempo.fail('soak', k, c.attempt, error => 'carrier timeout', retryable => true);
  END IF;
  RETURN c.outcome;
END $$;

-- settle the three oldest unknown attempts: found in the target system (mostly), or not found
-- once they are older than 15 s (then retryable: nobody retries them, so they reach review).
CREATE FUNCTION soak_verify() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE o record; n integer := 0;
BEGIN
  FOR o IN SELECT key, attempt, last_attempt_at FROM idempo.operations
           WHERE scope = 'soak_lease' AND status = 'unknown' AND sweep_at IS NOT NULL
           ORDER BY sweep_at LIMIT 3 FOR UPDATE SKIP LOCKED LOOP
    PERFORM idempo.verify('soak_lease', o.key, o.attempt,
                          found => NOT (random() < 0.3 AND o.last_attempt_at < now() - interval '15 seconds'),
                          target_ref => 'T-' || o.key);
    n := n + 1;
  END LOOP;
  RETURN n;
END $$;

-- a person's review work: up to five open reviews (by key order: the open-review index), decided
-- 'failed' (final: the record is purged when its retention ends; 'not_executed' would make it
-- retryable with a fresh retention and, nobody retrying, bring it back to review a minute later),
-- and up to five open conflicts, dismissed.
CREATE FUNCTION soak_review() RETURNS integer LANGUAGE plpgsql AS $$
DECLARE r record; n integer := 0;
BEGIN
  FOR r IN SELECT scope, key FROM idempo.reviews WHERE resolved_at IS NULL
           ORDER BY scope, key LIMIT 5 FOR UPDATE SKIP LOCKED LOOP
    PERFORM idempo.resolve(r.scope, r.key, 'failed', 'soak', note => 'soak test');
    n := n + 1;
  END LOOP;
  FOR r IN SELECT id FROM idempo.conflicts WHERE resolved_at IS NULL
           ORDER BY scope, key LIMIT 5 FOR UPDATE SKIP LOCKED LOOP
    PERFORM idempo.resolve_conflict(r.id, 'dismissed', 'soak', 'soak test');
  END LOOP;
  RETURN n;
END $$;
