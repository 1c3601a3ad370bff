-- Optimistic insertion (src/direct.c): while a backend's recent claims were of new keys, it inserts
-- a new key's record without looking for the key first; when the key exists after all, the tuple it
-- inserted is killed again (counted as inserted in the table statistics).  A backend that meets
-- existing keys must soon look first again, so that a burst of replays leaves no dead tuples.
-- pg_prove runs this file in a fresh backend: it starts optimistic.
BEGIN;
SELECT plan(6);

SELECT idempo.create_scope('opt', retention => '1 hour') IS NOT NULL AS created \gset
INSERT INTO idempo.operations (scope, key, fingerprint, status, attempt, first_seen_at, last_attempt_at,
                               completed_at, expires_at, sweep_at, result)
VALUES ('opt', 'done', NULL, 'succeeded', 1, now(), now(), now(), now() + interval '1 hour',
        now() + interval '1 hour', '{"shipment": 1}');

-- tuples this transaction inserted into idempo.operations so far
CREATE FUNCTION pg_temp.inserted() RETURNS bigint LANGUAGE sql AS
$$ SELECT n_tup_ins FROM pg_stat_xact_user_tables WHERE relid = 'idempo.operations'::regclass $$;
-- claims key n times; returns the tuples inserted meanwhile, and fails unless every claim answered want
CREATE FUNCTION pg_temp.claims(k text, n int, want idempo.outcome) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    before bigint := pg_temp.inserted();
    got idempo.outcome;
BEGIN
    FOR i IN 1..n LOOP
        got := (idempo.claim('opt', format(k, i))).outcome;
        IF got IS DISTINCT FROM want THEN
            RAISE EXCEPTION 'claim % answered %, not %', format(k, i), got, want;
        END IF;
    END LOOP;
    RETURN pg_temp.inserted() - before;
END $$;

SELECT is(pg_temp.claims('new-a%s', 5, 'acquired'), 5::bigint, 'five new keys: five records');
SELECT is(pg_temp.claims('done', 1, 'replay'), 1::bigint,
          'after new keys, the claim of an existing key inserts optimistically (and kills the tuple)');
SELECT is((SELECT count(*) FROM idempo.operations WHERE scope = 'opt' AND key = 'done'), 1::bigint,
          'the existing record is still the only one of its key');
SELECT cmp_ok(pg_temp.claims('done', 5, 'replay'), '<=', 3::bigint,
              'a burst of replays stops inserting after a few');
SELECT is(pg_temp.claims('done', 5, 'replay'), 0::bigint, 'the rest of the burst inserts nothing');
SELECT cmp_ok(pg_temp.claims('new-b%s', 20, 'acquired') + pg_temp.claims('done', 1, 'replay'), '=', 21::bigint,
              'after new keys again, the backend is optimistic again');

SELECT * FROM finish();
ROLLBACK;
