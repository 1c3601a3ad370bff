-- Data in every idempo table and sequence, for the pg_dump/pg_restore round trip (test/run).
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
CREATE EXTENSION idempo;
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
