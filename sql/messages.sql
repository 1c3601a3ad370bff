-- What a new user was told, and what they are told now: each refusal names the real cause; the
-- clock offset takes any interval; waits are never negative; reviews say why they were opened.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

-- SQLSTATE, message, detail and hint of a refused statement, or 'ok'
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; detail text; hint text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL,
                            hint = PG_EXCEPTION_HINT;
    RETURN st || ': ' || msg || coalesce(E'\nDETAIL: ' || nullif(detail, ''), '')
        || coalesce(E'\nHINT: ' || nullif(hint, ''), '');
END $$;

SELECT name FROM idempo.create_scope('m', retention => '1 hour', lease => '1 minute');
SELECT name FROM idempo.create_scope('m.hashed', hash_keys => true);

-- complete/fail of a key nobody claimed: there is no such operation (not "pass attempt =>")
SELECT pg_temp.err($$SELECT idempo.complete('m', 'never-claimed')$$);
SELECT pg_temp.err($$SELECT idempo.fail('m', 'never-claimed')$$);
-- a key claimed elsewhere: this transaction has no attempt of it, and the detail says which exists
SELECT outcome FROM idempo.claim('m', 'claimed-elsewhere');
SELECT pg_temp.err($$SELECT idempo.complete('m', 'claimed-elsewhere')$$);

-- a run id passed by position lands in fingerprint (the 4th argument): say so
SELECT pg_temp.err($$SELECT idempo.claim('m', 'k', NULL, 'run-42')$$);
SELECT pg_temp.err($$SELECT idempo.claim('m', 'k', '{"qty":1}', 'run-42')$$);
-- fingerprint passed by name with params: the message does not assume a run id by position
SELECT pg_temp.err($$SELECT idempo.claim('m', 'k', params => '{"qty":1}', fingerprint => idempo.fingerprint('{"qty":1}'))$$);
SELECT pg_temp.err($$SELECT idempo.claim('m', 'k', fingerprint => '\x01')$$);
SELECT pg_temp.err($$SELECT idempo.claim('m', 'k', fingerprint => '\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2021')$$);
SELECT outcome FROM idempo.claim('m', 'k', NULL, NULL, 'run-42');

-- an over-long key in a hash_keys scope is not told to use a hash_keys scope
SELECT pg_temp.err($$SELECT idempo.claim('m.hashed', repeat('x', 1025))$$);
SELECT pg_temp.err($$SELECT idempo.claim('m', repeat('x', 1025))$$);

-- idempo.clock_offset takes what an interval takes (a bare number: seconds, as before)
CREATE FUNCTION pg_temp.offset_s(setting text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('idempo.clock_offset', setting, true);
    RETURN round(extract(epoch FROM idempo.now() - clock_timestamp()));
END $$;
SELECT s AS setting, pg_temp.offset_s(s) AS seconds
FROM unnest(ARRAY['2 hours', '5min 1s', '6min', '90', '-3600', '-1 day', '1 day 2 hours', 'PT2H',
                  '1 week', '1.5 hours', '2h', '0']) AS s;  -- '1 mon': a calendar month (calendar_time)
SELECT pg_temp.err($$SET idempo.clock_offset = 'soon'$$);
SELECT pg_temp.err($$SET idempo.clock_offset = 'infinity'$$);
SELECT pg_temp.err($$SET idempo.clock_offset = '200 years'$$);
SELECT pg_temp.err($$SET idempo.clock_offset = ''$$);
SET idempo.clock_offset = '5min 1s';
SHOW idempo.clock_offset;
RESET idempo.clock_offset;
SHOW idempo.clock_offset;

-- Waits are never negative, even for what was recorded under a clock offset; a review opened
-- because the retention ran out says so, whether a claim (lost-1) or the sweep (lost-2) opened it.
SELECT outcome FROM idempo.claim('m', 'lost-1', '{"v":1}');
SELECT outcome FROM idempo.claim('m', 'lost-2');
SET idempo.clock_offset = '2 hours';
SELECT outcome, status FROM idempo.claim('m', 'lost-1', '{"v":1}');
SELECT outcome FROM idempo.claim('m', 'lost-1', '{"v":2}');
SELECT lease_expired, moved_to_review FROM idempo.sweep();
RESET idempo.clock_offset;
SELECT key, reason, waiting, regexp_replace(detail, 'first seen .*\)$', 'first seen ...)') AS detail
FROM idempo.review_queue ORDER BY key;
SELECT scope, open_reviews, oldest_review_wait FROM idempo.stats WHERE scope = 'm';
SELECT key, waiting FROM idempo.conflict_queue;
SELECT bool_and(detail LIKE '%(first seen ' || first_seen_at || ')') AS detail_names_first_seen
FROM idempo.review_queue;

-- grammar of the refusals of finished operations ("it is succeeded" before)
SELECT outcome FROM idempo.claim('m', 'done', complete_on_commit => true);
SELECT pg_temp.err($$SELECT idempo.complete('m', 'done', 1)$$);
SELECT outcome FROM idempo.claim('m', 'given-up');
SELECT idempo.fail('m', 'given-up', 1, 'out of stock', retryable => false);
SELECT pg_temp.err($$SELECT idempo.fail('m', 'given-up', 1)$$);
SELECT pg_temp.err($$SELECT idempo.verify('m', 'done', 1, true)$$);
SELECT pg_temp.err($$SELECT idempo.resolve('m', 'done', 'failed', 'alice')$$);
SELECT pg_temp.err($$SELECT idempo.complete('m', 'lost-1', 1)$$);

SELECT * FROM idempo.check_consistency();
