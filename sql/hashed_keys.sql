-- hash_keys: every function that takes a key takes the clear key and finds the record stored
-- under its digest; the clear key is stored nowhere (operations, reviews, conflicts, events).
-- (verify is in verify_settle.sql)
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('pii', hash_keys => true, audit => true, store_params => true,
                                     lease => '1 minute', verify_settle => '1 minute');
CREATE FUNCTION pg_temp.digest(k text) RETURNS text LANGUAGE sql AS
  $$ SELECT encode(sha256(convert_to(k, 'UTF8')), 'hex') $$;

-- claim, complete (attempt given and attempt NULL), fail, lookup
SELECT outcome, attempt FROM idempo.claim('pii', 'alice@example.com', '{"a":1}');
SELECT idempo.complete('pii', 'alice@example.com', 1, '{"ok":1}');
BEGIN;
SELECT outcome, attempt FROM idempo.claim('pii', 'bob@example.com', '{"a":1}');
SELECT idempo.complete('pii', 'bob@example.com', result => '{"ok":2}');
COMMIT;
SELECT outcome, attempt FROM idempo.claim('pii', 'carol@example.com', '{"a":1}');
SELECT idempo.fail('pii', 'carol@example.com', 1, 'no stock', retryable => true);
BEGIN;
SELECT outcome, attempt FROM idempo.claim('pii', 'carol@example.com', '{"a":1}');
SELECT idempo.fail('pii', 'carol@example.com', error => 'no stock', retryable => false);
COMMIT;
SELECT key = pg_temp.digest('carol@example.com') AS digest, status, error
FROM idempo.lookup('pii', 'carol@example.com');
SELECT key = idempo.stored_key('pii', 'alice@example.com') AS stored_key_agrees, status, result
FROM idempo.lookup('pii', 'alice@example.com');

-- request_review and resolve
SELECT outcome FROM idempo.claim('pii', 'dave@example.com', '{"a":1}');
SELECT idempo.request_review('pii', 'dave@example.com', 'hold') > 0 AS opened;
SELECT idempo.resolve('pii', 'dave@example.com', 'not_executed', 'reviewer');
SELECT key = pg_temp.digest('dave@example.com') AS digest, status FROM idempo.lookup('pii', 'dave@example.com');

-- a conflict, recorded under the digest
SELECT outcome FROM idempo.claim('pii', 'alice@example.com', '{"a":2}');
SELECT key = pg_temp.digest('alice@example.com') AS digest, occurrences FROM idempo.conflicts;

-- the clear keys are nowhere
SELECT (SELECT count(*) FROM idempo.operations WHERE key LIKE '%@%') AS in_operations,
       (SELECT count(*) FROM idempo.reviews WHERE key LIKE '%@%' OR operation::text LIKE '%@%') AS in_reviews,
       (SELECT count(*) FROM idempo.conflicts WHERE key LIKE '%@%') AS in_conflicts,
       (SELECT count(*) FROM idempo.events WHERE key LIKE '%@%') AS in_events,
       (SELECT count(*) FROM idempo.events WHERE key IN (pg_temp.digest('alice@example.com'),
            pg_temp.digest('bob@example.com'), pg_temp.digest('carol@example.com'),
            pg_temp.digest('dave@example.com'))) > 0 AS events_by_digest;
-- errors name the digest, not the key
SELECT regress.err($$SELECT idempo.complete('pii', 'erin@example.com', 1)$$) LIKE '%' || pg_temp.digest('erin@example.com') || '%' AS complete_names_digest;
SELECT regress.err($$SELECT idempo.request_review('pii', 'erin@example.com', 'x')$$) LIKE '%' || pg_temp.digest('erin@example.com') || '%' AS review_names_digest;
SELECT regress.err($$SELECT idempo.resolve('pii', 'erin@example.com', 'failed', 'me')$$) LIKE '%' || pg_temp.digest('erin@example.com') || '%' AS resolve_names_digest;
SELECT * FROM idempo.check_consistency();
