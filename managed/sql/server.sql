-- What the C edition does with the server's own machinery (GUCs, shared memory, the relcache, an
-- event trigger, background workers), done with what a role that is not a superuser has.

-- idempo.clock_offset is a placeholder setting here (no library defines it, so any role can set
-- it for its own session, where the C edition allows only a superuser): it is honoured only for
-- a session user who is a member of the role that owns idempo's tables (the admin who installed
-- it, as the tests run), and refused for anyone else, who could otherwise run leases out early
-- and take over a key in flight.
CREATE FUNCTION idempo.now() RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    off text := current_setting('idempo.clock_offset', true);
BEGIN
    IF off IS NULL OR off IN ('', '0') THEN
        RETURN clock_timestamp();
    END IF;
    IF NOT pg_has_role(session_user,
                       (SELECT c.relowner FROM pg_class c WHERE c.oid = 'idempo.operations'::regclass), 'MEMBER') THEN
        RAISE EXCEPTION 'idempo.clock_offset is set, and role "%" may not shift idempo''s clock', session_user
            USING ERRCODE = '42501',
                  HINT = 'RESET idempo.clock_offset: in the managed edition only members of the role that owns idempo''s tables may use it (tests).';
    END IF;
    -- on the calendar of UTC, as src/clock.c adds
    RETURN ((clock_timestamp() AT TIME ZONE 'UTC') + off::interval) AT TIME ZONE 'UTC';
END
$$;

-- The C edition's trigger drops every backend's cache of the scopes; the managed edition reads
-- idempo.scopes at each call and has no cache to drop.
CREATE FUNCTION idempo.scopes_changed() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END
$$;

-- Not yet: the C edition refuses writes where idempo's records come from a publisher by logical
-- replication (src/replication.c); the managed edition does not look yet.
CREATE FUNCTION idempo.refuse_on_subscriber(scope text, key text) RETURNS void
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN
END
$$;

-- No background workers: the sweep will be a pg_cron job.  No rows.
CREATE FUNCTION idempo.workers()
    RETURNS TABLE (kind text, database_id oid, pid integer, state text, rounds bigint,
                   wakeups bigint, last_round_at timestamptz, next_round_at timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL SAFE AS $$
BEGIN
END
$$;

-- Event triggers need a superuser (CREATE EVENT TRIGGER): the DROP guard is absent.
-- managed-omit: function idempo.drop_guard: its event trigger needs a superuser
-- managed-omit: event trigger idempo_drop_guard: CREATE EVENT TRIGGER needs a superuser
