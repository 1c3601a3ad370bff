-- The claim decision table: existing state x incoming fingerprint (same / different / none)
-- -> outcome, resulting status and attempt, checked both in claim's answer and in the stored row.
-- States ending in -nofp were claimed without params: a stored record without a fingerprint
-- is never compared (same and diff are then just "some fingerprint").
-- Each state is made and each decision taken in a transaction of its own (a claim by the
-- transaction that acquired the key answers that again), so the file runs without an outer
-- transaction: procedures commit, the TAP lines are collected and printed at the end, and the
-- scopes' rows are deleted.
SET client_min_messages = warning;
SELECT plan(60 * 3 + 3 + 5);

SELECT lives_ok($$SELECT idempo.create_scope('dt', retention => '1 hour', lease => '1 minute', max_attempts => 3)$$,
                'scope dt');
SELECT lives_ok($$SELECT idempo.create_scope('dt.retry', retention => '1 hour', lease => '1 minute',
                                            on_lease_expiry => 'retry', max_attempts => 1)$$,
                'scope dt.retry (on_lease_expiry retry, max_attempts 1)');
SELECT lives_ok($$SELECT idempo.create_scope('dt.retry.nolimit', retention => '1 hour', lease => '1 minute',
                                            on_lease_expiry => 'retry')$$,
                'scope dt.retry.nolimit (on_lease_expiry retry, no attempt limit)');

-- state: how the record was made; later: seconds after which the decision is taken
CREATE TEMP TABLE decisions (state text, scope text, later int, fp text,
                             outcome idempo.outcome, status idempo.status, attempt int);
INSERT INTO decisions VALUES
    ('none',                'dt',       0,    'same', 'acquired',  'in_progress', 1),
    ('none',                'dt',       0,    'diff', 'acquired',  'in_progress', 1),
    ('none',                'dt',       0,    'none', 'acquired',  'in_progress', 1),
    ('in_progress',         'dt',       0,    'same', 'busy',      'in_progress', 1),
    ('in_progress',         'dt',       0,    'diff', 'conflict',  'in_progress', 1),
    ('in_progress',         'dt',       0,    'none', 'busy',      'in_progress', 1),
    ('in_progress',         'dt',       120,  'same', 'unknown',   'unknown',     1),
    ('in_progress',         'dt',       120,  'diff', 'conflict',  'unknown',     1),
    ('in_progress',         'dt',       120,  'none', 'unknown',   'unknown',     1),
    ('in_progress',         'dt.retry', 120,  'same', 'in_review', 'in_review',   1),
    ('in_progress',         'dt.retry', 120,  'diff', 'conflict',  'in_progress', 1),
    ('in_progress',         'dt.retry', 120,  'none', 'in_review', 'in_review',   1),
    ('in_progress',         'dt.retry.nolimit', 120, 'same', 'acquired', 'in_progress', 2),
    ('in_progress',         'dt.retry.nolimit', 120, 'diff', 'conflict', 'in_progress', 1),
    ('in_progress',         'dt.retry.nolimit', 120, 'none', 'acquired', 'in_progress', 2),
    ('retryable',           'dt',       0,    'same', 'acquired',  'in_progress', 2),
    ('retryable',           'dt',       0,    'diff', 'conflict',  'retryable',   1),
    ('retryable',           'dt',       0,    'none', 'acquired',  'in_progress', 2),
    ('retryable',           'dt.retry', 0,    'same', 'in_review', 'in_review',   1),
    ('retryable',           'dt.retry', 0,    'diff', 'conflict',  'retryable',   1),
    ('retryable',           'dt.retry', 0,    'none', 'in_review', 'in_review',   1),
    ('succeeded',           'dt',       0,    'same', 'replay',    'succeeded',   1),
    ('succeeded',           'dt',       0,    'diff', 'conflict',  'succeeded',   1),
    ('succeeded',           'dt',       0,    'none', 'replay',    'succeeded',   1),
    ('failed',              'dt',       0,    'same', 'replay',    'failed',      1),
    ('failed',              'dt',       0,    'diff', 'conflict',  'failed',      1),
    ('failed',              'dt',       0,    'none', 'replay',    'failed',      1),
    -- the claim that made it unknown (at +90s) holds the verification lease for a minute:
    -- busy until it runs out, then the next claim answers unknown (and takes it)
    ('unknown',             'dt',       120,  'same', 'busy',      'unknown',     1),
    ('unknown',             'dt',       120,  'diff', 'conflict',  'unknown',     1),
    ('unknown',             'dt',       120,  'none', 'busy',      'unknown',     1),
    ('unknown',             'dt',       200,  'same', 'unknown',   'unknown',     1),
    ('unknown',             'dt',       200,  'diff', 'conflict',  'unknown',     1),
    ('unknown',             'dt',       200,  'none', 'unknown',   'unknown',     1),
    ('in_review',           'dt',       0,    'same', 'in_review', 'in_review',   0),
    ('in_review',           'dt',       0,    'diff', 'conflict',  'in_review',   0),
    ('in_review',           'dt',       0,    'none', 'in_review', 'in_review',   0),
    -- expiry comes first: a finished record past expires_at is absent ...
    ('succeeded',           'dt',       7300, 'same', 'acquired',  'in_progress', 1),
    ('succeeded',           'dt',       7300, 'diff', 'acquired',  'in_progress', 1),
    ('succeeded',           'dt',       7300, 'none', 'acquired',  'in_progress', 1),
    -- ... and unfinished work past retention goes to review
    ('retryable',           'dt',       7300, 'same', 'in_review', 'in_review',   1),
    ('retryable',           'dt',       7300, 'diff', 'conflict',  'in_review',   1),
    ('retryable',           'dt',       7300, 'none', 'in_review', 'in_review',   1),
    -- stored without a fingerprint x incoming with one (or none): no conflict, ever
    ('in_progress-nofp',    'dt',       0,    'same', 'busy',      'in_progress', 1),
    ('in_progress-nofp',    'dt',       0,    'diff', 'busy',      'in_progress', 1),
    ('in_progress-nofp',    'dt',       0,    'none', 'busy',      'in_progress', 1),
    ('retryable-nofp',      'dt',       0,    'same', 'acquired',  'in_progress', 2),
    ('retryable-nofp',      'dt',       0,    'diff', 'acquired',  'in_progress', 2),
    ('retryable-nofp',      'dt',       0,    'none', 'acquired',  'in_progress', 2),
    ('succeeded-nofp',      'dt',       0,    'same', 'replay',    'succeeded',   1),
    ('succeeded-nofp',      'dt',       0,    'diff', 'replay',    'succeeded',   1),
    ('succeeded-nofp',      'dt',       0,    'none', 'replay',    'succeeded',   1),
    ('failed-nofp',         'dt',       0,    'same', 'replay',    'failed',      1),
    ('failed-nofp',         'dt',       0,    'diff', 'replay',    'failed',      1),
    ('failed-nofp',         'dt',       0,    'none', 'replay',    'failed',      1),
    ('unknown-nofp',        'dt',       120,  'same', 'busy',      'unknown',     1),
    ('unknown-nofp',        'dt',       120,  'diff', 'busy',      'unknown',     1),
    ('unknown-nofp',        'dt',       120,  'none', 'busy',      'unknown',     1),
    ('unknown-nofp',        'dt',       200,  'same', 'unknown',   'unknown',     1),
    ('unknown-nofp',        'dt',       200,  'diff', 'unknown',   'unknown',     1),
    ('unknown-nofp',        'dt',       200,  'none', 'unknown',   'unknown',     1);

