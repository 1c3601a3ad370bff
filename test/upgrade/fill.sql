-- Data in every idempo table and sequence, for the upgrade test (run after CREATE EXTENSION idempo
-- VERSION 'A' for every released A).  It may only use the API of the OLDEST released version
-- (0.1.0): it is the same for every version updated from.  Every status, open and closed reviews
-- and conflicts, audit events, hashed keys.  test/run's pg_dump/pg_restore round trip fills its
-- database with it too.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
SELECT name FROM idempo.create_scope('dump', retention => '1 hour', lease => '1 minute', audit => true,
                                     store_params => true, owner => 'team');
SELECT name FROM idempo.create_scope('dump.private', hash_keys => true);
SELECT idempo.claim('dump', 'k' || i, jsonb_build_object('i', i), run_id => 'r' || i) FROM generate_series(1, 20) i;
SELECT idempo.complete('dump', 'k' || i, 1, jsonb_build_object('done', i), 'T-' || i) FROM generate_series(1, 10) i;
SELECT idempo.fail('dump', 'k' || i, 1, 'e' || i) FROM generate_series(11, 13) i;
SELECT idempo.claim('dump', 'k1', '{"i": 99}');
SELECT idempo.request_review('dump', 'k14', 'by hand');
SELECT idempo.claim('dump', 'stale', intent_at => now() - interval '2 days');
SELECT idempo.claim('dump.private', 'alice@example.com', complete_on_commit => true);
-- an unknown outcome (lease ran out), a resolved review, a dismissed and an open conflict
SET idempo.clock_offset = '2min';
SELECT (idempo.claim('dump', 'k15')).outcome AS lease_ran_out;
RESET idempo.clock_offset;
SELECT idempo.resolve('dump', 'k14', 'failed', reviewer => 'alice', note => 'cancelled');
SELECT idempo.resolve_conflict(min(id), 'dismissed', 'alice') FROM idempo.conflicts;
SELECT (idempo.claim('dump', 'k2', '{"i": 22}')).outcome AS open_conflict;
