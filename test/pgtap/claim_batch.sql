-- claim_batch answers each element as claim() answers the same key in the same state: the
-- decision table of claim_decisions.sql taken twice, once key by key with claim() and once
-- with one claim_batch() per (scope, time) over all the states (in a scrambled order), and the
-- answers and the stored records compared; the conflicts recorded are the same.  Then batches
-- with keys given many times: each key is handed out (acquired/unknown) to one element at most,
-- the others name its first occurrence.
SET client_min_messages = warning;
SELECT plan(3 + 3 + 3);

SELECT lives_ok($$SELECT idempo.create_scope('bt', retention => '1 hour', lease => '1 minute', max_attempts => 3)$$,
                'scope bt');
SELECT lives_ok($$SELECT idempo.create_scope('bt.retry', retention => '1 hour', lease => '1 minute',
                                            on_lease_expiry => 'retry', max_attempts => 1)$$,
                'scope bt.retry (on_lease_expiry retry, max_attempts 1)');
SELECT lives_ok($$SELECT idempo.create_scope('bt.hash', retention => '1 hour', lease => '1 minute',
                                            hash_keys => true, fingerprint_ignore => '{t}')$$,
                'scope bt.hash (hash_keys, fingerprint_ignore)');

CREATE TEMP TABLE states (state text);
INSERT INTO states VALUES ('none'), ('in_progress'), ('retryable'), ('succeeded'), ('failed'),
                          ('unknown'), ('in_review'), ('in_progress-nofp'), ('succeeded-nofp');
CREATE TEMP TABLE cases AS
    SELECT s.state, sc.scope, l.later, f.fp, format('%s/%s/%s', s.state, l.later, f.fp) AS k
    FROM states s, (VALUES ('bt'), ('bt.retry'), ('bt.hash')) sc(scope),
         (VALUES (0), (120), (200), (7300)) l(later), (VALUES ('same'), ('diff'), ('none')) f(fp);

-- Brings key k of scope s into a state, with params {"v":1} (-nofp: without params).
CREATE PROCEDURE pg_temp.make(state text, s text, k text) LANGUAGE plpgsql AS $$
BEGIN
    CASE state
    WHEN 'none' THEN NULL;
    WHEN 'in_progress' THEN PERFORM idempo.claim(s, k, '{"v":1}');
    WHEN 'retryable' THEN PERFORM idempo.claim(s, k, '{"v":1}'); PERFORM idempo.fail(s, k, 1, 'e', true);
    WHEN 'succeeded' THEN PERFORM idempo.claim(s, k, '{"v":1}'); PERFORM idempo.complete(s, k, 1, '{"r":1}');
    WHEN 'failed' THEN PERFORM idempo.claim(s, k, '{"v":1}'); PERFORM idempo.fail(s, k, 1, 'e', false);
    WHEN 'unknown' THEN
        PERFORM idempo.claim(s, k, '{"v":1}');
        COMMIT;
        PERFORM set_config('idempo.clock_offset', '90', true);
        PERFORM idempo.claim(s, k, '{"v":1}');   -- the lease ran out: unknown
        PERFORM set_config('idempo.clock_offset', '0', true);
    WHEN 'in_review' THEN PERFORM idempo.claim(s, k, '{"v":1}', intent_at => now() - interval '1 day');
    WHEN 'in_progress-nofp' THEN PERFORM idempo.claim(s, k);
    WHEN 'succeeded-nofp' THEN PERFORM idempo.claim(s, k); PERFORM idempo.complete(s, k, 1, '{"r":1}');
    END CASE;
END $$;

-- the same request: in bt.hash with a field that the scope ignores, different each time
CREATE FUNCTION pg_temp.same(s text, t int) RETURNS jsonb LANGUAGE sql AS
  $$ SELECT CASE s WHEN 'bt.hash' THEN jsonb_build_object('v', 1, 't', t) ELSE '{"v":1}' END $$;

CREATE TEMP TABLE answers (how text, scope text, k text, outcome idempo.outcome, status idempo.status,
                           attempt int, result jsonb, has_conflict bool, has_review bool,
                           rec_status idempo.status, rec_attempt int);
CREATE PROCEDURE pg_temp.run() LANGUAGE plpgsql AS $$
DECLARE
    c record;
    g record;
    r idempo.claim_result;
