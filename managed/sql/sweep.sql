-- idempo.sweep() (src/sweep.c) in PL/pgSQL: one batch of the rows whose sweep_at has come,
-- oldest first, taken FOR UPDATE SKIP LOCKED (a sweep never waits for a claim), decided as a
-- claim decides (expiry.c), then one statement per kind of change over arrays of row ids.  The
-- background worker that calls it in the C edition is a pg_cron job here: schedule_sweep()
-- schedules sweep_until_done(), which sweeps batch after batch while they are full.

-- One batch; also how many rows it examined (rows_seen), so that sweep_until_done() knows
-- whether more are due (sweep.c: rows_seen).
CREATE FUNCTION idempo.managed_sweep(batch integer,
    OUT lease_expired bigint, OUT moved_to_review bigint, OUT purged bigint, OUT rows_seen bigint)
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    t timestamptz;
    r record;
    s idempo.scopes;
    review_at timestamptz;
    forget_at timestamptz;
    n_lease bigint := 0;
    n_review bigint := 0;
    n_purge bigint := 0;
    purge_tids tid[] := '{}';
    review_tids tid[] := '{}';
    set_tids tid[] := '{}';
    set_status text[] := '{}';
    set_sweep timestamptz[] := '{}';
    set_clear boolean[] := '{}';
    shrink_tids tid[] := '{}';
    shrink_sweep timestamptz[] := '{}';
    to_status idempo.status;
    n_seen bigint := 0;
