-- idempo.fingerprint(): canonical SHA-256 of request parameters, and its published test vectors.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

-- The test vectors (also in README.md).  Each digest is SHA-256 over the canonical
-- encoding described in src/canonical.h.
SELECT input, encode(idempo.fingerprint(input::jsonb), 'hex') AS sha256
FROM (VALUES ('null'), ('true'), ('false'), ('0'), ('1'), ('-1.5'), ('""'), ('"1"'),
             ('[]'), ('{}'), ('[1,2]'), ('[2,1]'),
             ('{"a":1,"b":2}'),
             ('{"sku":"A-1","qty":2,"price":9.90,"tags":["x","y"],"gift":false,"note":null}'),
             ('{"ü":"日本","emoji":"🙂"}')) AS v(input)
ORDER BY input;

-- Key order, whitespace and numeric scale do not matter.
SELECT idempo.fingerprint('{"a":1,"b":[1,2]}') = idempo.fingerprint(' { "b" : [ 1.0 , 2.00 ] , "a" : 1.000 } ') AS same;
SELECT idempo.fingerprint('1') = idempo.fingerprint('1.0') AND idempo.fingerprint('1') = idempo.fingerprint('1.00')
       AND idempo.fingerprint('1') = idempo.fingerprint('1e0') AND idempo.fingerprint('100') = idempo.fingerprint('1e2') AS numbers_by_value;
SELECT idempo.fingerprint('0') = idempo.fingerprint('-0.0') AS no_negative_zero;
-- Duplicate keys: jsonb keeps the last one, and so does the fingerprint.
SELECT idempo.fingerprint('{"a":1,"a":2}') = idempo.fingerprint('{"a":2}') AS last_key_wins;

-- What must differ: array order, types, nesting, lengths.
SELECT idempo.fingerprint('[1,2]') <> idempo.fingerprint('[2,1]') AS array_order,
       idempo.fingerprint('1') <> idempo.fingerprint('"1"') AS number_vs_string,
       idempo.fingerprint('[]') <> idempo.fingerprint('{}') AS array_vs_object,
       idempo.fingerprint('null') <> idempo.fingerprint('"null"') AS null_vs_string,
       idempo.fingerprint('[[1],2]') <> idempo.fingerprint('[1,[2]]') AS nesting,
       idempo.fingerprint('["ab","c"]') <> idempo.fingerprint('["a","bc"]') AS string_boundaries,
       idempo.fingerprint('{"a":"b"}') <> idempo.fingerprint('["a","b"]') AS pairs_vs_elements,
       idempo.fingerprint('1.5') <> idempo.fingerprint('15') AS decimal_point;

-- NULL in, NULL out; always 32 bytes.
SELECT idempo.fingerprint(NULL) IS NULL AS null_is_null;
SELECT length(idempo.fingerprint('{"x":[1,2,3]}')) AS bytes;

-- Large and deep documents hash without trouble.
SELECT length(idempo.fingerprint((SELECT jsonb_agg(g) FROM generate_series(1, 100000) g))) AS big;
SELECT length(idempo.fingerprint((repeat('[', 5000) || repeat(']', 5000))::jsonb)) AS deep;
SELECT idempo.fingerprint(('{"n":' || repeat('9', 1000) || '.000}')::jsonb)
     = idempo.fingerprint(('{"n":' || repeat('9', 1000) || '}')::jsonb) AS long_numbers;
