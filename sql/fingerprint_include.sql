-- Fingerprint include rules: a scope's fingerprint_include names the only fields that
-- count, with paths into arrays (items[*].sku); beside fingerprint_ignore.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name, fingerprint_include, fingerprint_ignore
FROM idempo.create_scope('shop.order', store_params => true,
                         fingerprint_include => '{order,customer.id,items[*].sku,items[*].qty}');
SELECT outcome, attempt FROM idempo.claim('shop.order', 'o-1',
    '{"order":"A-1","customer":{"id":7,"name":"Ann"},"items":[{"sku":"X","qty":1,"price":9.5}],"sent_at":"10:00"}');
SELECT idempo.complete('shop.order', 'o-1', 1, '{"ok":true}');
-- other fields changed: replay
SELECT outcome, result FROM idempo.claim('shop.order', 'o-1',
    '{"order":"A-1","customer":{"id":7,"name":"Ann B."},"items":[{"sku":"X","qty":1,"price":9.9}],"sent_at":"10:05"}');
-- an included field changed: conflict, and the changed fields list only counted ones
SELECT outcome FROM idempo.claim('shop.order', 'o-1',
    '{"order":"A-1","customer":{"id":7,"name":"Ann"},"items":[{"sku":"X","qty":2,"price":9.5}],"sent_at":"10:06"}');
SELECT changed_fields FROM idempo.conflict_queue WHERE scope = 'shop.order';
-- one more element: conflict (the number of elements counts)
SELECT outcome FROM idempo.claim('shop.order', 'o-1',
    '{"order":"A-1","customer":{"id":7},"items":[{"sku":"X","qty":1},{"note":"gift"}]}');

-- the fingerprint a claim computes is fingerprint(params, ignore, include)
SELECT o.fingerprint = idempo.fingerprint('{"order":"A-1","customer":{"id":7},"items":[{"sku":"X","qty":1}]}',
                                          NULL, '{order,customer.id,items[*].sku,items[*].qty}') AS same
FROM idempo.operations o WHERE o.scope = 'shop.order' AND o.key = 'o-1';
SELECT idempo.fingerprint('{"a":1,"b":2}', NULL, NULL) = idempo.fingerprint('{"a":1,"b":2}') AS null_lists,
       idempo.fingerprint('{"a":1,"b":2}', '{}', '{}') = idempo.fingerprint('{"a":1,"b":2}') AS empty_lists,
       idempo.fingerprint('{"a":1,"b":2}', '{b}', NULL) = idempo.fingerprint('{"a":1,"b":2}', '{b}') AS ignore_only,
       idempo.fingerprint(NULL, NULL, '{a}') IS NULL AS null_params;

-- the published vectors (docs/fingerprint-rules.md; test/fingerprint/reference.py include-vectors)
SELECT doc, include, ignore, encode(idempo.fingerprint(doc::jsonb, ignore, include), 'hex') AS sha256
FROM (VALUES
    ('{"order":"A-1","amount":500,"delivered_at":"10:00"}', '{order,amount}'::text[], '{}'::text[]),
    ('{"order":"A-1","amount":500}', '{order,amount}', '{}'),
    ('{"order":"A-1","items":[{"sku":"X","qty":1,"note":"gift"},{"sku":"Y","qty":2}]}', '{order,items[*].sku}', '{}'),
    ('{"order":"A-1","items":[{"sku":"X"},{"sku":"Y"}]}', '{order,items[*].sku}', '{}'),
    ('{"order":"A-1","items":[{"qty":1},{"sku":"Y"}]}', '{order,items[*].sku}', '{}'),
    ('{"order":"A-1","items":[]}', '{order,items[*].sku}', '{}'),
    ('{"order":"A-1"}', '{order,items[*].sku}', '{}'),
    ('{"order":"A-1","items":"none"}', '{order,items[*].sku}', '{}'),
    ('{"customer":{"id":7,"name":"Ann"},"meta":{}}', '{customer.id,meta.trace_id}', '{}'),
    ('{"customer":{"id":7}}', '{customer.id,meta.trace_id}', '{}'),
    ('{"order":"A-1","meta":{"trace":{"span":1}}}', '{order,meta.trace.id}', '{}'),
    ('{"grid":[[{"v":1,"w":2}],[]]}', '{grid[*][*].v}', '{}'),
    ('{"a.b":1,"a":{"b":2},"c[0]":3}', ARRAY['a\.b', 'c\[0]'], '{}'),
    ('{"meta":{"source":"shop","trace_id":"t-1"},"order":"A-1"}', '{meta,order}', '{meta.trace_id}'),
    ('{"unrelated":true}', '{order}', '{}'),
    ('[{"order":"A-1"}]', '{order}', '{}')
) AS v(doc, include, ignore);