BEGIN
    IF $1 IS NULL THEN
        RAISE EXCEPTION 'batch must not be NULL' USING ERRCODE = '22004', HINT = 'Pass the number of rows to handle, e.g. 1000.';
    END IF;
    IF $1 < 1 OR $1 > 100000 THEN
        RAISE EXCEPTION 'batch must be between 1 and 100000, not %', $1
            USING ERRCODE = '22023', HINT = 'Call sweep() again while it reports full batches.';
    END IF;
    IF current_setting('transaction_read_only')::boolean THEN
        IF pg_is_in_recovery() THEN
            RAISE EXCEPTION 'idempo.sweep() cannot run in a read-only transaction' USING ERRCODE = '25006',
                DETAIL = 'This server is a standby: the primary sweeps, and its changes arrive here by replication.',
                HINT = 'Run idempo.sweep() on the primary. A job scheduled on every node skips the standbys with: DO $x$BEGIN IF NOT pg_is_in_recovery() THEN PERFORM idempo.sweep(); END IF; END$x$';
        END IF;
        RAISE EXCEPTION 'idempo.sweep() cannot run in a read-only transaction' USING ERRCODE = '25006',
            DETAIL = 'The sweep changes and deletes records.', HINT = 'Run idempo.sweep() in a read-write transaction.';
    END IF;
    t := idempo.now();
    -- the lock the batch's writes take anyway, before it reads a due row or a scope (sweep.c)
    LOCK TABLE idempo.operations IN ROW EXCLUSIVE MODE;
    FOR r IN SELECT o.ctid AS tid, o.* FROM idempo.operations o
             WHERE o.sweep_at <= t ORDER BY o.sweep_at LIMIT $1 FOR UPDATE SKIP LOCKED LOOP
        n_seen := n_seen + 1;
        IF s.name IS DISTINCT FROM r.scope THEN
            SELECT * INTO s FROM idempo.scopes sc WHERE sc.name = r.scope;
            IF FOUND THEN
                PERFORM idempo.managed_scope_current(s);
            ELSE
                s := NULL;
                RAISE WARNING 'idempo sweep: scope "%" of an operation does not exist', r.scope
                    USING HINT = format('Recreate the scope with idempo.create_scope(''%s''); its operations are looked at again hourly.', r.scope);
                set_tids := set_tids || r.tid;
                set_status := set_status || r.status::text;
                set_sweep := set_sweep || (t + interval '1 hour');
                set_clear := set_clear || false;
                CONTINUE;
            END IF;
        END IF;
        review_at := idempo.managed_plus(r.first_seen_at, s.retention);
        IF r.status IN ('succeeded', 'failed') THEN
            IF r.sweep_at > r.expires_at THEN                  -- remembered: forgotten when due
                IF r.sweep_at <= t THEN
                    purge_tids := purge_tids || r.tid;
                    n_purge := n_purge + 1;
                ELSE
                    set_tids := set_tids || r.tid; set_status := set_status || r.status::text;
                    set_sweep := set_sweep || r.sweep_at; set_clear := set_clear || false;
                END IF;
            ELSIF r.expires_at > t THEN
                set_tids := set_tids || r.tid; set_status := set_status || r.status::text;
                set_sweep := set_sweep || r.expires_at; set_clear := set_clear || false;
            ELSIF s.remember <= '0'::interval THEN
                purge_tids := purge_tids || r.tid;
                n_purge := n_purge + 1;
            ELSE
                forget_at := idempo.managed_plus(r.expires_at, s.remember);
                IF forget_at <= t THEN
                    purge_tids := purge_tids || r.tid;
                    n_purge := n_purge + 1;
                ELSE
                    shrink_tids := shrink_tids || r.tid;
                    shrink_sweep := shrink_sweep || forget_at;
                END IF;
            END IF;
        ELSIF r.status NOT IN ('in_progress', 'retryable', 'unknown') THEN
            set_tids := set_tids || r.tid; set_status := set_status || r.status::text;
            set_sweep := set_sweep || NULL::timestamptz; set_clear := set_clear || false;
        ELSIF review_at <= t THEN
            review_tids := review_tids || r.tid;
            n_review := n_review + 1;
            IF s.audit THEN
                INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, outcome, action, actor)
                VALUES (t, r.scope, r.key, NULL, r.attempt, r.status, 'in_review', NULL, 'sweep', idempo.managed_caller());
            END IF;
        ELSIF r.status = 'in_progress' AND r.lease_expires_at <= t THEN
            to_status := CASE WHEN s.on_lease_expiry = 'retry' THEN 'retryable' ELSE 'unknown' END;
            set_tids := set_tids || r.tid; set_status := set_status || to_status::text;
            set_sweep := set_sweep || review_at; set_clear := set_clear || true;
            n_lease := n_lease + 1;
            IF s.audit THEN
                INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, outcome, action, actor)
                VALUES (t, r.scope, r.key, NULL, r.attempt, r.status, to_status, NULL, 'sweep', idempo.managed_caller());
            END IF;
        ELSE
            -- sweep_at was early: come back when something is due
            set_tids := set_tids || r.tid; set_status := set_status || r.status::text;
            set_sweep := set_sweep || CASE WHEN r.status = 'in_progress' THEN LEAST(r.lease_expires_at, review_at)
                                           ELSE review_at END;
            set_clear := set_clear || false;
        END IF;
    END LOOP;

    IF cardinality(review_tids) > 0 THEN
        INSERT INTO idempo.reviews (scope, key, reason, opened_at, operation, detail)
        SELECT o.scope, o.key, 'retention_expired', t, o,
               format('still %s at attempt %s when the scope''s retention ran out (first seen %s)',
                      o.status, o.attempt, o.first_seen_at)
        FROM idempo.operations o WHERE o.ctid = ANY (review_tids)
        ON CONFLICT (scope, key) WHERE resolved_at IS NULL DO NOTHING;
        UPDATE idempo.operations o SET status = 'in_review', sweep_at = NULL, lease_expires_at = NULL
         WHERE o.ctid = ANY (review_tids);
    END IF;
    IF cardinality(set_tids) > 0 THEN
        UPDATE idempo.operations o
           SET status = d.status::idempo.status, sweep_at = d.sweep_at,
               -- an attempt made unknown keeps its lease's end: verify's settle window counts from there
               last_attempt_at = CASE WHEN d.clear_lease AND d.status = 'unknown' THEN o.lease_expires_at
                                      ELSE o.last_attempt_at END,
               lease_expires_at = CASE WHEN d.clear_lease THEN NULL ELSE o.lease_expires_at END
          FROM ROWS FROM (unnest(set_tids), unnest(set_status), unnest(set_sweep), unnest(set_clear))
               AS d(tid, status, sweep_at, clear_lease)
         WHERE o.ctid = d.tid;
    END IF;
    IF cardinality(shrink_tids) > 0 THEN
        UPDATE idempo.operations o
           SET result = NULL, params = NULL, error = NULL, run_id = NULL, sweep_at = d.sweep_at
          FROM ROWS FROM (unnest(shrink_tids), unnest(shrink_sweep)) AS d(tid, sweep_at)
         WHERE o.ctid = d.tid;
    END IF;
    IF cardinality(purge_tids) > 0 THEN
        DELETE FROM idempo.operations o WHERE o.ctid = ANY (purge_tids);
    END IF;
    lease_expired := n_lease;
    moved_to_review := n_review;
    purged := n_purge;
    rows_seen := n_seen;
END
$$;

-- managed-differs: security: writes idempo's tables, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.sweep(batch integer DEFAULT 1000)
    RETURNS TABLE (lease_expired bigint, moved_to_review bigint, purged bigint)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER ROWS 1 SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT m.lease_expired, m.moved_to_review, m.purged FROM idempo.managed_sweep($1) m;
END
$$;

