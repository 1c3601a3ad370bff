-- The C functions the managed edition does not have: each refuses with 0A000, naming itself,
-- so that the installer is complete and the API's shape (names, arguments, grants) is already
-- the C edition's.  Each moves to a file of its own when it is written (docs/managed-edition.md).
-- (No shared helper: these are SECURITY INVOKER like the C functions, and a caller allowed to
-- EXECUTE one of them has no EXECUTE on a helper.)

-- The counters stay absent (docs/managed-edition.md, "No counters"): in a table they would be
-- a write per claim, serializing claims on a shared row or adding an UPDATE per claim on a row per
-- session, and they would count only claims whose transaction commits, which misses most
-- conflicts.  So counters() and reset_counters() refuse, naming what to read instead.
CREATE FUNCTION idempo.counters()
    RETURNS TABLE (name text, value bigint, since timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempo.counters() is not available in the managed edition' USING ERRCODE = '0A000',
        DETAIL = 'The managed edition has no shared memory to count claims in without a write per claim.',
        HINT = 'Read idempo.stats (operations per status, open reviews and conflicts), idempo.conflicts (every conflict, with its occurrences) and idempo.events (the claims of scopes with audit); docs/managed-edition.md says why.';
END $$;

CREATE FUNCTION idempo.reset_counters() RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempo.reset_counters() is not available in the managed edition' USING ERRCODE = '0A000',
        DETAIL = 'The managed edition has no counters (idempo.counters() says why).',
        HINT = 'docs/managed-edition.md lists what the managed edition has.';
END $$;
