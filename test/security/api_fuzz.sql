-- Random and hostile input for idempo's SQL API (test/run, suite "api-fuzz").
-- fuzz.run(n) makes n calls of fingerprint (with and without ignored paths), claim, complete,
-- fail, verify, resolve, request_review, release, lookup, sweep and the scope functions with
-- random arguments (hostile fingerprint_ignore paths and remember intervals, NULLs in every
-- position, empty/huge/non-ASCII keys, deep and large jsonb, extreme numbers, zero/negative/huge
-- intervals, unknown enum text, random clock offsets), each in its own subtransaction, and
-- counts the SQLSTATE every call ended with.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempo;
CREATE SCHEMA fuzz;
-- one tally per session (backend pid), so that concurrent sessions never wait for each other here
CREATE TABLE fuzz.outcomes (pid int, fn text, sqlstate text, message text, calls bigint,
                            PRIMARY KEY (pid, fn, sqlstate));

SELECT count(*) AS scopes FROM (SELECT idempo.create_scope(s.name, retention => '1 hour', lease => '1 minute', verify_settle => '1 minute',
                           on_lease_expiry => s.expiry, max_attempts => s.max_attempts, hash_keys => s.hash_keys,
                           store_params => s.store_params, audit => s.audit, require_fingerprint => s.req)
FROM (VALUES ('f.plain', 'unknown', NULL::int, false, false, false, false),
             ('f.hashed', 'unknown', NULL, true, true, true, false),
             ('f.retry', 'retry', 2, false, true, false, true),
             ('f.limited', 'unknown', 1, false, false, true, false))
     AS s(name, expiry, max_attempts, hash_keys, store_params, audit, req)) c;
-- remembered keys (a day after the hour of retention) and fields left out of the fingerprint
SELECT name FROM idempo.create_scope('f.remember', retention => '1 hour', lease => '1 minute',
                                     remember => '1 day', store_params => true, audit => true,
                                     fingerprint_ignore => '{qty,a.qty,x}');

CREATE FUNCTION fuzz.pick(VARIADIC choices text[]) RETURNS text LANGUAGE sql VOLATILE AS
  $$SELECT choices[1 + floor(random() * array_length(choices, 1))::int]$$;

CREATE FUNCTION fuzz.txt() RETURNS text LANGUAGE sql VOLATILE AS $$
  SELECT CASE floor(random() * 14)::int
    WHEN 0 THEN NULL WHEN 1 THEN '' WHEN 2 THEN ' ' WHEN 3 THEN repeat('k', 1024)
    WHEN 4 THEN repeat('k', 1025) WHEN 5 THEN repeat('é', 513) WHEN 6 THEN 'ü日本🙂/' || floor(random() * 5)
    WHEN 7 THEN E'line\nbreak\ttab' WHEN 8 THEN $q$'; DROP TABLE idempo.operations; --$q$
    WHEN 9 THEN '%s%n%x' WHEN 10 THEN repeat('x', 200000)
    ELSE 'k' || floor(random() * 40) END
$$;

CREATE FUNCTION fuzz.scope() RETURNS text LANGUAGE sql VOLATILE AS $$
  SELECT CASE WHEN random() < 0.85 THEN fuzz.pick('f.plain', 'f.hashed', 'f.retry', 'f.limited', 'f.remember')
              ELSE fuzz.txt() END
$$;

CREATE FUNCTION fuzz.key() RETURNS text LANGUAGE sql VOLATILE AS $$
  SELECT CASE WHEN random() < 0.8 THEN 'k' || floor(random() * 60) ELSE fuzz.txt() END
$$;

CREATE FUNCTION fuzz.num() RETURNS text LANGUAGE sql VOLATILE AS $$
  SELECT fuzz.pick('0', '-0.0', '1', '1.000', '-1e-30', '1e300', '123456789012345678901234567890.5',
                   '1e1000', '-1e1000', '0.' || repeat('0', 500) || '1', '42')
$$;

-- a random jsonb document (as text), sometimes deep, sometimes large
CREATE FUNCTION fuzz.doc(depth int DEFAULT 0) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE r float := random(); n int; parts text[] := '{}';
BEGIN
  IF depth = 0 AND r < 0.02 THEN
    n := 1 + floor(random() * 3000)::int;
    RETURN repeat('[', n) || repeat(']', n);
  ELSIF depth = 0 AND r < 0.04 THEN
    RETURN (SELECT jsonb_agg(g)::text FROM generate_series(1, 1 + floor(random() * 20000)::int) g);
  ELSIF depth > 3 OR r < 0.4 THEN
    RETURN CASE floor(random() * 6)::int WHEN 0 THEN 'null' WHEN 1 THEN 'true' WHEN 2 THEN fuzz.num()
           WHEN 3 THEN to_jsonb(coalesce(fuzz.txt(), ''))::text ELSE to_jsonb('v' || floor(random() * 3))::text END;
  ELSIF r < 0.7 THEN
    FOR i IN 1 .. floor(random() * 4)::int LOOP parts := parts || fuzz.doc(depth + 1); END LOOP;
    RETURN '[' || array_to_string(parts, ',') || ']';
  ELSE
    FOR i IN 1 .. floor(random() * 4)::int LOOP
      parts := parts || (to_jsonb(fuzz.pick('qty', 'sku', 'a', '', 'ü', 'qty'))::text || ':' || fuzz.doc(depth + 1));
    END LOOP;
    RETURN '{' || array_to_string(parts, ',') || '}';
  END IF;
