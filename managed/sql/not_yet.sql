-- The C functions the managed edition does not have yet: each refuses with 0A000, naming itself,
-- so that the installer is complete and the API's shape (names, arguments, grants) is already
-- the C edition's.  Each moves to a file of its own when it is written (docs/managed-edition.md).

CREATE FUNCTION idempo.not_yet(what text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION '% is not available in the managed edition yet', what
        USING ERRCODE = '0A000', HINT = 'See docs/managed-edition.md for what the managed edition has.';
END
$$;

CREATE FUNCTION idempo.claim(
    scope              text,
    key                text,
    params             jsonb       DEFAULT NULL,
    fingerprint        bytea       DEFAULT NULL,
    run_id             text        DEFAULT NULL,
    intent_at          timestamptz DEFAULT NULL,
    wait               boolean     DEFAULT true,
    complete_on_commit boolean     DEFAULT false)
    RETURNS idempo.claim_result
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.claim()'); END $$;

CREATE FUNCTION idempo.complete(
    scope      text,
    key        text,
    attempt    integer DEFAULT NULL,
    result     jsonb   DEFAULT NULL,
    target_ref text    DEFAULT NULL)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.complete()'); END $$;

CREATE FUNCTION idempo.fail(
    scope     text,
    key       text,
    attempt   integer DEFAULT NULL,
    error     text    DEFAULT NULL,
    retryable boolean DEFAULT true)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.fail()'); END $$;

CREATE FUNCTION idempo.lookup(scope text, key text) RETURNS idempo.operations
    LANGUAGE plpgsql STABLE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.lookup()'); END $$;

CREATE FUNCTION idempo.stored_key(scope text, key text) RETURNS text
    LANGUAGE plpgsql STABLE PARALLEL RESTRICTED AS $$
BEGIN PERFORM idempo.not_yet('idempo.stored_key()'); END $$;

CREATE FUNCTION idempo.verify(
    scope      text,
    key        text,
    attempt    integer,
    found      boolean,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.verify()'); END $$;

CREATE FUNCTION idempo.verify(
    scope      text,
    key        text,
    found      boolean,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.verify()'); END $$;

CREATE FUNCTION idempo.resolve(
    scope      text,
    key        text,
    resolution text,
    reviewer   text,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL,
    note       text  DEFAULT NULL)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.resolve()'); END $$;

CREATE FUNCTION idempo.request_review(scope text, key text, note text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.request_review()'); END $$;

CREATE FUNCTION idempo.sweep(batch integer DEFAULT 1000)
    RETURNS TABLE (lease_expired bigint, moved_to_review bigint, purged bigint)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE ROWS 1 AS $$
BEGIN PERFORM idempo.not_yet('idempo.sweep()'); END $$;

CREATE FUNCTION idempo.counters()
    RETURNS TABLE (name text, value bigint, since timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.counters()'); END $$;

CREATE FUNCTION idempo.reset_counters() RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN PERFORM idempo.not_yet('idempo.reset_counters()'); END $$;
