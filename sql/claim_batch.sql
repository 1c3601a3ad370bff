-- Batch claims: claim_batch() decides each element as claim() does, in the order of the stored
-- keys, and answers in input order; a key given twice is handed out once (duplicate_of);
-- complete_batch() and fail_batch() finish many attempts; bad input is refused before anything
-- is claimed.  (Races: test/isolation/specs/claim_batch_*.spec.)
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('b', retention => '1 hour', lease => '1 minute',
                                     store_params => true, audit => true);

-- new keys: one row per element, in input order
BEGIN;
SELECT position, key, duplicate_of, outcome, status, attempt, lease_expires_at > now() AS leased
FROM idempo.claim_batch('b', ARRAY['m-3', 'm-1', 'm-2'],
                        ARRAY['{"n":3}', '{"n":1}', '{"n":2}']::jsonb[], run_id => 'run-1');
-- they were claimed in the order of the keys (the audit log's order), whatever the input order
SELECT key, action, outcome, run_id FROM idempo.events WHERE scope = 'b' ORDER BY id;
-- finished in the same transaction: attempts NULL means the ones this transaction acquired
SELECT * FROM idempo.complete_batch('b', ARRAY['m-1', 'm-3'],
                                    results => ARRAY['{"r":1}', '{"r":3}']::jsonb[],
                                    target_refs => ARRAY['T-1', NULL]);
SELECT * FROM idempo.fail_batch('b', ARRAY['m-2'], errors => ARRAY['out of stock']);
COMMIT;

-- the same batch again: replays (with the stored answers) and a new attempt of the retryable one
SELECT position, key, duplicate_of, outcome, status, attempt, result, target_ref, error,
       completed_at IS NOT NULL AS has_completed_at
FROM idempo.claim_batch('b', ARRAY['m-1', 'm-2', 'm-3'],
                        ARRAY['{"n":1}', '{"n":2}', '{"n":3}']::jsonb[]);
SELECT * FROM idempo.fail_batch('b', ARRAY['m-2'], ARRAY[2], ARRAY['gone'], retryable => false);
-- a request that differs is a conflict, recorded as claim() records it
SELECT position, key, outcome, status, conflict_id IS NOT NULL AS has_conflict
FROM idempo.claim_batch('b', ARRAY['m-1', 'm-2'], ARRAY['{"n":1}', '{"n":99}']::jsonb[]);
SELECT key, stored_params, incoming_params FROM idempo.conflicts ORDER BY id;

-- a key given twice: the later occurrence names the first (duplicate_of) and is never handed
-- the work: with the same params it answers busy; with other params it is a conflict with
-- the record the first occurrence wrote; a finished key replays to both
BEGIN;
SELECT position, key, duplicate_of, outcome, status, attempt, conflict_id IS NOT NULL AS has_conflict
FROM idempo.claim_batch('b', ARRAY['d-1', 'm-1', 'd-1', 'd-2', 'd-1', 'm-1', 'd-2'],
                        ARRAY['{"n":1}', '{"n":1}', '{"n":1}', '{"n":2}', '{"n":7}', '{"n":1}', NULL]::jsonb[]);
-- each occurrence was claimed (an event each), as single claims of it in one transaction are
SELECT key, count(*) FROM idempo.events WHERE key LIKE 'd-%' GROUP BY key ORDER BY key;
SELECT key, incoming_params FROM idempo.conflicts WHERE key LIKE 'd-%';
-- a batch finish of a key given twice is refused (leave out the duplicate_of elements)
SELECT regress.err($$SELECT * FROM idempo.complete_batch('b', ARRAY['d-1', 'd-2', 'd-1'])$$);
SELECT * FROM idempo.complete_batch('b', ARRAY['d-2', 'd-1']);
COMMIT;

-- complete_on_commit: the one-transaction form, no finish needed
SELECT position, key, outcome, status
FROM idempo.claim_batch('b', ARRAY['c-1', 'c-2'], complete_on_commit => true);
SELECT key, status FROM idempo.operations WHERE key LIKE 'c-%' ORDER BY key;

-- stale: intent_at per element, older than retention with no record
SELECT position, key, outcome, status, review_id IS NOT NULL AS has_review
FROM idempo.claim_batch('b', ARRAY['s-1', 's-2'],
                        intent_at => ARRAY[idempo.now() - interval '2 hours', idempo.now()]);

-- a lease that ran out: unknown, with the verification lease for this batch; the later
-- occurrence of the key answers busy
SELECT outcome FROM idempo.claim('b', 'u-1');
SET idempo.clock_offset = '2 minutes';
BEGIN;
SELECT position, key, duplicate_of, outcome, status, attempt
FROM idempo.claim_batch('b', ARRAY['u-1', 'u-1']);
-- claims in the same transaction answer unknown again (the lease is this transaction's)
SELECT outcome FROM idempo.claim('b', 'u-1');
COMMIT;
-- another caller: busy while the verification lease runs
SELECT position, key, outcome, status FROM idempo.claim_batch('b', ARRAY['u-1']);
RESET idempo.clock_offset;
-- a batch alone takes it (claim_batch has no verify_unknown): a claim after it is busy
SELECT outcome FROM idempo.claim('b', 'u-2');
SET idempo.clock_offset = '2 minutes';
SELECT position, key, outcome, status, lease_expires_at > idempo.now() AS leased
FROM idempo.claim_batch('b', ARRAY['u-2']);
SELECT outcome, status FROM idempo.claim('b', 'u-2');
RESET idempo.clock_offset;

-- hash_keys: the keys are stored as digests, ordered and compared as such; answers carry the
-- clear key as given
SELECT name FROM idempo.create_scope('b.pii', hash_keys => true);
SELECT position, key, duplicate_of, outcome
FROM idempo.claim_batch('b.pii', ARRAY['bob@example.com', 'alice@example.com', 'bob@example.com']);
SELECT count(*) AS clear_keys FROM idempo.operations WHERE scope = 'b.pii' AND key LIKE '%@%';
SELECT * FROM idempo.complete_batch('b.pii', ARRAY['alice@example.com', 'bob@example.com'], ARRAY[1, 1]);
-- claimed in the order of the digests, not of the clear keys (as claims one by one ordered by
-- idempo.stored_key(scope, key) COLLATE "C" take them): k2, k3, k1, k4
SELECT name FROM idempo.create_scope('b.pii.audit', hash_keys => true, audit => true);
SELECT count(*) FROM idempo.claim_batch('b.pii.audit', ARRAY['k1', 'k2', 'k3', 'k4']);
SELECT c.k AS claimed FROM idempo.events e
  JOIN unnest(ARRAY['k1', 'k2', 'k3', 'k4']) c(k) ON e.key = idempo.stored_key('b.pii.audit', c.k)
 WHERE e.scope = 'b.pii.audit' ORDER BY e.id;

-- fingerprint_ignore: fields the scope ignores do not make a duplicate differ
SELECT name FROM idempo.create_scope('b.ign', fingerprint_ignore => '{trace_id}');
SELECT position, key, duplicate_of, outcome
FROM idempo.claim_batch('b.ign', ARRAY['k', 'k'],
                        ARRAY['{"n":1,"trace_id":"a"}', '{"n":1,"trace_id":"b"}']::jsonb[]);

-- allowed_role: checked for each element as for a claim
CREATE ROLE regress_batch_app;
CREATE ROLE regress_batch_other;
-- (membership for SET ROLE: managed/run runs this file as a role that is not a superuser)
GRANT regress_batch_app, regress_batch_other TO CURRENT_USER;
GRANT USAGE ON SCHEMA idempo TO regress_batch_app, regress_batch_other;
GRANT EXECUTE ON FUNCTION idempo.claim_batch(text, text[], jsonb[], text, timestamptz[], boolean, boolean)
    TO regress_batch_app, regress_batch_other;
SELECT name FROM idempo.create_scope('b.app', allowed_role => 'regress_batch_app');
SET ROLE regress_batch_app;
SELECT position, key, outcome FROM idempo.claim_batch('b.app', ARRAY['r-1']);
RESET ROLE;
SET ROLE regress_batch_other;
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b.app', ARRAY['r-2'])$$);
RESET ROLE;
SELECT count(*) FROM idempo.operations WHERE scope = 'b.app';

-- a read-only transaction gets the answers that need no write; a new key is refused
BEGIN READ ONLY;
SELECT position, key, outcome FROM idempo.claim_batch('b', ARRAY['m-1', 'c-1']);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b', ARRAY['m-1', 'new-1'])$$);
COMMIT;

-- wait => false with nobody holding the keys: the same answers
SELECT position, key, outcome FROM idempo.claim_batch('b', ARRAY['w-1', 'm-1'], wait => false);

-- replays are read in one probe of all the keys (outside audit scopes); what the probe cannot
-- answer goes through claim(): a key this transaction acquired, a differing request, a record
-- past its expiry, a remembered key not yet shrunk
SELECT name FROM idempo.create_scope('b.fast', retention => '1 hour', lease => '1 minute',
                                     store_params => true, remember => '1 day');
BEGIN;
SELECT position, key, outcome, status
FROM idempo.claim_batch('b.fast', ARRAY['f-1', 'f-2', 'f-3'], ARRAY['{"n":1}', '{"n":2}', '{"n":3}']::jsonb[]);
SELECT * FROM idempo.complete_batch('b.fast', ARRAY['f-1', 'f-2', 'f-3'],
                                    results => ARRAY[NULL, '{"r":2}', NULL]::jsonb[],
                                    target_refs => ARRAY[NULL, 'T-2', 'T-3']);
COMMIT;
BEGIN;
SELECT position, key, outcome, status, attempt
FROM idempo.claim_batch('b.fast', ARRAY['f-9'], complete_on_commit => true);
-- f-9 was acquired by this transaction (written as succeeded): acquired again, not a replay
SELECT position, key, duplicate_of, outcome, status, attempt, result, target_ref,
       completed_at IS NOT NULL AS has_completed_at, conflict_id IS NOT NULL AS has_conflict
FROM idempo.claim_batch('b.fast', ARRAY['f-9', 'f-3', 'f-2', 'f-1', 'f-2', 'f-4'],
                        ARRAY[NULL, '{"n":3}', '{"n":2}', '{"n":99}', NULL, '{"n":4}']::jsonb[]);
ROLLBACK;
SELECT key, incoming_params FROM idempo.conflicts WHERE scope = 'b.fast';
-- two hours later the records are past expires_at: claim() shrinks them to remembered keys (expired);
-- once shrunk (by a claim or the sweep) the probe answers them
SET idempo.clock_offset = '2 hours';
SELECT position, key, outcome, status, result, target_ref FROM idempo.claim_batch('b.fast', ARRAY['f-2', 'f-1']);
SELECT position, key, outcome, status, result, target_ref FROM idempo.claim_batch('b.fast', ARRAY['f-2', 'f-1', 'f-3']);
RESET idempo.clock_offset;

-- after batches of new keys the probe is skipped (optimism): existing keys are then found by
-- their insertion and decided by claim(), until the batch reads the rest; the answers are the same
SELECT count(*) FILTER (WHERE outcome = 'acquired') AS acquired
FROM generate_series(1, 12) n,
     LATERAL idempo.claim_batch('b.fast', array(SELECT 'o-' || n || '-' || g FROM generate_series(1, 5) g),
                                complete_on_commit => true);
SELECT position, key, outcome, status, attempt
FROM idempo.claim_batch('b.fast', ARRAY['o-1-1', 'o-1-2', 'o-1-3', 'o-1-4', 'o-1-5', 'o-new', 'o-2-1', 'o-2-2']);

-- bad input is refused before anything is claimed
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b', ARRAY['x-1', NULL, 'x-2'])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b', ARRAY['x-1', 'x-2'], ARRAY['{}']::jsonb[])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b', ARRAY['x-1'], intent_at => ARRAY[now(), now()])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b', ARRAY[['x-1'], ['x-2']])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b', array(SELECT 'x-' || g FROM generate_series(1, 1000000) g))$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b', ARRAY['x-1'], wait => NULL)$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b', ARRAY['x-1'], complete_on_commit => NULL)$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('nope', ARRAY['x-1'])$$);
SELECT regress.err($$SELECT * FROM idempo.complete_batch('b', ARRAY['x-1', 'x-2'], ARRAY[1])$$);
SELECT regress.err($$SELECT * FROM idempo.fail_batch('b', ARRAY['x-1'], errors => ARRAY['a', 'b'])$$);
SELECT regress.err($$SELECT * FROM idempo.fail_batch('b', ARRAY['m-1'], ARRAY[1], retryable => NULL)$$);
-- keys are checked as claim() checks them, before any is claimed (also where new keys are
-- inserted without a claim: outside audit scopes)
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b.fast', ARRAY['x-1', ' '])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b.fast', ARRAY['x-1', ''])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b.fast', ARRAY['x-1', repeat('k', 1025)])$$);
SELECT count(*) AS none_claimed FROM idempo.operations WHERE key LIKE 'x-%' OR btrim(key) = '' OR key LIKE 'kkk%';
-- an element's own error fails the statement, naming its position (not the key)
\set VERBOSITY default
SELECT * FROM idempo.claim_batch('b', ARRAY['x-1', ' ']);
SELECT * FROM idempo.complete_batch('b', ARRAY['m-3', 'x-1'], ARRAY[1, 1]);
SELECT count(*) AS none_claimed FROM idempo.operations WHERE key LIKE 'x-%';
-- an empty batch: no rows
SELECT count(*) FROM idempo.claim_batch('b', '{}');
SELECT count(*) FROM idempo.claim_batch('b', NULL);
SELECT count(*) FROM idempo.complete_batch('b', '{}');