-- Brings key k of scope s into a state, with params {"v":1} (-nofp: without params).
CREATE PROCEDURE pg_temp.make(state text, s text, k text) LANGUAGE plpgsql AS $$
BEGIN
    IF state LIKE '%-nofp' THEN
        PERFORM idempo.claim(s, k);
        CASE state
        WHEN 'in_progress-nofp' THEN NULL;
        WHEN 'retryable-nofp' THEN PERFORM idempo.fail(s, k, 1, 'e', true);
        WHEN 'succeeded-nofp' THEN PERFORM idempo.complete(s, k, 1, '{"r":1}');
        WHEN 'failed-nofp' THEN PERFORM idempo.fail(s, k, 1, 'e', false);
        WHEN 'unknown-nofp' THEN
            COMMIT;
            PERFORM set_config('idempo.clock_offset', '90', true);
            PERFORM idempo.claim(s, k);   -- the lease ran out: unknown
            PERFORM set_config('idempo.clock_offset', '0', true);
        END CASE;
        RETURN;
    END IF;
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
        r := idempo.claim(d.scope, k, CASE d.fp WHEN 'same' THEN '{"v":1}'::jsonb
                                                WHEN 'diff' THEN '{"v":2}'::jsonb END);
        o := idempo.lookup(d.scope, k);
        PERFORM set_config('idempo.clock_offset', '0', true);
        COMMIT;
        INSERT INTO tap_out (line) VALUES (is(r.outcome, d.outcome, label || ': outcome'));
        INSERT INTO tap_out (line) VALUES (is(array[r.status::text, o.status::text],
                                              array[d.status::text, d.status::text],
                                              label || ': status (answer, record)'));
        INSERT INTO tap_out (line) VALUES (is(array[r.attempt, o.attempt], array[d.attempt, d.attempt],
                                              label || ': attempt (answer, record)'));
    END LOOP;
END $$;

CALL pg_temp.run();
SELECT line FROM tap_out ORDER BY n;

-- A retryable record without a fingerprint adopts the one of the claim that acquires it;
-- from then on a different fingerprint is a conflict.  A replay writes nothing.
SELECT is((idempo.lookup('dt', 'retryable-nofp/dt/0/diff')).fingerprint, idempo.fingerprint('{"v":2}'),
          'retryable without fingerprint, acquired with one: the record adopts it');
SELECT is((idempo.claim('dt', 'retryable-nofp/dt/0/diff', '{"v":1}')).outcome, 'conflict',
          'and a claim with another fingerprint is then a conflict');
SELECT is((idempo.lookup('dt', 'retryable-nofp/dt/0/none')).fingerprint, NULL,
          'acquired again without params: still no fingerprint');
SELECT is((idempo.lookup('dt', 'succeeded-nofp/dt/0/diff')).fingerprint, NULL,
          'a replay does not store the incoming fingerprint');
SELECT is((SELECT count(*) FROM idempo.conflicts WHERE key LIKE '%-nofp/%'), 1::bigint,
          'the only conflict among records stored without a fingerprint is the one after adoption');

SELECT * FROM finish();

DELETE FROM idempo.conflicts WHERE scope IN ('dt', 'dt.retry', 'dt.retry.nolimit');
DELETE FROM idempo.reviews WHERE scope IN ('dt', 'dt.retry', 'dt.retry.nolimit');
DELETE FROM idempo.events WHERE scope IN ('dt', 'dt.retry', 'dt.retry.nolimit');
DELETE FROM idempo.operations WHERE scope IN ('dt', 'dt.retry', 'dt.retry.nolimit');
DELETE FROM idempo.scopes WHERE name IN ('dt', 'dt.retry', 'dt.retry.nolimit');
