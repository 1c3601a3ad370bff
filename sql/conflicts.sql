-- Conflicts: one open row per stored request and incoming request, the returned id names it.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;
SELECT name FROM idempo.create_scope('cf', retention => '1 hour', lease => '1 minute', store_params => true);

-- the first lifetime of the key: stored {"qty":1}, a different request {"qty":2} twice
SELECT outcome FROM idempo.claim('cf', 'k', '{"qty":1}', complete_on_commit => true);
SELECT outcome, conflict_id FROM idempo.claim('cf', 'k', '{"qty":2}');
SELECT outcome, conflict_id FROM idempo.claim('cf', 'k', '{"qty":2}');

-- the record expires; the key's second lifetime stores {"qty":3}; {"qty":2} comes again.
-- It is another conflict, against {"qty":3}: the open row of the first lifetime must not count
-- it and keep showing {"qty":1} as what is stored.
SET idempo.clock_offset = '120min';
SELECT outcome, attempt FROM idempo.claim('cf', 'k', '{"qty":3}', complete_on_commit => true);
SELECT outcome, conflict_id FROM idempo.claim('cf', 'k', '{"qty":2}');
RESET idempo.clock_offset;
-- every returned id names a row (ids are drawn per conflict; a repeat counts on its row)
SELECT id, occurrences, stored_params, incoming_params
FROM idempo.conflicts WHERE key = 'k' ORDER BY id;
SELECT key, occurrences, stored_status, changed_fields FROM idempo.conflict_queue ORDER BY id;