BEGIN
    FOR c IN SELECT * FROM cases LOOP
        CALL pg_temp.make(c.state, c.scope, 'single/' || c.k);
        COMMIT;
        CALL pg_temp.make(c.state, c.scope, 'batch/' || c.k);
        COMMIT;
    END LOOP;
    -- one claim per key, each in its own transaction
    FOR c IN SELECT * FROM cases LOOP
        PERFORM set_config('idempo.clock_offset', c.later::text, true);
        r := idempo.claim(c.scope, 'single/' || c.k, CASE c.fp WHEN 'same' THEN pg_temp.same(c.scope, 1)
                                                              WHEN 'diff' THEN '{"v":2}'::jsonb END);
        INSERT INTO answers VALUES ('single', c.scope, c.k, r.outcome, r.status, r.attempt, r.result,
                                    r.conflict_id IS NOT NULL, r.review_id IS NOT NULL);
        COMMIT;
    END LOOP;
    -- one batch per scope and time, its keys in a scrambled order
    FOR g IN SELECT DISTINCT scope, later FROM cases LOOP
        PERFORM set_config('idempo.clock_offset', g.later::text, true);
        INSERT INTO answers
        SELECT 'batch', g.scope, substr(b.key, 7), b.outcome, b.status, b.attempt, b.result,
               b.conflict_id IS NOT NULL, b.review_id IS NOT NULL
        FROM (SELECT array_agg('batch/' || k ORDER BY md5(k)) AS keys,
                     array_agg(CASE fp WHEN 'same' THEN pg_temp.same(g.scope, 2)
                                       WHEN 'diff' THEN '{"v":2}'::jsonb END ORDER BY md5(k)) AS params
              FROM cases WHERE scope = g.scope AND later = g.later) a,
             idempo.claim_batch(g.scope, a.keys, a.params) b;
        COMMIT;
    END LOOP;
    PERFORM set_config('idempo.clock_offset', '0', true);
    UPDATE answers a SET rec_status = (idempo.lookup(a.scope, a.how || '/' || a.k)).status,
                         rec_attempt = (idempo.lookup(a.scope, a.how || '/' || a.k)).attempt;
END $$;

CALL pg_temp.run();

SELECT is((SELECT count(*) FROM answers WHERE how = 'batch'), (SELECT count(*) FROM cases),
          'one batch answer per case');
SELECT results_eq(
    $$SELECT scope, k, outcome, status, attempt, result, has_conflict, has_review, rec_status, rec_attempt
      FROM answers WHERE how = 'batch' ORDER BY 1, 2$$,
    $$SELECT scope, k, outcome, status, attempt, result, has_conflict, has_review, rec_status, rec_attempt
      FROM answers WHERE how = 'single' ORDER BY 1, 2$$,
    'every element of the batches answered and left its record as a claim of the key did');
SELECT results_eq(
    $$SELECT scope, substr(key, 7) FROM idempo.conflicts WHERE key LIKE 'batch/%' ORDER BY 1, 2$$,
    $$SELECT scope, substr(key, 8) FROM idempo.conflicts WHERE key LIKE 'single/%' ORDER BY 1, 2$$,
    'the same conflicts were recorded');

-- keys given many times, in random batches: at most one element per key is handed the work,
-- and every other occurrence names the first
CREATE TEMP TABLE dup_answers AS
SELECT n, b.*
FROM generate_series(1, 20) n,
     LATERAL (SELECT array_agg('dup/' || n || '/' || ((random() * 5)::int + 0 * g)) AS keys,
                     array_agg(jsonb_build_object('v', (random() * 1.2)::int + 0 * g)) AS params
              FROM generate_series(1, 30) g) a,
     LATERAL idempo.claim_batch('bt', a.keys, a.params) b;
SELECT is((SELECT count(*) FROM (SELECT n, key FROM dup_answers WHERE outcome IN ('acquired', 'unknown')
                                 GROUP BY n, key HAVING count(*) > 1) x), 0::bigint,
          'no key was handed out twice in a batch');
SELECT is((SELECT count(*) FROM dup_answers d
           WHERE (d.duplicate_of IS NULL) <>
                 (d.position = (SELECT min(position) FROM dup_answers e WHERE e.n = d.n AND e.key = d.key))),
          0::bigint, 'duplicate_of is set exactly on the later occurrences');
SELECT is((SELECT count(*) FROM dup_answers d JOIN dup_answers f
                ON f.n = d.n AND f.position = d.duplicate_of
           WHERE f.key <> d.key OR f.duplicate_of IS NOT NULL), 0::bigint,
          'duplicate_of names the first occurrence of the same key');

SELECT * FROM finish();

DELETE FROM idempo.conflicts WHERE scope LIKE 'bt%';
DELETE FROM idempo.reviews WHERE scope LIKE 'bt%';
DELETE FROM idempo.events WHERE scope LIKE 'bt%';
DELETE FROM idempo.operations WHERE scope LIKE 'bt%';
DELETE FROM idempo.scopes WHERE name LIKE 'bt%';
