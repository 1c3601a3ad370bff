-- Fingerprint rules: fields left out of the fingerprint (scope option fingerprint_ignore,
-- idempo.fingerprint(params, ignore)), the published vectors, hostile paths, and conflicts.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

-- The test vectors with ignored paths (also in docs/fingerprint-rules.md, and checked against
-- test/fingerprint/reference.py): a document, the paths, the digest without them.
SELECT input, ignore, encode(idempo.fingerprint(input::jsonb, ignore), 'hex') AS sha256
FROM (VALUES ('{"order":"A-1","delivered_at":"2026-11-30T10:00:00Z"}', '{delivered_at}'::text[]),
             ('{"order":"A-1"}', '{delivered_at}'),
             ('{"order":"A-1","meta":{"trace_id":"t-1","source":"shop"}}', '{meta.trace_id}'),
             ('{"order":"A-1","meta":{"source":"shop"}}', '{meta.trace_id}'),
             ('{"order":"A-1","items":[{"trace_id":"t-1"}]}', '{items.trace_id}'),
             ('{"order":"A-1","meta":"plain"}', '{meta.trace_id}'),
             ('{"order":"A-1","meta":{"trace_id":"t-1"}}', '{meta,meta.trace_id}'),
             ('[{"delivered_at":1}]', '{delivered_at}')) AS v(input, ignore);

-- An ignored field is as if it had not been sent; nothing else changes.
SELECT idempo.fingerprint('{"a":1,"d":"x"}', '{d}') = idempo.fingerprint('{"a":1}') AS as_if_absent,
       idempo.fingerprint('{"a":1}', '{}') = idempo.fingerprint('{"a":1}') AS empty_list,
       idempo.fingerprint('{"a":1}', NULL) = idempo.fingerprint('{"a":1}') AS null_list,
       idempo.fingerprint('{"a":1}', '{zzz,a.b.c}') = idempo.fingerprint('{"a":1}') AS absent_paths,
       idempo.fingerprint('{"a":{"b":1,"c":2}}', '{a.b}') = idempo.fingerprint('{"a":{"c":2}}') AS nested,
       idempo.fingerprint('{"a":{"b":1}}', '{a.b}') = idempo.fingerprint('{"a":{}}') AS emptied_object_stays,
       idempo.fingerprint('{"a":[{"b":1}]}', '{a.b}') = idempo.fingerprint('{"a":[{"b":1}]}') AS arrays_not_entered,
       idempo.fingerprint('"x"', '{x}') = idempo.fingerprint('"x"') AS scalar_document,
       idempo.fingerprint('{"a.b":1,"a":{"b":2}}', '{a.b}') = idempo.fingerprint('{"a.b":1,"a":{}}') AS dot_means_nesting,
       idempo.fingerprint('{"a":1,"b":2}', '{a,a,b}') = idempo.fingerprint('{}') AS repeats;
SELECT idempo.fingerprint(NULL, '{a}') IS NULL AS null_params;

-- Hostile lists are refused with 22023 and a hint; nothing crashes.
SELECT regress.err($$SELECT idempo.fingerprint('{}', '{""}')$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', ARRAY['a', NULL])$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', '{a..b}')$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', '{.a}')$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', '{a.}')$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', '{.}')$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', '{{a},{b}}')$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', (SELECT array_agg(g::text) FROM generate_series(1, 100000) g))$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', ARRAY[repeat('x', 1025)])$$);
-- the limits themselves are fine: 256 paths, 1024 bytes, a path 512 keys deep into a document as deep
SELECT length(idempo.fingerprint('{"7":1}', (SELECT array_agg(g::text) FROM generate_series(1, 256) g))) AS paths_256;
SELECT idempo.fingerprint((repeat('{"a":', 600) || '1' || repeat('}', 600))::jsonb, ARRAY[repeat('a.', 511) || 'a'])
     = idempo.fingerprint((repeat('{"a":', 511) || '{}' || repeat('}', 511))::jsonb) AS deep_path;
SELECT length(idempo.fingerprint((SELECT jsonb_object_agg(g::text, g) FROM generate_series(1, 100000) g),
                                 ARRAY['5', '77', '99999'])) AS wide_document;
-- an array with a lower bound other than 1 is read as its elements
SELECT idempo.fingerprint('{"a":1,"b":2}', '[0:0]={b}'::text[]) = idempo.fingerprint('{"a":1}') AS lower_bound;

-- The scope option: the same rules, refused with the scope named.
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_ignore => '{""}')$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_ignore => ARRAY[NULL]::text[])$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_ignore => '{meta..x}')$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_ignore => '{{a},{b}}')$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_ignore => (SELECT array_agg(g::text) FROM generate_series(1, 257) g))$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_ignore => ARRAY[repeat('x', 1025)])$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_ignore => NULL)$$);

