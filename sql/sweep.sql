-- idempo.sweep(): lease expiry, retention to review, purge, rescheduling, batches.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;


SELECT name FROM idempo.create_scope('s', retention => '1 hour', lease => '1 minute', audit => true);
SELECT name FROM idempo.create_scope('s.retry', retention => '1 hour', lease => '1 minute', on_lease_expiry => 'retry');

SELECT count(*) FROM (
    SELECT idempo.claim('s', 'running-' || i) FROM generate_series(1, 3) i
    UNION ALL SELECT idempo.claim('s.retry', 'retry-1')
    UNION ALL SELECT idempo.claim('s', 'done-' || i, complete_on_commit => true) FROM generate_series(1, 5) i
    UNION ALL SELECT idempo.claim('s', 'failed-1')) c;
SELECT idempo.fail('s', 'failed-1', 1, 'no effect');

-- nothing is due yet
SELECT * FROM idempo.sweep();

-- two minutes later: leases ran out
SET idempo.clock_offset = '2min';
SELECT * FROM idempo.sweep();
SELECT scope, key, status, lease_expires_at IS NULL AS lease_cleared FROM idempo.operations
WHERE status <> 'succeeded' ORDER BY scope, key;
SELECT * FROM idempo.sweep();

-- two hours later: unfinished work goes to review, finished records are purged
SET idempo.clock_offset = '2h';
SELECT * FROM idempo.sweep(batch => 4);
SELECT * FROM idempo.sweep(batch => 4);
SELECT * FROM idempo.sweep(batch => 4);
SELECT scope, key, status FROM idempo.operations ORDER BY scope, key;
SELECT key, reason, snapshot->>'status' AS status_at_entry FROM idempo.review_queue ORDER BY key;
SELECT key, from_status, to_status, action FROM idempo.events WHERE action = 'sweep' ORDER BY id;

-- in_review rows are never touched again by the sweep
SET idempo.clock_offset = '30h';
SELECT * FROM idempo.sweep();
SELECT count(*) AS in_review FROM idempo.operations WHERE status = 'in_review';
RESET idempo.clock_offset;

-- sweep_at may be early: a completed record is rescheduled to its expiry, not purged
SELECT outcome FROM idempo.claim('s', 'late');
SELECT idempo.complete('s', 'late', 1);
SET idempo.clock_offset = '2min';
SELECT * FROM idempo.sweep();
SELECT status, sweep_at = expires_at AS rescheduled FROM idempo.operations WHERE key = 'late';
RESET idempo.clock_offset;

-- a shorter retention brings unfinished work's sweep forward
SELECT outcome FROM idempo.claim('s', 'shorter');
SET idempo.clock_offset = '2min';
SELECT outcome FROM idempo.claim('s', 'shorter');
SELECT sweep_at = first_seen_at + interval '1 hour' AS at_old_retention FROM idempo.operations WHERE key = 'shorter';
SELECT name FROM idempo.alter_scope('s', retention => '10 minutes');
SELECT sweep_at = first_seen_at + interval '10 minutes' AS moved_forward FROM idempo.operations WHERE key = 'shorter';
SET idempo.clock_offset = '11min';
SELECT * FROM idempo.sweep();
RESET idempo.clock_offset;

-- a review made by hand for a row not in review: the sweep keeps it, and still moves the whole batch
SELECT (idempo.claim('s', 'handmade-' || i)).outcome FROM generate_series(1, 2) i;
INSERT INTO idempo.reviews (scope, key, reason, opened_at, detail)
VALUES ('s', 'handmade-1', 'manual', now(), 'opened by hand');
SET idempo.clock_offset = '2h';
SELECT * FROM idempo.sweep();
SELECT key, status FROM idempo.operations WHERE key LIKE 'handmade-%' ORDER BY key;
SELECT key, reason, regexp_replace(detail, '\(first seen .*\)$', '(first seen ...)') AS detail
FROM idempo.reviews WHERE key LIKE 'handmade-%' AND resolved_at IS NULL ORDER BY key;
RESET idempo.clock_offset;

-- an error while opening reviews (here a trigger refusing them) reaches the caller whole: its
-- handler runs as the caller, and nothing of the batch is kept
CREATE FUNCTION regress.refuse_review() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'reviews refused'; END $$;
CREATE TRIGGER refuse BEFORE INSERT ON idempo.reviews FOR EACH ROW EXECUTE FUNCTION regress.refuse_review();
SELECT (idempo.claim('s', 'refused')).outcome;
CREATE ROLE regress_idempo_sweep_caller;
GRANT USAGE ON SCHEMA idempo TO regress_idempo_sweep_caller;
GRANT EXECUTE ON FUNCTION idempo.sweep(integer) TO regress_idempo_sweep_caller;
SET idempo.clock_offset = '2h';
SET ROLE regress_idempo_sweep_caller;
DO $$
BEGIN
    PERFORM idempo.sweep();
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'caught "%" as %', SQLERRM, current_user;
END $$;
SELECT current_user;
RESET ROLE;
SELECT regress.err($$SELECT * FROM idempo.sweep()$$);
SELECT key, status FROM idempo.operations WHERE key = 'refused';
DROP TRIGGER refuse ON idempo.reviews;
SELECT * FROM idempo.sweep();
SELECT key, status FROM idempo.operations WHERE key = 'refused';
RESET idempo.clock_offset;
REVOKE ALL ON SCHEMA idempo FROM regress_idempo_sweep_caller;
REVOKE ALL ON FUNCTION idempo.sweep(integer) FROM regress_idempo_sweep_caller;
DROP ROLE regress_idempo_sweep_caller;

-- bad batch sizes
SELECT regress.err($$SELECT * FROM idempo.sweep(0)$$);
SELECT regress.err($$SELECT * FROM idempo.sweep(NULL)$$);
SELECT regress.err($$SELECT * FROM idempo.sweep(1000000)$$);

-- a read-only transaction: refused with 25006, saying why (not PostgreSQL's FOR UPDATE message)
BEGIN READ ONLY;
SELECT regress.err($$SELECT * FROM idempo.sweep()$$);
ROLLBACK;

SELECT * FROM idempo.check_consistency();