-- What the pg_cron job calls: batches, each committed, while the last one was full (as the C
-- edition's sweeper loops), at most max_batches.  A procedure, SECURITY INVOKER and without SET
-- clauses, so that it may COMMIT; the job runs as the role that scheduled it (idempo's owner).
-- Each batch first takes the locks of every table and sequence the sweep uses, in one go and
-- without waiting (NOWAIT; a 1 ms lock_timeout for the sequences, which LOCK TABLE does not
-- take), and the round leaves when one is held or awaited: a round that held idempo.operations
-- and then waited to read idempo.scopes deadlocked with a DROP EXTENSION that held scopes and
-- waited for operations (40P01 after deadlock_timeout, the round or the drop cancelled).  So a
-- round never waits for a lock while it holds one of idempo's: a drop waits for the batch in
-- flight, and the next round finds idempo gone.  (The C edition's sweeper holds the
-- extension's own lock, which DROP EXTENSION takes first; SQL cannot take it.)
CREATE PROCEDURE idempo.sweep_until_done(batch integer DEFAULT 1000, max_batches integer DEFAULT 100)
    LANGUAGE plpgsql AS $$
DECLARE
    seen bigint;
    old_timeout text := current_setting('lock_timeout');
BEGIN
    FOR i IN 1 .. max_batches LOOP
        BEGIN
            LOCK TABLE idempo.scopes, idempo.operations, idempo.reviews, idempo.events IN ROW EXCLUSIVE MODE NOWAIT;
            PERFORM set_config('lock_timeout', '1ms', true);
            PERFORM FROM idempo.reviews_id_seq;
            PERFORM FROM idempo.events_id_seq;
            PERFORM set_config('lock_timeout', old_timeout, true);
        EXCEPTION WHEN lock_not_available OR undefined_table OR invalid_schema_name THEN
            -- idempo is gone (a drop committed since the last batch): nothing to sweep
            IF to_regclass('idempo.operations') IS NOT NULL THEN
                RAISE NOTICE 'idempo sweep: the round stops: % (the next round sweeps)', SQLERRM
                    USING DETAIL = 'A lock on one of idempo''s tables is held or awaited, by DROP EXTENSION, ALTER TABLE, VACUUM FULL, LOCK TABLE or the like; the sweep does not wait for it while holding its own.';
            END IF;
            RETURN;
        END;
        SELECT m.rows_seen INTO seen FROM idempo.managed_sweep(batch) m;
        COMMIT;
        EXIT WHEN seen < batch;
    END LOOP;
END
$$;
-- The install's REVOKE ALL ON ALL FUNCTIONS IN SCHEMA idempo leaves procedures out (PostgreSQL's
-- ALL FUNCTIONS does): nothing for PUBLIC here either (docs/security.md)
REVOKE ALL ON PROCEDURE idempo.sweep_until_done(integer, integer) FROM PUBLIC;

-- The sweep as a pg_cron job of this database, named 'idempo sweep: DATABASE'.  pg_cron must be
-- installed in this database (its cron.database_name); elsewhere the error says what to run in
-- pg_cron's database.  A second job is refused (42710) unless replace => true reschedules it.
-- schedule: pg_cron's syntax ('* * * * *': every minute; '10 seconds' from pg_cron 1.5 on).
CREATE FUNCTION idempo.schedule_sweep(schedule text DEFAULT '* * * * *', replace boolean DEFAULT false)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_name text := 'idempo sweep: ' || current_database();
    command text := 'CALL idempo.sweep_until_done()';
    existing bigint;
    id bigint;
BEGIN
    IF to_regnamespace('cron') IS NULL THEN
        RAISE EXCEPTION 'pg_cron is not installed in database "%"', current_database()
            USING ERRCODE = '0A000',
                  HINT = format('Create the extension pg_cron here, or in the database it runs in (its setting cron.database_name), schedule the sweep with: SELECT cron.schedule_in_database(%L, %L, %L, %L);',
                                job_name, schedule, command, current_database());
    END IF;
    EXECUTE 'SELECT jobid FROM cron.job WHERE jobname = $1' INTO existing USING job_name;
    IF existing IS NOT NULL AND NOT replace THEN
        RAISE EXCEPTION 'the sweep of database "%" is scheduled already (pg_cron job %)', current_database(), existing
            USING ERRCODE = '42710',
                  HINT = 'Pass replace => true to change its schedule, or remove it with idempo.unschedule_sweep().';
    END IF;
    -- cron.schedule(name, ...) replaces a job of the same name and owner
    EXECUTE 'SELECT cron.schedule($1, $2, $3)' INTO id USING job_name, schedule, command;
    RETURN id;
END
$$;

-- Removes the sweep's pg_cron job of this database; false if there was none.
CREATE FUNCTION idempo.unschedule_sweep() RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    job_name text := 'idempo sweep: ' || current_database();
    existing bigint;
BEGIN
    IF to_regnamespace('cron') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT jobid FROM cron.job WHERE jobname = $1' INTO existing USING job_name;
    IF existing IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT cron.unschedule($1)' USING existing;
    RETURN true;
END
$$;