-- fingerprint_include: the batch fingerprints params as claim() does (only the included
-- fields): a record the batch acquired is replayed by claim(), and the reverse
SELECT name FROM idempo.create_scope('b.include', fingerprint_include => '{sku}');
SELECT position, outcome FROM idempo.claim_batch('b.include', ARRAY['i-1'],
  ARRAY['{"sku": 1, "note": "a"}']::jsonb[]);
SELECT idempo.complete('b.include', 'i-1', 1, '{"ok": true}');
SELECT outcome FROM idempo.claim('b.include', 'i-1', '{"sku": 1, "note": "b"}');
SELECT outcome FROM idempo.claim('b.include', 'i-2', '{"sku": 2, "note": "a"}');
SELECT idempo.complete('b.include', 'i-2', 1, '{"ok": true}');
SELECT position, outcome, duplicate_of FROM idempo.claim_batch('b.include', ARRAY['i-2', 'i-3', 'i-3', 'i-1'],
  ARRAY['{"sku": 2, "note": "b"}', '{"sku": 3, "note": "a"}', '{"sku": 3, "note": "b"}',
        '{"sku": 9}']::jsonb[]);

-- require_fingerprint: an element without params is refused as claim() refuses it (22023), also
-- where its record is finished and would be replayed (the C edition's one read of the batch's
-- keys answered it 'replay', past the refusal, outside audit scopes only)
SELECT name FROM idempo.create_scope('b.require', require_fingerprint => true);
SELECT outcome FROM idempo.claim('b.require', 'q-1', '{"n": 1}');
SELECT idempo.complete('b.require', 'q-1', 1);
SELECT regress.err($$SELECT outcome FROM idempo.claim('b.require', 'q-1')$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b.require', ARRAY['q-1'])$$);
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b.require', ARRAY['q-2', 'q-1'], ARRAY['{"n": 2}', NULL]::jsonb[])$$);
SELECT position, outcome FROM idempo.claim_batch('b.require', ARRAY['q-1'], ARRAY['{"n": 1}']::jsonb[]);
-- a repeated key is decided as a single claim of it is: the one without params is refused too
SELECT regress.err($$SELECT * FROM idempo.claim_batch('b.require', ARRAY['q-1', 'q-1'], ARRAY['{"n": 1}', NULL]::jsonb[])$$);

-- A repeated key is compared with the stored request, not with its first occurrence: the first
-- without params replays, the second with other params is a conflict, recorded (outside audit
-- scopes too, where one read of the batch's keys answers the replays)
SELECT name FROM idempo.create_scope('b.pay', retention => '1 hour', store_params => true);
SELECT outcome FROM idempo.claim('b.pay', 'order-7', '{"amount": 10}');
SELECT idempo.complete('b.pay', 'order-7', 1, '{"paid": 10}');
SELECT position, duplicate_of, outcome, result, conflict_id IS NOT NULL AS has_conflict
FROM idempo.claim_batch('b.pay', ARRAY['order-7', 'order-7'], ARRAY[NULL, '{"amount": 99}']::jsonb[]);
SELECT key, stored_params, incoming_params FROM idempo.conflicts WHERE scope = 'b.pay';
-- the same elements as single claims answer the same
SELECT outcome FROM idempo.claim('b.pay', 'order-7');
SELECT outcome, conflict_id IS NOT NULL AS has_conflict FROM idempo.claim('b.pay', 'order-7', '{"amount": 99}');
-- a new key given twice, first without params: acquired once, the second is busy (it holds no
-- other request than the one the first stored: none)
BEGIN;
SELECT position, duplicate_of, outcome FROM idempo.claim_batch('b.pay', ARRAY['order-8', 'order-8', 'order-8'],
  ARRAY[NULL, '{"amount": 5}', NULL]::jsonb[]);
ROLLBACK;

SELECT * FROM idempo.check_consistency();
DROP OWNED BY regress_batch_app, regress_batch_other;
DROP ROLE regress_batch_app, regress_batch_other;
