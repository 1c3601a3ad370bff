-- test/bench/managed_ladder's floor: what any PL/pgSQL claim of a new key cannot avoid, and
-- nothing else.  Bench code only, never part of the edition: no argument checks, no LOCK TABLE,
-- no key sign, no scope re-check, no expiry or status decision, no audit, no answer for an
-- existing key (it returns NULL), and the note's table neither checked for its owner nor cleaned.
--   bench_floor(scope, key, params): one PL/pgSQL call; the scope row read; the one-query
--     fingerprint of an object whose values are all scalars (the edition's, the same bytes);
--     INSERT ... ON CONFLICT DO NOTHING RETURNING of the record, with the columns a one-call
--     claim writes, into idempo.operations itself;
--   bench_floor(..., p_note => true): the same, and the one row of a temporary table that notes
--     the attempt for the transaction (created at the session's first call, looked up with
--     to_regclass()).  One function for both, so that they differ by nothing else; the test of
--     p_note is a simple expression (no query).
CREATE FUNCTION bench_floor(p_scope text, p_key text, p_params jsonb, p_note boolean DEFAULT false)
    RETURNS idempo.outcome
    LANGUAGE plpgsql AS $$
DECLARE
    s idempo.scopes;
    fp bytea;
    t timestamptz := clock_timestamp();
    o idempo.operations;
BEGIN
    SELECT * INTO s FROM idempo.scopes sc WHERE sc.name = p_scope;
    SELECT sha256('\x4f'::bytea || int4send(count(*)::int) || coalesce(string_agg(
               '\x53'::bytea || int4send(octet_length(convert_to(e.key, 'UTF8'))) || convert_to(e.key, 'UTF8')
               || CASE jsonb_typeof(e.value)
                      WHEN 'string' THEN '\x53'::bytea || int4send(octet_length(convert_to(e.value #>> '{}', 'UTF8')))
                                         || convert_to(e.value #>> '{}', 'UTF8')
                      WHEN 'number' THEN '\x4e'::bytea || int4send(octet_length(convert_to(trim_scale(e.value::numeric)::text, 'UTF8')))
                                         || convert_to(trim_scale(e.value::numeric)::text, 'UTF8')
                      WHEN 'boolean' THEN CASE WHEN e.value::boolean THEN '\x74'::bytea ELSE '\x66'::bytea END
                      WHEN 'null' THEN '\x6e'::bytea END,
               ''::bytea ORDER BY octet_length(e.key), e.key COLLATE "C"), ''::bytea))
      INTO fp FROM jsonb_each(p_params) AS e;
    INSERT INTO idempo.operations AS x (scope, key, fingerprint, status, attempt, run_id, first_seen_at,
                                        last_attempt_at, lease_expires_at, completed_at, expires_at, sweep_at,
                                        result, target_ref, error, params, attempt_base)
    VALUES (s.name, p_key, fp, 'succeeded', 1, NULL, t, t, NULL, t, ((t AT TIME ZONE 'UTC') + s.retention) AT TIME ZONE 'UTC',
            ((t AT TIME ZONE 'UTC') + s.retention) AT TIME ZONE 'UTC',
            NULL, NULL, NULL, CASE WHEN s.store_params THEN p_params END, 0)
    ON CONFLICT (scope, key) DO NOTHING
    RETURNING x.* INTO o;
    IF o.scope IS NOT NULL AND p_note THEN
        IF to_regclass('pg_temp.bench_floor_notes') IS NULL THEN
            CREATE TEMPORARY TABLE bench_floor_notes (
                xact xid8, scope text, key text, kind text, attempt integer, on_commit boolean,
                finished boolean, lease_until timestamptz, replicated boolean);
            CREATE INDEX ON pg_temp.bench_floor_notes (scope, key);
        END IF;
        INSERT INTO pg_temp.bench_floor_notes VALUES (pg_current_xact_id(), s.name, p_key, 'attempt', 1, true, false, NULL, false);
    END IF;
    RETURN CASE WHEN o.scope IS NOT NULL THEN 'acquired' END;
END
$$;

-- the same bytes as the edition's fingerprint (strings, numbers to trim, booleans, null, keys of
-- every length), or the floor is not the floor
BEGIN;
SELECT count(bench_floor('bench', 'fpcheck' || i, jsonb_build_object('sku', 'A-7', 'qty', i * 1.50, 'é', 'ü' || i, 'gift', i % 2 = 0, 'n', NULL)))
  FROM generate_series(1, 200) i;
DO $$
BEGIN
    IF (SELECT count(*) FROM generate_series(1, 200) i
          JOIN idempo.operations o ON o.scope = 'bench' AND o.key = 'fpcheck' || i
         WHERE o.fingerprint = idempo.fingerprint(jsonb_build_object('sku', 'A-7', 'qty', i * 1.50, 'é', 'ü' || i, 'gift', i % 2 = 0, 'n', NULL))) <> 200 THEN
        RAISE EXCEPTION 'the floor''s fingerprint is not the edition''s';
    END IF;
END
$$;
ROLLBACK;
