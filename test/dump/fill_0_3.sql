-- Rows of 0.3.0's features for the dump-and-restore suite (test/run), after test/upgrade/fill.sql:
-- scopes with remember and fingerprint_ignore, a remembered key (shrunk by a claim and by the
-- sweep), a released one (its closed review), a conflict recorded without the ignored fields.
SELECT name FROM idempo.create_scope('dump.remember', retention => '1 hour', remember => '1 year',
                                     store_params => true, audit => true,
                                     fingerprint_ignore => '{delivered_at,meta.trace_id}');
SELECT (idempo.claim('dump.remember', 'r-' || g, jsonb_build_object('n', g, 'delivered_at', 'x'),
                     complete_on_commit => true)).outcome FROM generate_series(1, 4) g;
SET idempo.clock_offset = '2 hours';
SELECT outcome FROM idempo.claim('dump.remember', 'r-1', '{"n":1,"delivered_at":"y"}');
SELECT * FROM idempo.sweep();
SELECT idempo.release('dump.remember', 'r-2', 'dump-test', 'released before the dump') > 0 AS released;
SELECT outcome FROM idempo.claim('dump.remember', 'r-3', '{"n":33,"delivered_at":"z","meta":{"trace_id":"t"}}');
RESET idempo.clock_offset;
