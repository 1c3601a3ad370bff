-- A key given more than once in one claim_batch: every occurrence is decided as a single claim()
-- of it in the same transaction decides it (the first occurrence's answer is not copied to the
-- others); then an occurrence that would be handed the work ('acquired', 'unknown') an earlier
-- occurrence of the key was handed answers busy.  duplicate_of names the first occurrence.
-- (sql/claim_batch.sql has the rest of the batch's behaviour.)
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('pay', retention => '1 hour', lease => '1 minute',
                                     store_params => true, audit => true);
SELECT outcome FROM idempo.claim('pay', 'order-7', '{"amount": 10}');
SELECT idempo.complete('pay', 'order-7', 1, '{"paid": 10}');

-- a finished key: the occurrence with other params is a conflict, recorded, whichever comes
-- first; the occurrence without params, or with the stored ones, replays
SELECT position, duplicate_of, outcome, result, conflict_id IS NOT NULL AS has_conflict
FROM idempo.claim_batch('pay', ARRAY['order-7', 'order-7'], ARRAY[NULL, '{"amount": 99}']::jsonb[]);
SELECT position, duplicate_of, outcome, result, conflict_id IS NOT NULL AS has_conflict
FROM idempo.claim_batch('pay', ARRAY['order-7', 'order-7', 'order-7'],
                        ARRAY['{"amount": 99}', '{"amount": 10}', NULL]::jsonb[]);
-- the same as single claims in one transaction
BEGIN;
SELECT outcome, result, conflict_id IS NOT NULL AS has_conflict FROM idempo.claim('pay', 'order-7');
SELECT outcome, result, conflict_id IS NOT NULL AS has_conflict FROM idempo.claim('pay', 'order-7', '{"amount": 99}');
COMMIT;
SELECT key, incoming_params, occurrences FROM idempo.conflicts ORDER BY id;
-- every occurrence was claimed (the audit log has one claim per element)
SELECT outcome, count(*) FROM idempo.events WHERE key = 'order-7' AND action = 'claim'
GROUP BY outcome ORDER BY outcome;

-- a new key: the first occurrence acquires; the same request again would be handed the same
-- attempt (busy), another request is a conflict with the record the first wrote
BEGIN;
SELECT position, key, duplicate_of, outcome, attempt, conflict_id IS NOT NULL AS has_conflict
FROM idempo.claim_batch('pay', ARRAY['order-8', 'order-8', 'order-8', 'order-8'],
                        ARRAY['{"amount": 5}', NULL, '{"amount": 6}', '{"amount": 5}']::jsonb[]);
SELECT status, attempt, params FROM idempo.lookup('pay', 'order-8');
COMMIT;
SELECT key, incoming_params FROM idempo.conflicts WHERE key = 'order-8';

-- a retryable key: the next attempt goes to the first occurrence; a changed request is a conflict
SELECT outcome FROM idempo.claim('pay', 'order-9', '{"amount": 1}');
SELECT idempo.fail('pay', 'order-9', 1, 'timeout');
SELECT position, duplicate_of, outcome, attempt, conflict_id IS NOT NULL AS has_conflict
FROM idempo.claim_batch('pay', ARRAY['order-9', 'order-9', 'order-9'],
                        ARRAY['{"amount": 2}', '{"amount": 1}', NULL]::jsonb[]);
SELECT status, attempt FROM idempo.lookup('pay', 'order-9');

-- the one-call form: acquired once, the later occurrence busy; the record commits succeeded
SELECT position, duplicate_of, outcome, status
FROM idempo.claim_batch('pay', ARRAY['order-10', 'order-10'], complete_on_commit => true);
SELECT status, attempt FROM idempo.lookup('pay', 'order-10');

-- require_fingerprint: an occurrence without params is refused as claim() refuses it (22023),
-- whatever the other occurrence of the key answers; nothing of the batch stays
SELECT name FROM idempo.create_scope('pay.strict', require_fingerprint => true);
SELECT outcome FROM idempo.claim('pay.strict', 'order-1', '{"a": 1}');
SELECT idempo.complete('pay.strict', 'order-1', 1);
SELECT regress.err($$SELECT outcome FROM idempo.claim('pay.strict', 'order-1')$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('pay.strict', ARRAY['order-1', 'order-1'], ARRAY['{"a": 1}', NULL]::jsonb[])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('pay.strict', ARRAY['order-1', 'order-1'], ARRAY[NULL, '{"a": 1}']::jsonb[])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('pay.strict', ARRAY['order-2', 'order-2'], ARRAY['{"a": 1}', NULL]::jsonb[])$$);
SELECT position, duplicate_of, outcome
FROM idempo.claim_batch('pay.strict', ARRAY['order-1', 'order-1'], ARRAY['{"a": 1}', '{"a": 1}']::jsonb[]);
SELECT count(*) AS records FROM idempo.operations WHERE scope = 'pay.strict';
