-- Remembered keys and fingerprint rules as a decision table: a finished record x time x incoming
-- fingerprint (same / different / none) -> outcome, status and attempt, in the answer and in
-- the stored row, and whether the stored result is still there.  Scope rk remembers keys for a
-- day after a retention of an hour; rk0 does not (today's behaviour, unchanged).  As in
-- claim_decisions.sql every state is made and every decision taken in a transaction of its own.
SET client_min_messages = warning;
SELECT plan(22 * 4 + 6);

SELECT lives_ok($$SELECT idempo.create_scope('rk', retention => '1 hour', lease => '1 minute', remember => '1 day')$$,
                'scope rk (remember 1 day)');
SELECT lives_ok($$SELECT idempo.create_scope('rk0', retention => '1 hour', lease => '1 minute')$$,
                'scope rk0 (remember 0)');
SELECT lives_ok($$SELECT idempo.create_scope('rk.ignore', retention => '1 hour', lease => '1 minute',
                                             remember => '1 day', fingerprint_ignore => '{at,meta.trace}')$$,
                'scope rk.ignore (remember 1 day, fingerprint_ignore at and meta.trace)');

-- later: seconds after the state was made.  3600 s retention, 86400 s remembered after it.
-- kept: whether the stored result is still there after the decision.
CREATE TEMP TABLE decisions (state text, scope text, later int, fp text,
                             outcome idempo.outcome, status idempo.status, attempt int, kept boolean);
INSERT INTO decisions VALUES
    ('succeeded',      'rk',  0,     'same', 'replay',   'succeeded',   1, true),
    ('succeeded',      'rk',  7300,  'same', 'expired',  'succeeded',   1, false),
    ('succeeded',      'rk',  7300,  'diff', 'conflict', 'succeeded',   1, false),
    ('succeeded',      'rk',  7300,  'none', 'expired',  'succeeded',   1, false),
    ('failed',         'rk',  7300,  'same', 'expired',  'failed',      1, false),
    ('failed',         'rk',  7300,  'diff', 'conflict', 'failed',      1, false),
    ('failed',         'rk',  7300,  'none', 'expired',  'failed',      1, false),
    ('succeeded-nofp', 'rk',  7300,  'diff', 'expired',  'succeeded',   1, false),
    -- shrunk by the sweep first, then claimed
    ('swept',          'rk',  7300,  'same', 'expired',  'succeeded',   1, false),
    ('swept',          'rk',  7300,  'diff', 'conflict', 'succeeded',   1, false),
    -- a day after the result expired the key is forgotten: it starts afresh
    ('succeeded',      'rk',  90100, 'same', 'acquired', 'in_progress', 1, false),
    ('succeeded',      'rk',  90100, 'diff', 'acquired', 'in_progress', 1, false),
    ('swept',          'rk',  90100, 'same', 'acquired', 'in_progress', 1, false),
    -- without remember, an expired record is absent at once, as before
    ('succeeded',      'rk0', 0,     'same', 'replay',   'succeeded',   1, true),
    ('succeeded',      'rk0', 7300,  'same', 'acquired', 'in_progress', 1, false),
    ('succeeded',      'rk0', 7300,  'diff', 'acquired', 'in_progress', 1, false),
    -- fingerprint rules: only the ignored fields differ (same), or another field too (diff)
    ('succeeded',      'rk.ignore', 0,    'same', 'replay',   'succeeded', 1, true),
    ('succeeded',      'rk.ignore', 0,    'diff', 'conflict', 'succeeded', 1, true),
    ('succeeded',      'rk.ignore', 7300, 'same', 'expired',  'succeeded', 1, false),
    ('succeeded',      'rk.ignore', 7300, 'diff', 'conflict', 'succeeded', 1, false),
    -- unfinished work is never remembered: past retention it goes to review
    ('in_progress',    'rk',  7300,  'same', 'in_review', 'in_review',  1, false),
    ('retryable',      'rk',  7300,  'same', 'in_review', 'in_review',  1, false);

-- the request as stored, and as it comes again: the same (in rk.ignore: only the ignored
-- fields differ) or different
CREATE FUNCTION pg_temp.params(fp text, s text DEFAULT '') RETURNS jsonb LANGUAGE sql AS $$
    SELECT CASE WHEN fp = 'stored' OR (fp = 'same' AND s <> 'rk.ignore')
                     THEN '{"v":1,"at":"10:00","meta":{"trace":"t-1","src":"x"}}'::jsonb
                WHEN fp = 'same' THEN '{"v":1,"at":"10:07","meta":{"trace":"t-2","src":"x"}}'::jsonb
                WHEN fp = 'diff' THEN '{"v":2,"at":"10:07","meta":{"trace":"t-2","src":"x"}}'::jsonb END
$$;

CREATE PROCEDURE pg_temp.make(state text, s text, k text) LANGUAGE plpgsql AS $$
BEGIN
    CASE state
    WHEN 'succeeded' THEN
        PERFORM idempo.claim(s, k, pg_temp.params('stored'));
        PERFORM idempo.complete(s, k, 1, '{"r":1}', 'T-1');
    WHEN 'failed' THEN
        PERFORM idempo.claim(s, k, pg_temp.params('stored'));
        PERFORM idempo.fail(s, k, 1, 'e', false);
    WHEN 'succeeded-nofp' THEN
        PERFORM idempo.claim(s, k);
        PERFORM idempo.complete(s, k, 1, '{"r":1}', 'T-1');
    WHEN 'swept' THEN
        PERFORM idempo.claim(s, k, pg_temp.params('stored'));
        PERFORM idempo.complete(s, k, 1, '{"r":1}', 'T-1');
        COMMIT;
        PERFORM set_config('idempo.clock_offset', '7300', true);
        PERFORM idempo.sweep(100000);
        PERFORM set_config('idempo.clock_offset', '0', true);
    WHEN 'in_progress' THEN
        PERFORM idempo.claim(s, k, pg_temp.params('stored'));
    WHEN 'retryable' THEN
        PERFORM idempo.claim(s, k, pg_temp.params('stored'));
        PERFORM idempo.fail(s, k, 1, 'e', true);
    END CASE;
END $$;

CREATE TEMP TABLE tap_out (n serial, line text);
CREATE PROCEDURE pg_temp.run() LANGUAGE plpgsql AS $$
DECLARE
    d record;
    r idempo.claim_result;
    o idempo.operations;
    k text;
    label text;
BEGIN
    FOR d IN SELECT * FROM decisions LOOP
        k := format('%s/%s/%s/%s', d.state, d.scope, d.later, d.fp);
        label := format('%s (%s, +%ss), %s fingerprint', d.state, d.scope, d.later, d.fp);
        CALL pg_temp.make(d.state, d.scope, k);
        COMMIT;
        PERFORM set_config('idempo.clock_offset', d.later::text, true);
        r := idempo.claim(d.scope, k, pg_temp.params(d.fp, d.scope));
        o := idempo.lookup(d.scope, k);
        PERFORM set_config('idempo.clock_offset', '0', true);
        COMMIT;
        INSERT INTO tap_out (line) VALUES (is(r.outcome, d.outcome, label || ': outcome'));
        INSERT INTO tap_out (line) VALUES (is(array[r.status::text, o.status::text],
                                              array[d.status::text, d.status::text],
                                              label || ': status (answer, record)'));
        INSERT INTO tap_out (line) VALUES (is(array[r.attempt, o.attempt], array[d.attempt, d.attempt],
                                              label || ': attempt (answer, record)'));
        INSERT INTO tap_out (line) VALUES (is(o.result IS NOT NULL, d.kept, label || ': result kept'));
    END LOOP;
END $$;

CALL pg_temp.run();
SELECT line FROM tap_out ORDER BY n;

-- What 'expired' answers with: the status, when it finished and the target, no result.
SET idempo.clock_offset = '7300';
SELECT is((SELECT array[r.target_ref, (r.completed_at IS NOT NULL)::text, r.result::text, r.error]
           FROM idempo.claim('rk', 'succeeded/rk/7300/same', pg_temp.params('same', 'rk')) r),
          array['T-1', 'true', NULL, NULL], 'expired answers target_ref and completed_at, no result');
SELECT is((idempo.lookup('rk', 'succeeded/rk/7300/same')).sweep_at
          - (idempo.lookup('rk', 'succeeded/rk/7300/same')).expires_at,
          interval '1 day', 'a remembered key is forgotten a day (remember) after its result expired');
SELECT is((SELECT count(*) FROM idempo.check_consistency()), 0::bigint, 'check_consistency: no problems');
RESET idempo.clock_offset;

SELECT * FROM finish();

DELETE FROM idempo.conflicts WHERE scope LIKE 'rk%';
DELETE FROM idempo.reviews WHERE scope LIKE 'rk%';
DELETE FROM idempo.events WHERE scope LIKE 'rk%';
DELETE FROM idempo.operations WHERE scope LIKE 'rk%';
DELETE FROM idempo.scopes WHERE name LIKE 'rk%';
