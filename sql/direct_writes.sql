-- The writes of direct.c (a new key's record, the finish of an attempt this transaction inserted)
-- around savepoints, repeated calls and one-statement use.  test/run runs the whole regression
-- suite a second time with idempo.direct_writes = off: both paths must give these same answers.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('dw', retention => '1 day', lease => '5 minutes');

-- claim and complete in one statement (the record is younger than the statement's snapshot)
SELECT (idempo.claim('dw', 'one-statement')).outcome, idempo.complete('dw', 'one-statement', result => '{"n":1}');
SELECT status, result FROM idempo.operations WHERE key = 'one-statement';

-- a completion rolled back to a savepoint: the record is in_progress again, and finishes later
BEGIN;
SELECT (idempo.claim('dw', 'sp-1', '{"a":1}')).outcome;
SAVEPOINT s;
SELECT idempo.complete('dw', 'sp-1', result => '{"first":true}');
ROLLBACK TO SAVEPOINT s;
SELECT status, result FROM idempo.operations WHERE key = 'sp-1';
SELECT idempo.fail('dw', 'sp-1', error => 'timeout', retryable => true);
SELECT status, error FROM idempo.operations WHERE key = 'sp-1';
COMMIT;
SELECT status, error, lease_expires_at IS NULL AS lease_cleared FROM idempo.operations WHERE key = 'sp-1';

-- a completion inside a savepoint that is released, then a second completion is refused
BEGIN;
SELECT (idempo.claim('dw', 'sp-2')).outcome;
SAVEPOINT s;
SELECT idempo.complete('dw', 'sp-2', result => '{"ok":1}', target_ref => 'T-2');
RELEASE SAVEPOINT s;
SELECT regress.err($$SELECT idempo.complete('dw', 'sp-2', result => '{"ok":2}')$$);
COMMIT;
SELECT status, result, target_ref FROM idempo.operations WHERE key = 'sp-2';

-- the claim itself rolled back: nothing to finish, and the key is free again
BEGIN;
SAVEPOINT s;
SELECT (idempo.claim('dw', 'sp-3')).outcome;
ROLLBACK TO SAVEPOINT s;
SELECT regress.err($$SELECT idempo.complete('dw', 'sp-3')$$);
SELECT (idempo.claim('dw', 'sp-3')).outcome;
SELECT idempo.complete('dw', 'sp-3');
COMMIT;
SELECT status, attempt FROM idempo.operations WHERE key = 'sp-3';

-- retryable, re-acquired and completed in the same transaction (attempt 2 is an update, not an insert)
BEGIN;
SELECT (idempo.claim('dw', 'again')).attempt;
SELECT idempo.fail('dw', 'again', error => 'busy upstream', retryable => true);
SELECT outcome, attempt FROM idempo.claim('dw', 'again');
SELECT regress.err($$SELECT idempo.complete('dw', 'again', 1)$$);
SELECT idempo.complete('dw', 'again', result => '{"attempt":2}');
COMMIT;
SELECT status, attempt, result, error FROM idempo.operations WHERE key = 'again';

-- complete_on_commit, then an explicit complete of the same attempt stores the result
BEGIN;
SELECT outcome, status FROM idempo.claim('dw', 'on-commit', complete_on_commit => true);
SELECT idempo.complete('dw', 'on-commit', result => '{"late":"result"}', target_ref => 'T-9');
COMMIT;
SELECT status, result, target_ref, expires_at > completed_at AS expires_later FROM idempo.operations WHERE key = 'on-commit';

-- a wrong attempt number is refused with the same explanation on both paths
BEGIN;
SELECT (idempo.claim('dw', 'fence')).attempt;
SELECT regress.err($$SELECT idempo.complete('dw', 'fence', 7)$$);
SELECT idempo.complete('dw', 'fence', 1);
COMMIT;

-- many new keys in one transaction, each completed in a later statement
BEGIN;
SELECT count(*) FILTER (WHERE (idempo.claim('dw', 'bulk-' || i, jsonb_build_object('i', i))).outcome = 'acquired')
FROM generate_series(1, 500) i;
SELECT count(*) FILTER (WHERE idempo.complete('dw', 'bulk-' || i, result => jsonb_build_object('i', i)) = 'succeeded')
FROM generate_series(1, 500) i;
COMMIT;
SELECT count(*), count(*) FILTER (WHERE result->>'i' = substr(key, 6)) AS result_matches,
       count(*) FILTER (WHERE sweep_at <= expires_at) AS sweep_not_late
FROM idempo.operations WHERE key LIKE 'bulk-%';
-- replays and conflicts see the committed records
SELECT (idempo.claim('dw', 'bulk-7', '{"i":7}')).outcome, (idempo.claim('dw', 'bulk-7', '{"i":8}')).outcome;

-- a read-only transaction refuses the writes on both paths
BEGIN READ ONLY;
SELECT regress.err($$SELECT idempo.claim('dw', 'read-only')$$);
SELECT regress.err($$SELECT idempo.claim('dw', 'read-only', wait => false)$$);
COMMIT;
BEGIN;
SELECT (idempo.claim('dw', 'read-only-later')).outcome;
SET TRANSACTION READ ONLY;
SELECT regress.err($$SELECT idempo.complete('dw', 'read-only-later')$$);
ROLLBACK;
SELECT count(*) FROM idempo.operations WHERE key LIKE 'read-only%';

-- a savepoint rolled back after a re-acquisition: the enclosing transaction's attempt is back
BEGIN;
SELECT attempt FROM idempo.claim('dw', 'sp-stack');
SELECT idempo.fail('dw', 'sp-stack', error => 'upstream timeout', retryable => true);
SAVEPOINT a;
SELECT attempt FROM idempo.claim('dw', 'sp-stack');
ROLLBACK TO SAVEPOINT a;
SELECT idempo.complete('dw', 'sp-stack', result => '{"attempt":1}');
COMMIT;
SELECT status, attempt, result FROM idempo.operations WHERE key = 'sp-stack';
-- ... and released: the inner attempt is the transaction's
BEGIN;
SELECT attempt FROM idempo.claim('dw', 'sp-stack-2');
SELECT idempo.fail('dw', 'sp-stack-2', error => 'upstream timeout', retryable => true);
SAVEPOINT a;
SELECT attempt FROM idempo.claim('dw', 'sp-stack-2');
RELEASE SAVEPOINT a;
SELECT idempo.complete('dw', 'sp-stack-2', result => '{"attempt":2}');
COMMIT;
SELECT status, attempt, result FROM idempo.operations WHERE key = 'sp-stack-2';

-- the table truncated in the same transaction: the attempt's record is gone on both paths
BEGIN;
SELECT (idempo.claim('dw', 'truncated')).outcome;
TRUNCATE idempo.operations;
SELECT regress.err($$SELECT idempo.complete('dw', 'truncated')$$);
ROLLBACK;

-- another unique index on the table (a user's, or the copy REINDEX CONCURRENTLY builds of the
-- primary key): the claim of an existing key is still an answer, not a unique violation, also in
-- a fresh session, whose first insert would not look for the key first (optimistic insertion)
SELECT (idempo.claim('dw', 'unique-' || i, complete_on_commit => true)).outcome FROM generate_series(1, 2) i;
CREATE UNIQUE INDEX operations_key_scope_idx ON idempo.operations (key, scope);
\c
SELECT (idempo.claim('dw', 'new-' || i)).outcome FROM generate_series(1, 3) i;
SELECT regress.err($$SELECT (idempo.claim('dw', 'unique-1')).outcome$$);
SELECT (idempo.claim('dw', 'unique-2')).outcome;
DROP INDEX idempo.operations_key_scope_idx;

-- a summarizing (BRIN) index on a column the finish sets, and none on the others it changes: from
-- PostgreSQL 16 on the finish is a HOT update that adds entries to the summarizing indexes alone
-- (before 16 it is not HOT, and every index gets one).  The record is found through the BRIN
-- index, whose summary of the page was taken before the finish.
CREATE INDEX operations_completed_brin ON idempo.operations USING brin (completed_at)
    WITH (pages_per_range = 1, autosummarize = off);
BEGIN;
SELECT (idempo.claim('dw', 'summarized')).outcome;
SELECT brin_summarize_new_values('idempo.operations_completed_brin') IS NOT NULL AS summarized;
SELECT clock_timestamp() AS before_finish \gset
SELECT idempo.complete('dw', 'summarized', result => '{"brin":true}');
SELECT pg_stat_get_xact_tuples_hot_updated('idempo.operations'::regclass) = 1
       OR current_setting('server_version_num')::int < 160000 AS hot_from_16;
SET LOCAL enable_seqscan = off;
SELECT key FROM (SELECT scope, key FROM idempo.operations WHERE completed_at >= :'before_finish' OFFSET 0) s
 WHERE scope = 'dw';
COMMIT;
-- and no entry of the primary key points at the heap-only tuple (the HOT chain's root has the one)
CREATE EXTENSION pageinspect;
SELECT count(*) AS pkey_entries_at_heap_only
  FROM idempo.operations o,
       generate_series(1, pg_relation_size('idempo.operations_pkey') / current_setting('block_size')::int - 1) b,
       bt_page_items('idempo.operations_pkey', b::int) i,
       heap_page_items(get_raw_page('idempo.operations', (o.ctid::text::point)[0]::int)) h
 WHERE o.key = 'summarized' AND i.htid = o.ctid
   AND h.lp = (o.ctid::text::point)[1]::int AND (h.t_infomask2 & 32768) <> 0;
DROP EXTENSION pageinspect;
DROP INDEX idempo.operations_completed_brin;

SELECT * FROM idempo.check_consistency();