-- both rules: include first, then ignore removes from what it kept
SELECT name FROM idempo.create_scope('shop.both', fingerprint_include => '{meta,order}',
                                     fingerprint_ignore => '{meta.trace_id}');
SELECT outcome FROM idempo.claim('shop.both', 'b-1', '{"order":"A-1","meta":{"trace_id":"t-1","source":"shop"},"x":1}');
SELECT idempo.complete('shop.both', 'b-1', 1);
SELECT outcome FROM idempo.claim('shop.both', 'b-1', '{"order":"A-1","meta":{"trace_id":"t-2","source":"shop"},"x":2}');
SELECT outcome FROM idempo.claim('shop.both', 'b-1', '{"order":"A-1","meta":{"trace_id":"t-2","source":"app"}}');

-- the rules of a path: refused with 22023 by create_scope/alter_scope (naming the scope) and by fingerprint()
SELECT p, split_part(regress.err(format('SELECT idempo.create_scope(%L, fingerprint_include => %L)', 'bad', p)), E'\n', 1) AS scope,
       split_part(regress.err(format('SELECT idempo.fingerprint(%L, NULL, %L)', '{}', p)), E'\n', 1) AS fingerprint
FROM unnest(ARRAY['{a..b}', '{.a}', '{a.}', '{"a[0]"}', '{"a[*]b"}', '{"[*].a"}', '{"a[*"}', '{"a\\"}',
                  '{"a.[*]"}', '{""}', '{NULL}', '{{a},{b}}']) AS p;
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_include => '{a..b}')$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_include => NULL)$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_include => ARRAY[repeat('a', 1025)])$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', NULL, ARRAY[repeat('a', 1025)])$$);
SELECT regress.err($$SELECT idempo.create_scope('bad', fingerprint_include => ARRAY(SELECT 'f' || g FROM generate_series(1, 257) g))$$);
SELECT regress.err($$SELECT idempo.fingerprint('{}', NULL, ARRAY(SELECT 'f' || g FROM generate_series(1, 257) g))$$);
-- at the limits: accepted
SELECT name FROM idempo.create_scope('limits', fingerprint_include => ARRAY(SELECT repeat('f', 1020) || g FROM generate_series(100, 355) g));
-- escapes and odd keys are fine
SELECT name, fingerprint_include FROM idempo.create_scope('escapes', fingerprint_include => ARRAY['a\.b', 'c\[0]', 'd\\', 'x]', 'é.日[*][*]']);

SELECT outcome FROM idempo.claim('escapes', 'e-1', '{"a.b":1,"a":{"b":2},"c[0]":[3],"d\\":4,"x]":5,"é":{"日":[[1,2],[{"z":3}]]},"y":6}');
-- "a":{"b":...} is no included field (the key "a.b" is): the same request, busy
SELECT outcome FROM idempo.claim('escapes', 'e-1', '{"a.b":1,"a":{"b":9},"c[0]":[3],"d\\":4,"x]":5,"é":{"日":[[1,2],[{"z":3}]]}}');
SELECT outcome FROM idempo.claim('escapes', 'e-1', '{"a.b":1,"c[0]":[3],"d\\":4,"x]":5,"é":{"日":[[1,2],[{"z":4}]]}}');
-- a path written past check_scope (a direct UPDATE) fails the scope's claims, saying why
UPDATE idempo.scopes SET fingerprint_include = '{a..b}' WHERE name = 'limits';
SELECT regress.err($$SELECT idempo.claim('limits', 'l-1', '{"a":1}')$$);
UPDATE idempo.scopes SET fingerprint_include = '{}' WHERE name = 'limits';

-- fixed while the scope has operations, like fingerprint_ignore
SELECT regress.err($$SELECT idempo.alter_scope('shop.order', fingerprint_include => '{order}')$$);
SELECT regress.err($$SELECT idempo.alter_scope('shop.order', fingerprint_include => '{}')$$);
-- the same set in another order, or with repeats, is no change
SELECT name, fingerprint_include FROM idempo.alter_scope('shop.order',
    fingerprint_include => '{items[*].qty,order,customer.id,items[*].sku,order}');
-- without operations it may change, and '{}' lets every field count again
SELECT name, fingerprint_include FROM idempo.alter_scope('limits', fingerprint_include => '{}');
SELECT name, fingerprint_include FROM idempo.alter_scope('limits', fingerprint_include => '{a}');
SELECT * FROM idempo.check_consistency();
