-- Bad input: refused with a documented SQLSTATE and a hint, and nothing changes.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;


CREATE FUNCTION pg_temp.snapshot() RETURNS text LANGUAGE sql AS $$
    SELECT md5(coalesce((SELECT string_agg(o::text, ',' ORDER BY scope, key) FROM idempo.operations o), '')
            || coalesce((SELECT string_agg(c::text, ',' ORDER BY id) FROM idempo.conflicts c), '')
            || coalesce((SELECT string_agg(r::text, ',' ORDER BY id) FROM idempo.reviews r), ''))
$$;

SELECT name FROM idempo.create_scope('e', retention => '1 hour', lease => '1 minute');
SELECT outcome FROM idempo.claim('e', 'existing', '{"a":1}');
CREATE TEMP TABLE before AS SELECT pg_temp.snapshot() AS s;

SELECT regress.err(stmt) FROM (VALUES
    ($$SELECT idempo.claim(NULL, 'k')$$),
    ($$SELECT idempo.claim('', 'k')$$),
    ($$SELECT idempo.claim(repeat('s', 200), 'k')$$),
    ($$SELECT idempo.claim('e', NULL)$$),
    ($$SELECT idempo.claim('e', '')$$),
    ($$SELECT idempo.claim('e', E' \t\n')$$),
    ($$SELECT idempo.claim('e', E'\x0b')$$),
    ($$SELECT idempo.claim_batch('e', ARRAY['ok', E'\x0b\t'])$$),
    ($$SELECT idempo.claim(' ', 'k')$$),
    ($$SELECT idempo.create_scope('  ')$$),
    ($$SELECT idempo.create_scope(E'\x0b')$$),
    ($$SELECT idempo.claim('e', repeat('k', 1025))$$),
    ($$SELECT idempo.claim('e', 'k', '{"a":1}', fingerprint => sha256('x'))$$),
    ($$SELECT idempo.claim('e', 'k', fingerprint => '\x0102')$$),
    ($$SELECT idempo.claim('e', 'k', wait => NULL)$$),
    ($$SELECT idempo.claim('e', 'k', complete_on_commit => NULL)$$),
    ($$SELECT idempo.complete(NULL, 'existing', 1)$$),
    ($$SELECT idempo.complete('e', NULL, 1)$$),
    ($$SELECT idempo.complete('e', 'existing', 7)$$),
    ($$SELECT idempo.fail('e', 'existing', 1, 'x', retryable => NULL)$$),
    ($$SELECT idempo.lookup('e', '')$$),
    ($$SELECT idempo.lookup('nope', 'k')$$)
) AS t(stmt);

-- The longest key allowed is 1024 bytes, counted in bytes, not characters.
SELECT outcome FROM idempo.claim('e', repeat('k', 1024));
SELECT regress.err($$SELECT idempo.claim('e', repeat('é', 513))$$);
DELETE FROM idempo.operations WHERE key = repeat('k', 1024);

SELECT pg_temp.snapshot() = s AS nothing_changed FROM before;

-- Whitespace is ASCII's six (space, tab, newline, vertical tab, form feed, carriage return); the
-- letter v is not one of them: a scope or key 'v' is a name like any other.
SELECT name FROM idempo.create_scope('v', retention => '1 hour', lease => '1 minute');
SELECT outcome FROM idempo.claim('v', 'v');
SELECT position, outcome FROM idempo.claim_batch('e', ARRAY['v', E'v\x0b']);
