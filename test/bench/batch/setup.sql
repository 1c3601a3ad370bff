-- The batch benchmark's database (test/bench/batch/run): the scopes, the baselines' bare dedup
-- table, and the keys that the replay scripts find finished.
CREATE EXTENSION IF NOT EXISTS idempo;
SELECT name FROM idempo.create_scope('bench.batch', retention => '1 day', lease => '5 minutes');
SELECT name FROM idempo.create_scope('bench.single', retention => '1 day', lease => '5 minutes');
SELECT name FROM idempo.create_scope('bench.replay', retention => '1 day', lease => '5 minutes');
-- the baseline: a bare dedup table with idempo's primary key
CREATE TABLE dedup (scope text NOT NULL, key text NOT NULL, PRIMARY KEY (scope, key));
-- a new key per element of every transaction: a run number and the transaction's own number
CREATE SEQUENCE txn_seq;
-- 100,000 finished keys to replay, 1,000 at a time
SELECT sum((SELECT count(*) FROM idempo.claim_batch('bench.replay',
           array(SELECT 'r-' || g FROM generate_series(n * 10000 + 1, n * 10000 + 10000) g),
           array(SELECT jsonb_build_object('n', g) FROM generate_series(n * 10000 + 1, n * 10000 + 10000) g),
           complete_on_commit => true))) AS replayable
FROM generate_series(0, 9) n;
VACUUM ANALYZE;