END $$;

-- params: mostly the same document per key (replays), sometimes another (conflicts), or NULL
CREATE FUNCTION fuzz.params(k text) RETURNS jsonb LANGUAGE sql VOLATILE AS $$
  SELECT CASE WHEN random() < 0.3 THEN NULL
              WHEN random() < 0.95 THEN jsonb_build_object('key', k)
              ELSE fuzz.doc()::jsonb END
$$;

CREATE FUNCTION fuzz.ival() RETURNS interval LANGUAGE sql VOLATILE AS $$
  SELECT fuzz.pick(NULL, '0', '-1 second', '1 microsecond', '1 second', '5 minutes', '2 hours', '1 day',
                   '1 month', '-3 days', '178000000 years', '1 month -29 days')::interval
$$;

-- fingerprint_ignore paths: sensible, empty, NULL, malformed, too many, too long, deep, 2-D
CREATE FUNCTION fuzz.paths() RETURNS text[] LANGUAGE sql VOLATILE AS $$
  SELECT CASE floor(random() * 12)::int
    WHEN 0 THEN NULL WHEN 1 THEN '{}' WHEN 2 THEN '{""}' WHEN 3 THEN ARRAY[NULL]::text[]
    WHEN 4 THEN '{a..b}' WHEN 5 THEN '{.,qty.}' WHEN 6 THEN (SELECT array_agg(g::text) FROM generate_series(1, 300) g)
    WHEN 7 THEN ARRAY[repeat('a', 5000)] WHEN 8 THEN ARRAY[repeat('qty.', 400) || 'qty']
    WHEN 9 THEN '{{qty},{sku}}' WHEN 10 THEN ARRAY[fuzz.txt()]
    ELSE fuzz.pick('{qty}', '{a.qty,sku}', '{ü,qty.a.b}', '{key}')::text[] END
$$;

CREATE FUNCTION fuzz.ts() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$
  SELECT CASE floor(random() * 7)::int WHEN 0 THEN NULL WHEN 1 THEN 'infinity' WHEN 2 THEN '-infinity'
              WHEN 3 THEN '4713-01-01 BC' WHEN 4 THEN now() - interval '10 years'
              WHEN 5 THEN now() + interval '10 years' ELSE now() - interval '1 minute' END::timestamptz
$$;

CREATE FUNCTION fuzz.int4() RETURNS int LANGUAGE sql VOLATILE AS $$
  SELECT fuzz.pick(NULL, '0', '-1', '1', '1', '2', '3', '2147483647', '-2147483648')::int
$$;

CREATE FUNCTION fuzz.bool() RETURNS boolean LANGUAGE sql VOLATILE AS $$
  SELECT fuzz.pick(NULL, 'true', 'false', 'true', 'false')::boolean
$$;

-- fingerprint_include paths: fuzz.paths()' kinds, and paths into arrays, escapes, bad brackets
CREATE FUNCTION fuzz.include_paths() RETURNS text[] LANGUAGE sql VOLATILE AS $$
  SELECT CASE floor(random() * 4)::int
    WHEN 0 THEN fuzz.paths()
    WHEN 1 THEN fuzz.pick('{items[*].sku}', '{items[*],qty}', '{a[*][*].b,sku}', '{"a\\.b",c\\[0]}')::text[]
    WHEN 2 THEN fuzz.pick('{"a[0]"}', '{"[*].a"}', '{"a[*]b"}', '{"a\\\\"}', '{"a["}')::text[]
    ELSE ARRAY[repeat('x[*].', 200) || 'x'] END
$$;

CREATE FUNCTION fuzz.one() RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE fname text := fuzz.pick('fingerprint', 'fingerprint_ignore', 'fingerprint_include', 'claim', 'claim', 'claim', 'claim',
                             'heartbeat', 'heartbeat',
                             'complete', 'complete', 'fail', 'verify', 'resolve', 'request_review',
                             'release', 'lookup', 'sweep',
                             'create_scope', 'alter_scope', 'enable_scope', 'disable_scope',
                             'resolve_conflict', 'stored_key');
        k text := fuzz.key();
        st text := '00000';
        msg text;
