-- The C functions the managed edition does not have yet: each refuses with 0A000, naming itself,
-- so that the installer is complete and the API's shape (names, arguments, grants) is already
-- the C edition's.  Each moves to a file of its own when it is written (docs/managed-edition.md).
-- (No shared helper: these are SECURITY INVOKER like the C functions, and a caller allowed to
-- EXECUTE one of them has no EXECUTE on a helper.)

CREATE FUNCTION idempo.counters()
    RETURNS TABLE (name text, value bigint, since timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempo.counters() is not available in the managed edition yet' USING ERRCODE = '0A000',
        HINT = 'docs/managed-edition.md lists what the managed edition has.';
END $$;

CREATE FUNCTION idempo.reset_counters() RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempo.reset_counters() is not available in the managed edition yet' USING ERRCODE = '0A000',
        HINT = 'docs/managed-edition.md lists what the managed edition has.';
END $$;