SELECT name, fingerprint_ignore FROM idempo.create_scope('webhook', store_params => true,
    fingerprint_ignore => '{delivered_at,meta.trace_id}');

-- A redelivery that differs only in ignored fields replays; another field is a conflict.
SELECT outcome, attempt FROM idempo.claim('webhook', 'evt-1',
    params => '{"order":"A-1","qty":2,"delivered_at":"10:00","meta":{"trace_id":"t-1","source":"shop"}}');
SELECT idempo.complete('webhook', 'evt-1', 1, result => '{"shipment":"S-1"}');
SELECT outcome, result FROM idempo.claim('webhook', 'evt-1',
    params => '{"order":"A-1","qty":2,"delivered_at":"10:05","meta":{"trace_id":"t-2","source":"shop"}}');
SELECT outcome, result FROM idempo.claim('webhook', 'evt-1',
    params => '{"order":"A-1","qty":2,"meta":{"source":"shop"}}');
-- the stored fingerprint is the one idempo.fingerprint(params, ignore) computes
SELECT fingerprint = idempo.fingerprint('{"order":"A-1","qty":2,"meta":{"source":"shop"}}', '{}') AS stored_without_ignored,
       params ? 'delivered_at' AS params_stored_as_sent
FROM idempo.operations WHERE scope = 'webhook' AND key = 'evt-1';
SELECT outcome FROM idempo.claim('webhook', 'evt-1',
    params => '{"order":"A-1","qty":3,"delivered_at":"10:09","meta":{"trace_id":"t-3","source":"app"}}');
-- the changed fields never list an ignored one: qty and meta.source differ, delivered_at and
-- meta.trace_id are left out of both sides
SELECT changed_fields, stored_params, incoming_params FROM idempo.conflict_queue WHERE scope = 'webhook';

-- The rule cannot change while the scope has operations (the stored fingerprints were computed
-- under it); the same set in another order is no change.
SELECT regress.err($$SELECT idempo.alter_scope('webhook', fingerprint_ignore => '{delivered_at}')$$);
SELECT regress.err($$SELECT idempo.alter_scope('webhook', fingerprint_ignore => '{}')$$);
SELECT fingerprint_ignore FROM idempo.alter_scope('webhook', fingerprint_ignore => '{meta.trace_id,delivered_at,delivered_at}');
SELECT fingerprint_ignore FROM idempo.alter_scope('webhook', description => 'NULL leaves the rule as it is');
-- without operations it can change, and the next claim uses the new rule at once
SELECT name FROM idempo.create_scope('webhook.new');
SELECT outcome FROM idempo.claim('webhook.new', 'k', params => '{"a":1,"at":1}');
SELECT outcome FROM idempo.claim('webhook.new', 'k', params => '{"a":1,"at":2}');
SET idempo.allow_drop_with_records = on;
DELETE FROM idempo.operations WHERE scope = 'webhook.new';
SELECT fingerprint_ignore FROM idempo.alter_scope('webhook.new', fingerprint_ignore => '{at}');
SELECT outcome FROM idempo.claim('webhook.new', 'k', params => '{"a":1,"at":1}');
SELECT idempo.complete('webhook.new', 'k', 1);
SELECT outcome FROM idempo.claim('webhook.new', 'k', params => '{"a":1,"at":2}');
RESET idempo.allow_drop_with_records;

-- A claim with a fingerprint computed by the caller is compared as given (the rule applies to params).
SELECT outcome FROM idempo.claim('webhook.new', 'k', fingerprint => idempo.fingerprint('{"a":1}', '{at}'));
SELECT outcome FROM idempo.claim('webhook.new', 'k', fingerprint => idempo.fingerprint('{"a":1,"at":1}'));

-- A list written into idempo.scopes behind check_scope's back is refused at the claim, naming the scope.
UPDATE idempo.scopes SET fingerprint_ignore = '{a..b}' WHERE name = 'webhook.new';
SELECT regress.err($$SELECT idempo.claim('webhook.new', 'k2', params => '{}')$$);
-- It does not stop the sweep, which loads the scope of every due row but never needs the list:
-- under a clock 400 days ahead the finished records of this scope and of the others are purged.
SELECT name FROM idempo.create_scope('other');
SELECT outcome FROM idempo.claim('other', 'o1', complete_on_commit => true);
SET idempo.clock_offset = '400 days';
SELECT purged > 0 AS purged FROM idempo.sweep();
RESET idempo.clock_offset;
SELECT count(*) AS left_in_both FROM idempo.operations WHERE scope IN ('webhook.new', 'other');
UPDATE idempo.scopes SET fingerprint_ignore = '{at}' WHERE name = 'webhook.new';
SELECT outcome FROM idempo.claim('webhook.new', 'k2', params => '{}');

SELECT * FROM idempo.check_consistency();
