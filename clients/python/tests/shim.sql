-- FOR TESTS ONLY, on a server whose idempo predates the 0.3.0 functions the library calls
-- (idempo.version(), idempo.heartbeat()): stand-ins with the contract's behaviour.  Loaded by
-- tests/conftest.py only with IDEMPO_TEST_SHIM=1 and only where the function is missing; never
-- in test/run (which tests the real functions).
DO $shim$
BEGIN
  IF to_regprocedure('idempo.version()') IS NULL THEN
    CREATE FUNCTION idempo.version() RETURNS text LANGUAGE sql AS $$ SELECT '0.3.0'::text $$;
  END IF;
  IF to_regprocedure('idempo.heartbeat(text, text, integer, interval)') IS NULL THEN
    CREATE FUNCTION idempo.heartbeat(scope text, key text, attempt integer, extend interval DEFAULT NULL)
    RETURNS timestamptz LANGUAGE plpgsql AS $$
    DECLARE r idempo.operations; l interval; t timestamptz;
    BEGIN
      SELECT * INTO r FROM idempo.operations o WHERE o.scope = heartbeat.scope AND o.key = heartbeat.key FOR UPDATE;
      IF NOT FOUND THEN
        RAISE EXCEPTION 'no operation with key "%" in scope "%"', key, scope USING ERRCODE = '42704';
      END IF;
      IF r.status <> 'in_progress' OR r.attempt <> heartbeat.attempt THEN
        RAISE EXCEPTION 'attempt % of key "%" in scope "%" is not running (status %, attempt %)',
          heartbeat.attempt, key, scope, r.status, r.attempt USING ERRCODE = '55000';
      END IF;
      SELECT s.lease INTO l FROM idempo.scopes s WHERE s.name = heartbeat.scope;
      t := greatest(r.lease_expires_at, idempo.now() + coalesce(extend, l));
      UPDATE idempo.operations o SET lease_expires_at = t, sweep_at = t
       WHERE o.scope = heartbeat.scope AND o.key = heartbeat.key;
      RETURN t;
    END $$;
  END IF;
END $shim$;