BEGIN
  BEGIN
    IF random() < 0.2 THEN
      PERFORM set_config('idempo.clock_offset', fuzz.pick('0', '120', '4000', '-4000', '90000'), true);
    END IF;
    CASE fname
    WHEN 'fingerprint' THEN PERFORM idempo.fingerprint(fuzz.doc()::jsonb);
    WHEN 'fingerprint_ignore' THEN PERFORM idempo.fingerprint(fuzz.doc()::jsonb, fuzz.paths());
    WHEN 'fingerprint_include' THEN PERFORM idempo.fingerprint(fuzz.doc()::jsonb, fuzz.paths(), fuzz.include_paths());
    WHEN 'heartbeat' THEN PERFORM idempo.heartbeat(fuzz.scope(), k, fuzz.int4(), fuzz.ival());
    WHEN 'release' THEN PERFORM idempo.release(fuzz.scope(), k, fuzz.txt(), fuzz.txt());
    WHEN 'claim' THEN
      PERFORM idempo.claim(fuzz.scope(), k,
                           CASE WHEN random() < 0.97 THEN fuzz.params(k) END,
                           CASE WHEN random() < 0.03 THEN fuzz.pick(NULL, '\x00', '\x0102')::bytea END,
                           fuzz.txt(), CASE WHEN random() < 0.2 THEN fuzz.ts() END,
                           coalesce(fuzz.bool(), random() < 0.95), coalesce(fuzz.bool(), random() < 0.95) AND random() < 0.3,
                           CASE WHEN random() < 0.2 THEN fuzz.ival() END);
    WHEN 'complete' THEN PERFORM idempo.complete(fuzz.scope(), k, fuzz.int4(), fuzz.params(k), fuzz.txt());
    WHEN 'fail' THEN PERFORM idempo.fail(fuzz.scope(), k, fuzz.int4(), fuzz.txt(), fuzz.bool());
    WHEN 'verify' THEN PERFORM idempo.verify(fuzz.scope(), k, fuzz.int4(), fuzz.bool(), fuzz.txt(), fuzz.params(k));
    WHEN 'resolve' THEN PERFORM idempo.resolve(fuzz.scope(), k,
                                               fuzz.pick('succeeded', 'not_executed', 'failed', 'maybe', '', NULL),
                                               fuzz.txt(), fuzz.txt(), fuzz.params(k), fuzz.txt());
    WHEN 'request_review' THEN PERFORM idempo.request_review(fuzz.scope(), k, fuzz.txt());
    WHEN 'lookup' THEN PERFORM idempo.lookup(fuzz.scope(), k);
    WHEN 'stored_key' THEN PERFORM idempo.stored_key(fuzz.scope(), k);
    WHEN 'sweep' THEN PERFORM * FROM idempo.sweep(fuzz.pick('1', '100', '0', '-5', NULL, '100001')::int);
    WHEN 'create_scope' THEN
      PERFORM idempo.create_scope(CASE WHEN random() < 0.5 THEN 'new.' || floor(random() * 50) ELSE fuzz.txt() END,
                                  fuzz.ival(), fuzz.ival(), fuzz.pick('unknown', 'retry', 'bogus', NULL),
                                  fuzz.ival(), fuzz.int4(), fuzz.bool(), fuzz.bool(), fuzz.bool(), fuzz.bool(),
                                  fuzz.pick(NULL, 'postgres', 'no_such_role', '')::name, fuzz.txt(), fuzz.txt(), fuzz.txt(),
                                  remember => fuzz.ival(),
                                  fingerprint_ignore => fuzz.paths(), fingerprint_include => fuzz.include_paths());
    WHEN 'alter_scope' THEN
      PERFORM idempo.alter_scope(fuzz.scope(), fuzz.ival(), fuzz.ival(), fuzz.pick('unknown', 'retry', 'bogus', NULL),
                                 fuzz.ival(), fuzz.int4(), fuzz.bool(), fuzz.bool(), fuzz.bool(), fuzz.bool(),
                                 fuzz.pick(NULL, 'postgres', 'no_such_role', '')::name, fuzz.txt(), fuzz.txt(), fuzz.txt(),
                                 remember => fuzz.ival(),
                                 fingerprint_ignore => fuzz.paths(),
                                 fingerprint_include => CASE WHEN random() < 0.5 THEN fuzz.include_paths() END);
    WHEN 'enable_scope' THEN PERFORM idempo.enable_scope(fuzz.scope());
    WHEN 'disable_scope' THEN PERFORM idempo.disable_scope(fuzz.scope());
    WHEN 'resolve_conflict' THEN
      PERFORM idempo.resolve_conflict(fuzz.pick(NULL, '1', '2', '3', '-1', '9223372036854775807')::bigint,
                                      fuzz.pick('kept_stored', 'new_key', 'dismissed', 'bogus', NULL), fuzz.txt(), fuzz.txt());
    END CASE;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
  END;
  INSERT INTO fuzz.outcomes VALUES (pg_backend_pid(), fname, st, left(msg, 200), 1)
  ON CONFLICT (pid, fn, sqlstate) DO UPDATE SET calls = fuzz.outcomes.calls + 1;
  RETURN st;
END $$;

CREATE PROCEDURE fuzz.run(n int) LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1 .. n LOOP
    PERFORM fuzz.one();
    COMMIT;   -- every call its own transaction: concurrent sessions hold no locks across calls
    IF random() < 0.05 THEN
      -- keep the main scopes usable most of the time (a transaction of its own, fixed order)
      PERFORM idempo.enable_scope(s) FROM unnest(ARRAY['f.plain', 'f.hashed', 'f.retry', 'f.limited', 'f.remember']) s;
      COMMIT;
    END IF;
  END LOOP;
END $$;
