-- claim, complete, fail (src/claim.c, src/finish.c, src/expiry.c, src/txn_attempts.c,
-- src/durability.c, src/conflicts.c) in PL/pgSQL, on the same tables with the same statements'
-- effects.  Not yet: the logical-replication subscriber check, the counters.
--
-- The attempts this transaction acquired (what complete/fail with attempt => NULL finish, and
-- what makes a second claim in the owning transaction answer 'acquired' again) are rows of a
-- temporary table of the session, owned by the tables' owner (so a caller cannot write them),
-- each row marked with its transaction's id: a rolled-back subtransaction takes its rows with
-- it, as the C edition's memory forgets them, and rows of earlier transactions are ignored and
-- deleted at the next transaction's first note, or truncated once the table passes 16 pages (ON
-- COMMIT DELETE ROWS would truncate the table at every commit, which costs more than the
-- claim).  A transaction that used it cannot PREPARE TRANSACTION (docs/managed-edition.md).

-- The edition's own transaction-local settings are named idempo_managed.*, not idempo.*: the C
-- edition's library reserves the prefix "idempo" for its settings, so on a server that loads it
-- (moving between editions, tests of both editions on one server) an idempo.* placeholder
-- cannot be set (42602, "idempo" is a reserved prefix).

-- t + iv on the calendar of UTC, as src/clock.c adds (idempo_time_plus)
CREATE FUNCTION idempo.managed_plus(t timestamptz, iv interval) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE AS $$
    SELECT ((t AT TIME ZONE 'UTC') + iv) AT TIME ZONE 'UTC'
$$;

-- The session's table of this transaction's attempts, created on first use; refused if a
-- table of that name is not ours (a caller's own temporary table would let it forge attempts).
CREATE FUNCTION idempo.managed_txn_table() RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    t regclass;
    mine boolean;
    checked boolean;
BEGIN
    -- one catalog query per use (to_regclass() and then pg_class were two)
    SELECT c.oid, c.relowner = current_user::regrole AND c.relkind = 'r',
           EXISTS (SELECT FROM pg_trigger g WHERE g.tgrelid = c.oid AND g.tgname = 'idempo_durability')
      INTO t, mine, checked FROM pg_class c
     WHERE c.relnamespace = pg_my_temp_schema() AND c.relname = 'idempo_txn_attempts';
    IF t IS NULL THEN
        -- kind 'attempt': an attempt this transaction acquired; 'verify': a verification lease it
        -- took (claim.c: verify_leases), known by the exact lease_until it wrote; 'conflict': a
        -- conflict it recorded itself (only so that it cannot PREPARE); 'durability': one row once
        -- it acquired in a scope with durability 'replicated', whose event is checked at the
        -- commit, and 'probe' (managed_durability_check)
        CREATE TEMPORARY TABLE idempo_txn_attempts (
            xact xid8, scope text, key text, kind text, attempt integer, on_commit boolean,
            finished boolean, lease_until timestamptz, replicated boolean);
        -- a transaction may claim thousands of keys (a batch)
        CREATE INDEX ON pg_temp.idempo_txn_attempts (scope, key);
        mine := true;
        checked := false;
    END IF;
    IF NOT mine THEN
        RAISE EXCEPTION 'pg_temp.idempo_txn_attempts is not idempo''s' USING ERRCODE = '42501',
            HINT = 'Drop the temporary table of that name: idempo keeps the attempts of the transaction in it.';
    END IF;
    IF NOT checked THEN
        -- durability 'replicated': checked at commit, after SET LOCAL synchronous_commit and the
        -- like (durability.c); the events of a rolled-back subtransaction go with it.  (Created
        -- again when a DROP EXTENSION took it with the function.)
        CREATE CONSTRAINT TRIGGER idempo_durability AFTER INSERT OR UPDATE ON pg_temp.idempo_txn_attempts
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.kind IN ('durability', 'probe'))
            EXECUTE FUNCTION idempo.managed_durability_check();
    END IF;
END
$$;

-- Before the commit of a transaction that acquired a key of a scope with durability
-- 'replicated': refused (ID001) unless the commit waits for a synchronous standby (durability.c,
-- with the settings a session can read).  The event of the transaction's 'durability' row fires
-- at the commit (a deferred constraint trigger: PL/pgSQL has no commit hook), after any SET
-- LOCAL of the transaction -- unless SET CONSTRAINTS ... IMMEDIATE fires it earlier, after
-- which a SET LOCAL synchronous_commit = local went unseen.  So the trigger first finds out
-- whether its constraint is deferred now (a probe event of the same constraint fires at the end
-- of its INSERT only if it is immediate): deferred, it is the commit (or PREPARE), and it checks;
-- immediate, it is not, and it defers the constraint again and queues its event anew, for the
-- commit.  SECURITY DEFINER: it writes idempo's owner's table, at the caller's commit.
CREATE FUNCTION idempo.managed_durability_check() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    why text;
    a record;
BEGIN
    IF NEW.kind = 'probe' THEN
        PERFORM set_config('idempo_managed.durability_probe', 'immediate', true);
        RETURN NULL;
    END IF;
    PERFORM set_config('idempo_managed.durability_probe', '', true);
    INSERT INTO pg_temp.idempo_txn_attempts (xact, kind) VALUES (NEW.xact, 'probe');
    DELETE FROM pg_temp.idempo_txn_attempts t WHERE t.xact = NEW.xact AND t.kind = 'probe';
    IF current_setting('idempo_managed.durability_probe') = 'immediate' THEN
        SET CONSTRAINTS pg_temp.idempo_durability DEFERRED;
        UPDATE pg_temp.idempo_txn_attempts t SET xact = t.xact WHERE t.xact = NEW.xact AND t.kind = 'durability';
        RETURN NULL;
    END IF;
    -- the commit: the first acquisition it holds in such a scope (a rolled-back subtransaction's
    -- rows are gone, and one acquired again in a scope now 'local' is not 'replicated' any more)
    SELECT t.scope, t.key INTO a FROM pg_temp.idempo_txn_attempts t
     WHERE t.xact = NEW.xact AND t.kind = 'attempt' AND t.replicated ORDER BY t.ctid LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF current_setting('max_wal_senders')::int <= 0 THEN
        why := 'max_wal_senders is 0, so no standby can be synchronous';
    ELSIF current_setting('synchronous_commit') IN ('off', 'local') THEN
        why := format('synchronous_commit is "%s", which does not wait for a standby', current_setting('synchronous_commit'));
    ELSIF current_setting('synchronous_standby_names') = '' THEN
        why := 'no synchronous standby is configured (synchronous_standby_names is empty)';
    END IF;
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'cannot commit the claim of key "%" in scope "%": the commit would not wait for a synchronous standby', a.key, a.scope
            USING ERRCODE = 'ID001', DETAIL = format('Scope "%s" has durability ''replicated'', and %s.', a.scope, why),
                  HINT = 'Commit with synchronous_commit = on, remote_write or remote_apply and a synchronous standby (synchronous_standby_names, or Patroni''s synchronous_mode); or, if a failover may lose the claim, alter the scope with durability => ''local''.';
    END IF;
    RETURN NULL;
END
$$;

-- Notes (kind, scope, key) for this transaction, replacing its earlier note of the same.
CREATE FUNCTION idempo.managed_txn_note(p_kind text, p_scope text, p_key text, p_attempt integer,
                                        p_on_commit boolean, p_lease_until timestamptz, p_replicated boolean)
    RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cur xid8 := pg_current_xact_id();
    rel oid;
    ours boolean;
    first_note boolean;
    mark text;
BEGIN
    -- managed_txn_table()'s check, without its call where the table is there, ours and armed;
    -- it makes, refuses or arms the table otherwise
    SELECT c.oid, c.relowner = current_user::regrole AND c.relkind = 'r'
                  AND EXISTS (SELECT FROM pg_trigger g WHERE g.tgrelid = c.oid AND g.tgname = 'idempo_durability')
      INTO rel, ours
      FROM pg_class c WHERE c.relnamespace = pg_my_temp_schema() AND c.relname = 'idempo_txn_attempts';
    IF NOT coalesce(ours, false) THEN
        PERFORM idempo.managed_txn_table();
        rel := 'pg_temp.idempo_txn_attempts'::regclass;
    END IF;
    -- The rows of earlier transactions go once per transaction, at its first note: no lookup
    -- reads them (each is marked with its transaction's id, which never comes again), and
    -- deleting them at every note made the N notes of one transaction (a claim_batch of N keys)
    -- scan N^2/2 rows.  The mark is a setting of this transaction: a rolled-back subtransaction
    -- takes it with its DELETE; a caller who sets it only keeps old rows in the table.
    first_note := coalesce(current_setting('idempo_managed.txn_clean', true), '') <> cur::text;
    IF first_note THEN
        mark := set_config('idempo_managed.txn_clean', cur::text, true);
        -- Nothing vacuums a temporary table: past 16 pages it is emptied at once, when it holds
        -- no row of this transaction (TRUNCATE would refuse a pending durability event, and
        -- must not take this transaction's attempts); the size first, a simple expression, and
        -- the query only past 16 pages
        IF pg_relation_size(rel) > 16 * current_setting('block_size')::int THEN
            IF NOT EXISTS (SELECT FROM pg_temp.idempo_txn_attempts t WHERE t.xact = cur) THEN
                TRUNCATE pg_temp.idempo_txn_attempts;
                first_note := false;
            END IF;
        END IF;
    END IF;
    -- one statement rather than three (each statement of PL/pgSQL costs its own setup in every
    -- transaction): the rows of earlier transactions go (at the first note only), and the note
    -- replaces this transaction's of the same (scope, key, kind) or is added
    WITH gone AS (DELETE FROM pg_temp.idempo_txn_attempts t WHERE first_note AND t.xact <> cur),
    noted AS (
        UPDATE pg_temp.idempo_txn_attempts t
           SET attempt = p_attempt, on_commit = p_on_commit, finished = false, lease_until = p_lease_until,
               replicated = p_replicated
         WHERE t.xact = cur AND t.scope = p_scope AND t.key = p_key AND t.kind = p_kind
        RETURNING 1)
    INSERT INTO pg_temp.idempo_txn_attempts
    SELECT cur, p_scope, p_key, p_kind, p_attempt, p_on_commit, false, p_lease_until, p_replicated
     WHERE NOT EXISTS (SELECT FROM noted);
    -- the transaction's durability row, whose event is checked at the commit (once per transaction)
    -- (p_replicated first, a simple expression: the query only in such a scope)
    IF p_replicated THEN
        IF NOT EXISTS (SELECT FROM pg_temp.idempo_txn_attempts t WHERE t.xact = cur AND t.kind = 'durability') THEN
            INSERT INTO pg_temp.idempo_txn_attempts (xact, kind) VALUES (cur, 'durability');
        END IF;
    END IF;
END
$$;

CREATE FUNCTION idempo.managed_txn_remember(p_scope text, p_key text, p_attempt integer, p_on_commit boolean,
                                            p_replicated boolean)
    RETURNS void LANGUAGE sql AS $$
    SELECT idempo.managed_txn_note('attempt', p_scope, p_key, p_attempt, p_on_commit, NULL, p_replicated)
$$;

-- (attempt, on_commit, finished) of this transaction's attempt of the key, or no row; and
-- (kind 'verify') the lease it took, in lease_until
CREATE FUNCTION idempo.managed_txn_lookup(p_scope text, p_key text, p_kind text DEFAULT 'attempt',
                                          OUT attempt integer, OUT on_commit boolean, OUT finished boolean,
                                          OUT lease_until timestamptz)
    LANGUAGE plpgsql AS $$
DECLARE
    cur xid8 := pg_current_xact_id_if_assigned();   -- none: this transaction wrote nothing yet
BEGIN
    IF cur IS NULL OR to_regclass('pg_temp.idempo_txn_attempts') IS NULL THEN
        RETURN;
    END IF;
    PERFORM idempo.managed_txn_table();
    SELECT t.attempt, t.on_commit, t.finished, t.lease_until INTO attempt, on_commit, finished, lease_until
    FROM pg_temp.idempo_txn_attempts t
    WHERE t.xact = cur AND t.scope = p_scope AND t.key = p_key AND t.kind = p_kind;
END
$$;

-- The document without the fields a scope ignores (src/fingerprint_rules.c; the same rule as
-- idempo.fingerprint(params, ignore), which must not call a helper PUBLIC cannot execute)
CREATE FUNCTION idempo.managed_without(params jsonb, ignore text[]) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p text;
    segs text[];
    through_objects boolean;
BEGIN
    IF params IS NULL OR jsonb_typeof(params) <> 'object' OR coalesce(cardinality(ignore), 0) = 0 THEN
        RETURN params;
    END IF;
    FOREACH p IN ARRAY ignore LOOP
        segs := string_to_array(p, '.');
        through_objects := true;
        FOR d IN 1 .. cardinality(segs) - 1 LOOP
            IF jsonb_typeof(params #> segs[1:d]) IS DISTINCT FROM 'object' THEN
                through_objects := false;
                EXIT;
            END IF;
        END LOOP;
        IF through_objects THEN
            params := params #- segs;
        END IF;
    END LOOP;
    RETURN params;
END
$$;

-- A claim in a read-only transaction that would have to write is refused, saying why (claim.c).
CREATE FUNCTION idempo.managed_must_write(read_only boolean, p_scope text, p_key text, why text)
    RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF read_only THEN
        RAISE EXCEPTION 'cannot claim key "%" in scope "%" in a read-only transaction', p_key, p_scope
            USING ERRCODE = '25006', DETAIL = format('The claim must write: %s.', why),
                  HINT = CASE WHEN pg_is_in_recovery() THEN 'This server is a standby: claim on the primary.'
                              ELSE 'Claim in a read-write transaction; a read-only one gets only the answers that need no write (replay, expired, busy, in_review).' END;
    END IF;
END
$$;

-- Opens a review of the operation as it is now (audit.c: idempo_open_review); its id.
CREATE FUNCTION idempo.managed_open_review(p_scope text, p_key text, p_reason text, p_detail text, p_at timestamptz)
    RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    id bigint;
BEGIN
    INSERT INTO idempo.reviews AS r (scope, key, reason, opened_at, operation, detail)
    SELECT p_scope, p_key, p_reason, p_at, o, p_detail FROM idempo.operations o
     WHERE o.scope = p_scope AND o.key = p_key
    ON CONFLICT (scope, key) WHERE resolved_at IS NULL DO NOTHING
    RETURNING r.id INTO id;
    IF id IS NULL THEN
        SELECT r.id INTO id FROM idempo.reviews r WHERE r.scope = p_scope AND r.key = p_key AND r.resolved_at IS NULL;
    END IF;
    IF id IS NULL THEN
        RAISE EXCEPTION 'could not open a review of operation "%" in scope "%": it does not exist', p_key, p_scope;
    END IF;
    RETURN id;
END
$$;

-- The state of a freshly acquired attempt (claim.c: row_acquire); attempt and first_seen_at set by the caller
CREATE FUNCTION idempo.managed_acquire(o idempo.operations, s idempo.scopes, p_now timestamptz, p_fp bytea,
                                       p_params jsonb, p_run_id text, p_on_commit boolean)
    RETURNS idempo.operations LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    o.last_attempt_at := p_now;
    o.run_id := p_run_id;
    IF p_fp IS NOT NULL AND o.fingerprint IS NULL THEN
        o.fingerprint := p_fp;
    END IF;
    IF s.store_params AND p_params IS NOT NULL AND o.params IS NULL THEN
        o.params := p_params;
    END IF;
    o.result := NULL;
    o.target_ref := NULL;
    o.error := NULL;
    IF p_on_commit THEN
        o.status := 'succeeded';
        o.lease_expires_at := NULL;
        o.completed_at := p_now;
        o.expires_at := idempo.managed_plus(p_now, s.retention);
        o.sweep_at := o.expires_at;
    ELSE
        o.status := 'in_progress';
        o.lease_expires_at := idempo.managed_plus(p_now, s.lease);
        o.completed_at := NULL;
        o.expires_at := NULL;
        o.sweep_at := LEAST(o.lease_expires_at, idempo.managed_plus(o.first_seen_at, s.retention));
    END IF;
    RETURN o;
END
$$;

-- A brand-new record (attempt 1), or a stale one (attempt 0, in review): claim.c's row_new
CREATE FUNCTION idempo.managed_new_row(s idempo.scopes, p_key text, p_now timestamptz, p_fp bytea,
                                       p_params jsonb, p_run_id text, p_on_commit boolean, p_stale boolean)
    RETURNS idempo.operations LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    o idempo.operations;
BEGIN
    o.scope := s.name;
    o.key := p_key;
    o.first_seen_at := p_now;
    o.attempt := CASE WHEN p_stale THEN 0 ELSE 1 END;
    o.attempt_base := 0;
    o := idempo.managed_acquire(o, s, p_now, p_fp, p_params, p_run_id, p_on_commit);
    IF p_stale THEN
        o.status := 'in_review';
        o.lease_expires_at := NULL;
        o.completed_at := NULL;
        o.expires_at := NULL;
        o.sweep_at := NULL;
    END IF;
    RETURN o;
END
$$;

CREATE FUNCTION idempo.managed_write(o idempo.operations) RETURNS void
    LANGUAGE sql AS $$
    UPDATE idempo.operations AS x SET fingerprint = o.fingerprint, status = o.status, attempt = o.attempt,
        run_id = o.run_id, first_seen_at = o.first_seen_at, last_attempt_at = o.last_attempt_at,
        lease_expires_at = o.lease_expires_at, completed_at = o.completed_at, expires_at = o.expires_at,
        sweep_at = o.sweep_at, result = o.result, target_ref = o.target_ref, error = o.error,
        params = o.params, attempt_base = o.attempt_base
    WHERE x.scope = o.scope AND x.key = o.key
$$;

CREATE FUNCTION idempo.managed_stale_note(intent_at timestamptz) RETURNS text
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET DateStyle = 'ISO' AS $$
    SELECT format('intent_at %s is older than the scope''s retention; a finished record may already have been purged', intent_at)
$$;

-- The sign of a key that a claim may insert (managed_decide): 64 bits of the SHA-256 of the
-- scope's digest and the key, the argument of the one-integer advisory locks.  No secret: any
-- role can take this lock (and pg_locks shows the ones held), and managed_signs_held tells
-- idempo's holders from others.
CREATE FUNCTION idempo.managed_key_sign(p_scope text, p_key text) RETURNS bigint
    LANGUAGE sql STABLE AS $$
    SELECT ('x' || encode(substr(sha256(sha256(convert_to(p_scope, getdatabaseencoding()))
                                        || convert_to(p_key, getdatabaseencoding())), 1, 8), 'hex'))::bit(64)::bigint
$$;

-- Which of these signs another transaction of idempo's holds: a backend that holds the
-- advisory lock and idempo.operations in ROW EXCLUSIVE mode, which a role can take only through
-- idempo's functions (or as its owner).  One look at pg_locks for them all (claim_batch asks
-- once for its keys: managed_decide).
CREATE FUNCTION idempo.managed_signs_held(p_signs bigint[]) RETURNS bigint[]
    LANGUAGE sql STABLE AS $$
    WITH l AS (
        SELECT l.pid, l.locktype, l.classid, l.objid, l.objsubid, l.relation, l.mode
          FROM pg_catalog.pg_lock_status() l
         WHERE l.granted AND l.pid <> pg_catalog.pg_backend_pid()
           AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()))
    SELECT coalesce(array_agg(s), '{}') FROM unnest(p_signs) s
     WHERE s IN (SELECT (a.classid::bigint << 32) | a.objid::bigint FROM l a
                  WHERE a.locktype = 'advisory' AND a.objsubid = 1
                    AND a.pid IN (SELECT r.pid FROM l r WHERE r.locktype = 'relation' AND r.mode = 'RowExclusiveLock'
                                                          AND r.relation = 'idempo.operations'::regclass))
$$;

-- claim.c's claim_locked() and decide_existing(): the decision for one key, writing what it
-- changes.  p_mode: 'wait' (FOR UPDATE), 'nowait' (FOR UPDATE SKIP LOCKED), 'read' (read-only:
-- no lock, no write).  p_verify: claim(..., verify_unknown).
CREATE FUNCTION idempo.managed_decide(
    s idempo.scopes, k text, p_now timestamptz, p_fp bytea, p_params jsonb, p_run_id text,
    p_intent_at timestamptz, p_on_commit boolean, p_mode text, p_may_hold boolean, p_verify boolean,
    OUT outcome idempo.outcome, OUT o idempo.operations, OUT review_id bigint,
    OUT from_status idempo.status, OUT record_conflict boolean)
    LANGUAGE plpgsql AS $$
DECLARE
    ro boolean := p_mode = 'read';
    stale boolean := p_intent_at IS NOT NULL AND idempo.managed_plus(p_intent_at, s.retention) < p_now;
    remembers boolean := s.remember > '0'::interval;
    changed boolean := false;
    lease_over_retry boolean := false;
    n integer;
    expiry text;
    sign bigint;
    signed boolean := true;
BEGIN
    record_conflict := false;
    -- Claims of a key serialize on the key's record itself, which only idempo's functions can
    -- lock and which no other key shares: the primary key (an INSERT ... ON CONFLICT waits for a
    -- transaction inserting the same key, and only that key) and the record's row lock (FOR
    -- UPDATE; wait => false: SKIP LOCKED, and busy for a record someone holds).
    -- What SQL cannot see is a key another transaction is inserting, which the C edition reads
    -- from the primary key with a dirty snapshot to answer wait => false with busy at once
    -- (direct.c): an INSERT waits for it.  So a claim that may insert also takes the key's sign,
    -- a transaction-level advisory lock named by 64 bits of a digest of scope and key
    -- (managed_key_sign), without ever waiting for it; wait => false answers busy when another
    -- transaction of idempo's holds the sign (managed_signs_held: one that holds
    -- idempo.operations in ROW EXCLUSIVE mode, which only idempo's functions and its owner can
    -- take, so that a session of any other role holding that advisory lock changes nothing; a
    -- wait => false claim_batch looked once for all its keys: idempo_managed.batch_held).  Two
    -- keys share a sign with a chance of 2^-64, and then the claim of one answers busy while the
    -- other is claimed in another transaction: a sign never makes a claim wait, nor hands a key
    -- out twice.
    -- Not for a transaction that had written before this claim (p_may_hold: it had a
    -- transaction id): it may hold the key's record itself (it finished, verified or resolved
    -- the key, or released and so deleted it, before claiming it) while another claim holding
    -- the sign waits for that record, so it goes on as the C edition does, and a wait => false
    -- claim that meets another transaction's insertion answers busy when its lock_timeout cuts
    -- the wait (claim()).
    IF p_mode <> 'read' THEN
        sign := idempo.managed_key_sign(s.name, k);
        signed := pg_try_advisory_xact_lock(sign);
        IF NOT signed AND p_mode = 'nowait' AND NOT p_may_hold
           AND (sign = ANY (coalesce(nullif(current_setting('idempo_managed.batch_held', true), ''), '{}')::bigint[])
                OR sign = ANY (idempo.managed_signs_held(ARRAY[sign]))) THEN
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
            outcome := 'busy';
            RETURN;
        END IF;
    END IF;
    FOR try IN 1 .. 3 LOOP
        IF p_mode = 'nowait' THEN
            -- a record someone holds (a complete() or the sweep in flight) is busy, without waiting
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                EXIT;
            END IF;
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
            IF FOUND THEN
                outcome := 'busy';
                RETURN;
            END IF;
        END IF;
        -- a new key: one INSERT (a stale intent must first prove there is no record)
        IF NOT stale AND NOT ro THEN
            -- managed_new_row(s, k, p_now, p_fp, p_params, p_run_id, p_on_commit, false), written
            -- out in the statement: two calls with rows for arguments cost more than the INSERT
            INSERT INTO idempo.operations AS x (scope, key, fingerprint, status, attempt, run_id, first_seen_at,
                                                last_attempt_at, lease_expires_at, completed_at, expires_at, sweep_at,
                                                result, target_ref, error, params, attempt_base)
            VALUES (s.name, k, p_fp, CASE WHEN p_on_commit THEN 'succeeded' ELSE 'in_progress' END::idempo.status, 1,
                    p_run_id, p_now, p_now,
                    CASE WHEN p_on_commit THEN NULL ELSE idempo.managed_plus(p_now, s.lease) END,
                    CASE WHEN p_on_commit THEN p_now END,
                    CASE WHEN p_on_commit THEN idempo.managed_plus(p_now, s.retention) END,
                    CASE WHEN p_on_commit THEN idempo.managed_plus(p_now, s.retention)
                         ELSE LEAST(idempo.managed_plus(p_now, s.lease), idempo.managed_plus(p_now, s.retention)) END,
                    NULL, NULL, NULL, CASE WHEN s.store_params THEN p_params END, 0)
            ON CONFLICT (scope, key) DO NOTHING
            RETURNING x.* INTO o;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n = 1 THEN
                -- inserted after waiting for another insertion, whose transaction ended: sign
                -- the key now, for the wait => false claims that come while this one runs
                IF NOT signed THEN
                    PERFORM pg_try_advisory_xact_lock(sign);
                END IF;
                outcome := 'acquired';
                PERFORM idempo.managed_txn_remember(s.name, k, 1, p_on_commit, s.durability = 'replicated');
                RETURN;
            END IF;
        END IF;
        IF p_mode = 'wait' THEN
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k FOR UPDATE;
        ELSIF p_mode = 'nowait' THEN
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
                IF FOUND THEN
                    outcome := 'busy';      -- locked by someone else (a complete() in flight, say)
                    RETURN;
                END IF;
            END IF;
        ELSE
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
            IF NOT FOUND THEN
                PERFORM idempo.managed_must_write(ro, s.name, k, 'the key has no record yet');
            END IF;
        END IF;
        IF FOUND THEN
            EXIT;
        END IF;
        IF stale THEN
            o := idempo.managed_new_row(s, k, p_now, p_fp, p_params, p_run_id, p_on_commit, true);
            INSERT INTO idempo.operations SELECT o.* ON CONFLICT (scope, key) DO NOTHING;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n = 1 THEN
                IF NOT signed THEN
                    PERFORM pg_try_advisory_xact_lock(sign);
                END IF;
                review_id := idempo.managed_open_review(s.name, k, 'stale_retry',
                                                        idempo.managed_stale_note(p_intent_at), p_now);
                outcome := 'stale';
                RETURN;
            END IF;
        END IF;
        o := NULL;
        -- the record was purged between our statements: start over
    END LOOP;
    IF o.scope IS NULL THEN
        RAISE EXCEPTION 'could not claim key "%" in scope "%": the record kept changing', k, s.name
            USING ERRCODE = '40001', HINT = 'Retry the transaction.';
    END IF;

    -- decide_existing(): 1. expiry (expiry.c: op_expiry)
    from_status := o.status;
    expiry := CASE
        WHEN o.status IN ('succeeded', 'failed') THEN
            CASE WHEN o.sweep_at > o.expires_at THEN CASE WHEN o.sweep_at <= p_now THEN 'absent' ELSE 'none' END
                 WHEN o.expires_at > p_now THEN 'none'
                 WHEN NOT remembers THEN 'absent'
                 WHEN idempo.managed_plus(o.expires_at, s.remember) <= p_now THEN 'absent'
                 ELSE 'remember' END
        WHEN o.status NOT IN ('in_progress', 'retryable', 'unknown') THEN 'none'
        WHEN idempo.managed_plus(o.first_seen_at, s.retention) <= p_now THEN 'review'
        WHEN o.status = 'in_progress' AND o.lease_expires_at <= p_now THEN
            CASE WHEN s.on_lease_expiry = 'retry' THEN 'retry' ELSE 'unknown' END
        ELSE 'none' END;
    IF expiry = 'absent' THEN
        PERFORM idempo.managed_must_write(ro, s.name, k, 'its finished record expired, so the key starts afresh');
        o := idempo.managed_new_row(s, k, p_now, p_fp, p_params, p_run_id, p_on_commit, stale);
        from_status := NULL;
        PERFORM idempo.managed_write(o);
        IF stale THEN
            review_id := idempo.managed_open_review(s.name, k, 'stale_retry',
                                                    idempo.managed_stale_note(p_intent_at), p_now);
            outcome := 'stale';
        ELSE
            outcome := 'acquired';
            PERFORM idempo.managed_txn_remember(s.name, k, o.attempt, p_on_commit, s.durability = 'replicated');
        END IF;
        RETURN;
    ELSIF expiry = 'remember' THEN
        o.result := NULL;
        o.params := NULL;
        o.error := NULL;
        o.run_id := NULL;
        o.sweep_at := idempo.managed_plus(o.expires_at, s.remember);
        changed := NOT ro;
    ELSIF expiry = 'review' THEN
        PERFORM idempo.managed_must_write(ro, s.name, k, 'its retention ran out unfinished, so it goes to review');
        review_id := idempo.managed_open_review(s.name, k, 'retention_expired',
            format('still %s at attempt %s when the scope''s retention ran out (first seen %s)',
                   o.status, o.attempt, o.first_seen_at), p_now);
        o.status := 'in_review';
        o.lease_expires_at := NULL;
        o.sweep_at := NULL;
        changed := true;
    ELSIF expiry = 'unknown' THEN
        PERFORM idempo.managed_must_write(ro, s.name, k, 'its lease ran out, which makes the attempt unknown');
        o.status := 'unknown';
        o.last_attempt_at := o.lease_expires_at;   -- verify's settle window counts from the lease's end
        o.lease_expires_at := NULL;
        o.sweep_at := idempo.managed_plus(o.first_seen_at, s.retention);
        changed := true;
    ELSIF expiry = 'retry' THEN
        lease_over_retry := true;
    END IF;

    -- 2. the fingerprint
    IF p_fp IS NOT NULL AND o.fingerprint IS NOT NULL AND p_fp <> o.fingerprint THEN
        PERFORM idempo.managed_must_write(ro, s.name, k, 'the request differs from the stored one, and the conflict must be recorded');
        IF changed THEN
            PERFORM idempo.managed_write(o);
        END IF;
        outcome := 'conflict';
        record_conflict := true;
        RETURN;
    END IF;

    -- 3. the status
    IF lease_over_retry OR o.status = 'retryable' THEN
        PERFORM idempo.managed_must_write(ro, s.name, k, 'it may be tried again, and the new attempt must be recorded');
        IF s.max_attempts > 0 AND o.attempt - o.attempt_base >= s.max_attempts THEN
            review_id := idempo.managed_open_review(s.name, k, 'attempts_exhausted',
                format('%s of %s attempts used', o.attempt - o.attempt_base, s.max_attempts), p_now);
            o.status := 'in_review';
            o.lease_expires_at := NULL;
            o.sweep_at := NULL;
            PERFORM idempo.managed_write(o);
            outcome := 'in_review';
            RETURN;
        END IF;
        o.attempt := o.attempt + 1;
        o := idempo.managed_acquire(o, s, p_now, p_fp, p_params, p_run_id, p_on_commit);
        PERFORM idempo.managed_write(o);
        outcome := 'acquired';
        PERFORM idempo.managed_txn_remember(s.name, k, o.attempt, p_on_commit, s.durability = 'replicated');
        RETURN;
    END IF;
    IF o.status = 'unknown' THEN
        -- one verifier at a time (claim.c: decide_unknown)
        IF o.lease_expires_at IS NOT NULL AND o.lease_expires_at > p_now THEN
            -- this transaction's own lease answers unknown again, another's busy
            outcome := 'busy';
            IF EXISTS (SELECT FROM idempo.managed_txn_lookup(s.name, k, 'verify') v
                       WHERE v.attempt = o.attempt AND v.lease_until = o.lease_expires_at) THEN
                outcome := 'unknown';
            END IF;
        ELSIF NOT p_verify THEN
            -- a caller that cannot verify leaves the lease free for one that can, and writes nothing
            outcome := 'unknown';
        ELSE
            PERFORM idempo.managed_must_write(ro, s.name, k, 'its outcome is unknown, and the one caller who looks it up takes a verification lease on it');
            o.lease_expires_at := idempo.managed_plus(p_now, s.lease);
            changed := true;
            outcome := 'unknown';
        END IF;
        IF changed THEN
            PERFORM idempo.managed_write(o);
        END IF;
        IF outcome = 'unknown' AND changed AND p_verify THEN   -- the lease taken here
            PERFORM idempo.managed_txn_note('verify', s.name, k, o.attempt, false, o.lease_expires_at, false);
        END IF;
        RETURN;
    END IF;
    IF changed THEN
        PERFORM idempo.managed_write(o);
    END IF;
    outcome := CASE o.status
        WHEN 'in_progress' THEN 'busy'
        WHEN 'in_review' THEN 'in_review'
        ELSE CASE WHEN o.sweep_at > o.expires_at THEN 'expired' ELSE 'replay' END END::idempo.outcome;
END
$$;

-- The fingerprint of a claim's params under its scope's rules (claim.c: idempo_claim_fingerprint):
-- only the fields the scope includes (fingerprint_include.c), then without those it ignores, the
-- ignore list checked first.
CREATE FUNCTION idempo.managed_params_fingerprint(s idempo.scopes, params jsonb) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF cardinality(s.fingerprint_ignore) > 0 THEN
        PERFORM idempo.managed_check_ignore(s);
    END IF;
    IF cardinality(s.fingerprint_include) > 0 THEN
        RETURN idempo.fingerprint(idempo.managed_only(params, idempo.managed_include_steps(s.fingerprint_include, s.name)),
                                  s.fingerprint_ignore);
    END IF;
    RETURN idempo.fingerprint(params, s.fingerprint_ignore);
END
$$;

-- A scope's fingerprint_ignore, checked as the claim compiles it (fingerprint_rules.c with the
-- scope's name: a list written into idempo.scopes behind check_scope()'s back is refused here)
CREATE FUNCTION idempo.managed_check_ignore(s idempo.scopes) RETURNS void
    LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p text;
    i int := 0;
BEGIN
    IF array_ndims(s.fingerprint_ignore) > 1 THEN
        RAISE EXCEPTION 'fingerprint_ignore of scope "%" must be a one-dimensional array', s.name
            USING ERRCODE = '22023', HINT = 'Pass e.g. ARRAY[''delivered_at'', ''meta.trace_id''].';
    END IF;
    IF cardinality(s.fingerprint_ignore) > 256 THEN
        RAISE EXCEPTION 'fingerprint_ignore of scope "%" has % paths, the limit is 256', s.name, cardinality(s.fingerprint_ignore)
            USING ERRCODE = '22023',
                  HINT = 'Name the few volatile fields (delivery times, attempt counters, trace ids); leave the object that holds many of them out as one path.';
    END IF;
    FOREACH p IN ARRAY s.fingerprint_ignore LOOP
        i := i + 1;
        IF p IS NULL THEN
            RAISE EXCEPTION 'fingerprint_ignore of scope "%": path % is NULL', s.name, i
                USING ERRCODE = '22023', HINT = 'Remove the NULL element.';
        ELSIF p = '' THEN
            RAISE EXCEPTION 'fingerprint_ignore of scope "%": path % is empty', s.name, i
                USING ERRCODE = '22023', HINT = 'A path names a field, e.g. ''delivered_at'' or ''meta.trace_id''.';
        ELSIF octet_length(p) > 1024 THEN
            RAISE EXCEPTION 'fingerprint_ignore of scope "%": path % is % bytes long, the limit is 1024', s.name, i, octet_length(p)
                USING ERRCODE = '22023', HINT = 'Use a shorter path.';
        ELSIF starts_with(p, '.') OR right(p, 1) = '.' OR strpos(p, '..') > 0 THEN
            RAISE EXCEPTION 'fingerprint_ignore of scope "%": path % ("%") has an empty segment', s.name, i, p
                USING ERRCODE = '22023', HINT = 'Separate object keys with single dots, without a dot at either end.';
        END IF;
    END LOOP;
END
$$;

-- The conflict row, upserted on the open conflict of the same stored and incoming requests (a
-- repeat counts there; plans.c: PLAN_CONFLICT_RECORD); its id.  What the recorder's connection
-- runs (below), and the claim itself where no recorder is configured.
CREATE FUNCTION idempo.managed_record_conflict(p_scope text, p_key text, p_stored bytea, p_incoming bytea,
                                               p_stored_params jsonb, p_incoming_params jsonb,
                                               p_run_id text, p_at timestamptz)
    RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    id bigint;
BEGIN
    INSERT INTO idempo.conflicts AS c (scope, key, stored_fingerprint, incoming_fingerprint,
                                       stored_params, incoming_params, run_id, first_detected_at, last_detected_at)
    VALUES (p_scope, p_key, p_stored, p_incoming, p_stored_params, p_incoming_params, p_run_id, p_at, p_at)
    ON CONFLICT (scope, key, stored_fingerprint, incoming_fingerprint) WHERE resolved_at IS NULL
    DO UPDATE SET last_detected_at = GREATEST(c.last_detected_at, excluded.last_detected_at),
                  occurrences = c.occurrences + 1, run_id = excluded.run_id
    RETURNING c.id INTO id;
    RETURN id;
END
$$;

-- Conflicts must outlive the caller's transaction, which usually rolls back (conflicts.c).
-- PL/pgSQL has no autonomous transaction: the row is written by another session of the same
-- database, through dblink and a foreign server named idempo_conflicts with a user mapping for
-- idempo's owner (docs/managed-edition.md), one connection per conflict (a named connection
-- would stay open in the session, for any role in it to use), with a lock_timeout so that a
-- lock of this very transaction cannot hang it: its id is returned.  Where that is not
-- configured or fails, the row is written in the caller's transaction, with the C edition's
-- WARNING that it is kept only if that transaction commits, and no id is returned (NULL): a
-- conflict_id names only a conflict that is kept whatever the caller does next.
CREATE FUNCTION idempo.managed_conflict(p_scope text, p_key text, p_stored bytea, p_incoming bytea,
                                        p_stored_params jsonb, p_incoming_params jsonb,
                                        p_run_id text, p_at timestamptz)
    RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dbl name;
    q text;
    id bigint;
    why text;
    taken boolean;
BEGIN
    SELECT n.nspname INTO dbl FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'dblink';
    IF dbl IS NULL THEN
        why := format('The extension dblink is not installed in database "%s".', current_database());
    ELSIF NOT EXISTS (SELECT FROM pg_foreign_server f WHERE f.srvname = 'idempo_conflicts') THEN
        why := format('No foreign server idempo_conflicts (dblink_fdw) is defined in database "%s".', current_database());
    ELSE
        -- the other session is idempo's owner's, with that role's search_path ("$user", public):
        -- pinned first, or a caller's operator in such a schema (public.*(bigint, interval), an
        -- exact match for the one below, found before pg_catalog's float8 * interval) would run
        -- there as the owner.  And with its synchronous_commit, which a database or role may set
        -- to off: pinned on (conflicts.c does so), or the id this claim returns could name a row
        -- a crash then loses, after the caller rolled back
        q := format('SET lock_timeout = ''2s''; SET synchronous_commit = on; SET search_path = pg_catalog, pg_temp; SELECT idempo.managed_record_conflict(%L, %L, decode(%L, ''hex''), decode(%L, ''hex''), %L::jsonb, %L::jsonb, %L, ''epoch''::timestamptz + %s * interval ''1 microsecond'')',
                    p_scope, p_key, encode(p_stored, 'hex'), encode(p_incoming, 'hex'), p_stored_params,
                    p_incoming_params, p_run_id, (extract(epoch FROM p_at) * 1000000)::bigint);
        BEGIN
            -- a connection of that name opened in this session would be used instead of the server
            EXECUTE format('SELECT coalesce(%L = ANY (%I.dblink_get_connections()), false)', 'idempo_conflicts', dbl) INTO STRICT taken;
            IF taken THEN
                RAISE EXCEPTION 'a dblink connection named idempo_conflicts is open in this session';
            END IF;
            EXECUTE format('SELECT t.id FROM %I.dblink(%L, %L) AS t(id bigint)', dbl, 'idempo_conflicts', q) INTO STRICT id;
            RETURN id;
        EXCEPTION WHEN OTHERS THEN
            why := format('The conflict recorder (dblink, foreign server idempo_conflicts) failed: %s', SQLERRM);
        END;
    END IF;
    PERFORM idempo.managed_record_conflict(p_scope, p_key, p_stored, p_incoming, p_stored_params,
                                           p_incoming_params, p_run_id, p_at);
    -- such a transaction cannot PREPARE (conflicts.c: refuse_prepare): it touched a temporary
    -- table, which PREPARE TRANSACTION refuses (0A000)
    PERFORM idempo.managed_txn_note('conflict', p_scope, p_key, NULL, false, NULL, false);
    RAISE WARNING 'conflict on key "%" in scope "%" is recorded in the current transaction only', p_key, p_scope
        USING DETAIL = why,
              HINT = 'If this transaction rolls back, the conflict is not kept (so the claim returns no conflict_id).'
                     || CASE WHEN q IS NULL THEN ' Define the foreign server idempo_conflicts for dblink (docs/managed-edition.md).' ELSE '' END;
    RETURN NULL;
END
$$;

-- How a bad fingerprint argument is shown in errors (keys.c: idempo_bytea_arg_text)
CREATE FUNCTION idempo.managed_bytea_text(b bytea) RETURNS text
    LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t text;
BEGIN
    IF octet_length(b) BETWEEN 1 AND 64 THEN
        BEGIN
            t := convert_from(b, 'UTF8');
        EXCEPTION WHEN OTHERS THEN
            t := NULL;
        END;
        IF t IS NOT NULL AND t !~ '[\x01-\x1f\x7f]' THEN
            RETURN format('''%s'' (as text)', t);
        END IF;
    END IF;
    RETURN format('''\x%s%s''', encode(substr(b, 1, 32), 'hex'), CASE WHEN octet_length(b) > 32 THEN '...' ELSE '' END);
END
$$;

-- A lease given to one call -- claim(..., lease), heartbeat(..., extend) -- checked as the scope's
-- own (src/clock.c: idempo_lease_check): positive, shorter than the scope's retention, no part
-- that runs backwards; the C code's messages
CREATE FUNCTION idempo.managed_lease_check(iv interval, s idempo.scopes, k text, p_name text, p_call text)
    RETURNS void LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF iv <= '0'::interval THEN
        RAISE EXCEPTION '% of the % of key "%" in scope "%" must be positive, not %', p_name, p_call, k, s.name, iv
            USING ERRCODE = '22023',
                  HINT = format('Pass how long this attempt may run before its outcome counts as unknown, or leave %s out for the scope''s (%s).', p_name, s.lease);
    END IF;
    IF iv >= s.retention THEN
        RAISE EXCEPTION '% % of the % of key "%" in scope "%" is not shorter than the scope''s retention (%)',
            p_name, iv, p_call, k, s.name, s.retention
            USING ERRCODE = '22023',
                  HINT = 'Unfinished work goes to review when the retention runs out: a lease that outlives it would never be used.';
    END IF;
    IF extract(year FROM iv) * 12 + extract(month FROM iv) < 0 OR extract(day FROM iv) < 0
       OR extract(epoch FROM iv - make_interval(months => (extract(year FROM iv) * 12 + extract(month FROM iv))::int,
                                                days => extract(day FROM iv)::int)) < 0 THEN
        RAISE EXCEPTION '% of the % of key "%" in scope "%" has a part that runs backwards: %', p_name, p_call, k, s.name, iv
            USING ERRCODE = '22023',
                  HINT = 'Give no part a negative sign, e.g. ''1 day'' rather than ''1 mon -29 days''.';
    END IF;
END
$$;

-- A running attempt extends its lease (src/heartbeat.c): fenced by attempt, only while it is
-- in_progress with its lease live at this call's now (read once the row is locked) and its
-- retention not over; never shortens; the lease it holds afterwards
CREATE FUNCTION idempo.managed_heartbeat(p_scope text, p_key text, p_attempt integer, p_extend interval)
    RETURNS timestamptz LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempo.scopes;
    k text;
    mine record;
    o idempo.operations;
    a integer;
    ext interval;
    t timestamptz;
    review_at timestamptz;
    until timestamptz;
    why text;
    hint text;
BEGIN
    LOCK TABLE idempo.operations IN ROW EXCLUSIVE MODE;   -- before the scope is read (scope_cache.c)
    s := idempo.managed_scope(p_scope, p_key, true);
    k := idempo.managed_key(s, p_key);
    PERFORM idempo.managed_scope_current(s);
    ext := s.lease;
    IF p_extend IS NOT NULL THEN
        PERFORM idempo.managed_lease_check(p_extend, s, k, 'extend', 'heartbeat');
        ext := p_extend;
    END IF;
    IF p_attempt IS NULL THEN
        SELECT * INTO mine FROM idempo.managed_txn_lookup(s.name, k, 'attempt');
        IF mine.attempt IS NULL THEN
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'cannot heartbeat key "%" in scope "%": there is no such operation', k, s.name
                    USING ERRCODE = '42704', HINT = 'Claim the key first with idempo.claim(); a finished record may also have expired.';
            END IF;
            RAISE EXCEPTION 'cannot heartbeat key "%" in scope "%": this transaction acquired no attempt of it', k, s.name
                USING ERRCODE = '55000', DETAIL = format('The operation is %s, at attempt %s.', o.status, o.attempt),
                      HINT = 'Pass attempt => the attempt number idempo.claim() returned to the caller that does the work.';
        END IF;
        a := mine.attempt;
    ELSE
        a := p_attempt;
    END IF;
    IF current_setting('transaction_read_only')::boolean THEN
        RAISE EXCEPTION 'cannot heartbeat key "%" in scope "%" in a read-only transaction', k, s.name
            USING ERRCODE = '25006', HINT = 'Extend the lease in a read-write transaction on the primary.';
    END IF;
    SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot heartbeat key "%" in scope "%": there is no such operation', k, s.name
            USING ERRCODE = '42704', HINT = 'Claim the key first with idempo.claim(); a finished record may also have expired.';
    END IF;
    -- the clock is read once the row is ours: a lock wait must not make an expired lease look live
    t := idempo.now();
    IF a < o.attempt THEN
        RAISE EXCEPTION 'cannot heartbeat key "%" in scope "%": attempt % was superseded by attempt %', k, s.name, a, o.attempt
            USING ERRCODE = '55000', HINT = 'A newer attempt owns the operation; a late attempt must not overwrite it.';
    ELSIF a <> o.attempt THEN
        RAISE EXCEPTION 'cannot heartbeat key "%" in scope "%": there is no attempt %, the current one is %', k, s.name, a, o.attempt
            USING ERRCODE = '22023', HINT = 'Pass the attempt number idempo.claim() returned.';
    END IF;
    review_at := idempo.managed_plus(o.first_seen_at, s.retention);
    IF o.status <> 'in_progress' THEN
        why := CASE o.status WHEN 'succeeded' THEN 'it has already succeeded' WHEN 'failed' THEN 'it has already failed'
                             WHEN 'retryable' THEN 'it is retryable' WHEN 'unknown' THEN 'its outcome is unknown'
                             ELSE 'it is in review' END;
        hint := CASE WHEN o.status IN ('succeeded', 'failed')
                     THEN 'The attempt has finished (one claimed with complete_on_commit never had a lease): there is nothing to keep alive.'
                     WHEN o.status = 'unknown'
                     THEN 'Its lease ran out before this heartbeat: stop the work, and report what it did with complete() or fail() of this attempt, or let verify() find out.'
                     ELSE 'Stop the work: the operation is no longer running under this attempt.' END;
    ELSIF review_at <= t THEN
        why := format('its retention ran out at %s, so it goes to review', to_char(review_at, 'YYYY-MM-DD HH24:MI:SS.USOF'));
        hint := 'A person decides on it now (idempo.resolve()); stop the work.';
    ELSIF o.lease_expires_at <= t THEN
        -- the lease ran out: a claim may already have taken the operation over
        why := format('its lease ran out at %s', to_char(o.lease_expires_at, 'YYYY-MM-DD HH24:MI:SS.USOF'));
        hint := CASE WHEN s.on_lease_expiry = 'retry'
                     THEN 'Another claim may acquire the next attempt from that instant on: stop the work, and report what it did with complete() or fail() of this attempt.'
                     ELSE 'From that instant its outcome counts as unknown: stop the work, and report what it did with complete() or fail() of this attempt.' END;
    END IF;
    IF why IS NOT NULL THEN
        RAISE EXCEPTION 'cannot heartbeat key "%" in scope "%": %', k, s.name, why
            USING ERRCODE = '55000', DETAIL = format('Attempt %s holds no running lease to extend.', a), HINT = hint;
    END IF;
    until := idempo.managed_plus(t, ext);
    -- never shortens: a late or repeated heartbeat cannot cut a lease short
    IF until > o.lease_expires_at THEN
        UPDATE idempo.operations AS x SET lease_expires_at = until, sweep_at = LEAST(until, review_at),
               last_attempt_at = GREATEST(o.last_attempt_at, t)   -- verify's settle window counts from here
         WHERE x.scope = s.name AND x.key = k;
        RETURN until;
    END IF;
    RETURN o.lease_expires_at;
END
$$;

-- managed-differs: security: writes idempo's tables, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.claim(
    scope              text,
    key                text,
    params             jsonb       DEFAULT NULL,
    fingerprint        bytea       DEFAULT NULL,
    run_id             text        DEFAULT NULL,
    intent_at          timestamptz DEFAULT NULL,
    wait               boolean     DEFAULT true,
    complete_on_commit boolean     DEFAULT false,
    lease              interval    DEFAULT NULL,
    verify_unknown     boolean     DEFAULT true)
    RETURNS idempo.claim_result
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    ro boolean := current_setting('transaction_read_only')::boolean;
    -- whether this transaction had written before this claim, so that it may hold the key's
    -- record (managed_decide); read before the scope's lock gives it a transaction id
    may_hold boolean := pg_current_xact_id_if_assigned() IS NOT NULL;
    table_locked boolean := false;
    s idempo.scopes;
    k text;
    fp bytea;
    t timestamptz;
    d record;
    o idempo.operations;
    mine record;
    res idempo.claim_result;
    fp_text text;
    old_timeout text;
    decided boolean := false;
    outcome idempo.outcome;
    review_id bigint;
    from_status idempo.status;
    record_conflict boolean := false;
    conflict_id bigint;
    include_steps jsonb;
BEGIN
    -- the lock on idempo.operations that the write takes anyway, before the scope is read (claim.c)
    IF NOT ro THEN
        IF wait IS NULL OR wait THEN
            LOCK TABLE idempo.operations IN ROW EXCLUSIVE MODE;
        ELSE
            BEGIN
                LOCK TABLE idempo.operations IN ROW EXCLUSIVE MODE NOWAIT;
            EXCEPTION WHEN lock_not_available THEN
                table_locked := true;
            END;
        END IF;
    END IF;
    s := idempo.managed_scope(claim.scope, claim.key, true);
    k := idempo.managed_key(s, claim.key);
    IF wait IS NULL OR complete_on_commit IS NULL OR verify_unknown IS NULL THEN
        RAISE EXCEPTION '% must not be NULL (key "%" in scope "%")',
            CASE WHEN wait IS NULL THEN 'wait' WHEN complete_on_commit IS NULL THEN 'complete_on_commit'
                 ELSE 'verify_unknown' END, k, s.name
            USING ERRCODE = '22004', HINT = 'Pass true or false, or leave the argument out for its default.';
    END IF;
    -- claim(..., lease): the lease this claim takes instead of the scope's (claim.c: lease_arg);
    -- s is this call's copy of the scope, so every lease written below is this one
    IF claim.lease IS NOT NULL THEN
        PERFORM idempo.managed_lease_check(claim.lease, s, k, 'lease', 'claim');
        s.lease := claim.lease;
    END IF;
    IF claim.fingerprint IS NOT NULL AND (params IS NOT NULL OR octet_length(claim.fingerprint) <> 32) THEN
        fp_text := idempo.managed_bytea_text(claim.fingerprint);
    END IF;
    IF params IS NOT NULL AND claim.fingerprint IS NOT NULL THEN
        RAISE EXCEPTION 'claim of key "%" in scope "%" gives both params and fingerprint', k, s.name
            USING ERRCODE = '22023', DETAIL = format('The fingerprint argument (the 4th) is %s.', fp_text),
                  HINT = 'Pass params (idempo computes the fingerprint) or a fingerprint you computed, not both.'
                         || CASE WHEN octet_length(claim.fingerprint) = 32 THEN ''
                                 ELSE ' A run id given as the 4th argument by position lands in fingerprint: pass it by name, run_id => ...' END;
    END IF;
    IF claim.fingerprint IS NOT NULL THEN
        IF octet_length(claim.fingerprint) <> 32 THEN
            RAISE EXCEPTION 'fingerprint for key "%" in scope "%" is % byte% long, not 32', k, s.name,
                octet_length(claim.fingerprint), CASE WHEN octet_length(claim.fingerprint) = 1 THEN '' ELSE 's' END
                USING ERRCODE = '22023', DETAIL = format('The fingerprint argument (the 4th) is %s.', fp_text),
                      HINT = 'A fingerprint is a SHA-256 digest, e.g. idempo.fingerprint(params) or sha256(...). A run id given as the 4th argument by position lands in fingerprint: pass it by name, run_id => ...';
        END IF;
        fp := claim.fingerprint;
    ELSIF params IS NOT NULL THEN
        IF coalesce(cardinality(s.fingerprint_ignore), 0) = 0 AND coalesce(cardinality(s.fingerprint_include), 0) = 0 THEN
            fp := idempo.fingerprint(params);   -- no rules: what managed_params_fingerprint ends in
        ELSE
            fp := idempo.managed_params_fingerprint(s, params);
        END IF;
    END IF;
    IF s.require_fingerprint AND fp IS NULL THEN
        RAISE EXCEPTION 'scope "%" requires a fingerprint, and the claim of key "%" has none', s.name, k
            USING ERRCODE = '22023', HINT = 'Pass params => the request''s business parameters as jsonb.';
    END IF;
    -- idempo.now(), whose call costs more than its usual answer
    IF coalesce(current_setting('idempo.clock_offset', true), '') IN ('', '0') THEN
        t := clock_timestamp();
    ELSE
        t := idempo.now();
    END IF;

    -- a key this transaction acquired and has not finished: 'acquired' again (claim.c: reclaim_own).
    -- A transaction that had no id when the claim began has noted nothing (a note is marked with
    -- the id): no lookup
    IF may_hold THEN
        SELECT * INTO mine FROM idempo.managed_txn_lookup(s.name, k, 'attempt');
        IF mine.attempt IS NOT NULL AND NOT mine.finished THEN
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
            IF FOUND AND o.attempt = mine.attempt
               AND (o.status = 'in_progress' OR (mine.on_commit AND o.status = 'succeeded'))
               AND NOT (fp IS NOT NULL AND o.fingerprint IS NOT NULL AND fp <> o.fingerprint) THEN
                outcome := 'acquired';
                from_status := o.status;
                decided := true;
            END IF;
        END IF;
    END IF;
    IF decided THEN
        NULL;
    ELSIF ro THEN
        SELECT * INTO d FROM idempo.managed_decide(s, k, t, fp, params, run_id, intent_at, complete_on_commit, 'read', false, verify_unknown);
    ELSIF wait THEN
        SELECT * INTO d FROM idempo.managed_decide(s, k, t, fp, params, run_id, intent_at, complete_on_commit, 'wait', may_hold, verify_unknown);
    ELSE
        IF table_locked THEN
            RAISE EXCEPTION 'could not claim key "%" in scope "%" without waiting', k, s.name
                USING ERRCODE = '55P03',
                      DETAIL = 'Another session holds a lock on idempo.operations or its primary key that conflicts with claiming, such as CREATE INDEX, REINDEX, VACUUM FULL, ALTER TABLE or LOCK TABLE.',
                      HINT = 'Retry later, or claim with wait => true to queue behind it.';
        END IF;
        -- wait => false: the key's sign and locked records answer busy without waiting
        -- (managed_decide); whatever else might make it wait (a record being deleted right
        -- now, an insertion of the key without its sign) is cut short by a lock_timeout, in a
        -- subtransaction, and answers busy too
        old_timeout := current_setting('lock_timeout');
        BEGIN
            PERFORM set_config('lock_timeout', '10ms', true);
            -- a claim_batch whose transaction had written nothing before it says so (batch.sql):
            -- the writes of its earlier elements hold no record of this key
            SELECT * INTO d FROM idempo.managed_decide(s, k, t, fp, params, run_id, intent_at, complete_on_commit, 'nowait',
                may_hold AND current_setting('idempo_managed.batch_fresh', true) IS DISTINCT FROM 'on', verify_unknown);
            PERFORM set_config('lock_timeout', old_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
            d := NULL;
            outcome := 'busy';
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
            decided := true;
        END;
    END IF;
    IF NOT decided THEN
        outcome := d.outcome;
        o := d.o;
        review_id := d.review_id;
        from_status := d.from_status;
        record_conflict := d.record_conflict;
    END IF;

    -- managed_scope_current(s), written out (a call costs more than the test), and after the
    -- decision rather than before it: a change committed since the snapshot still raises 40001
    -- here, and the statement's writes go with it; but a claim that waits for a key another
    -- transaction holds must hold nothing on the scope meanwhile, or that transaction's
    -- alter_scope or disable_scope waits for it and the two deadlock (40P01) where the C
    -- edition, which holds nothing on the scope, raises 40001
    -- (test/isolation/specs/scope_change_after_claim_rr.spec)
    IF NOT ro AND current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM FROM idempo.scopes sc WHERE sc.name = s.name FOR SHARE SKIP LOCKED;
    END IF;

    -- the audit log is a table: a read-only transaction answers without it
    IF s.audit AND NOT ro THEN
        INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, outcome, action, actor)
        VALUES (t, s.name, k, claim.run_id, o.attempt, from_status, o.status, outcome, 'claim', idempo.managed_caller());
    END IF;

    -- recorded in another session where it can be (managed_conflict)
    IF record_conflict THEN
        IF s.store_params THEN   -- the params as fingerprinted: only the fields the scope includes
            include_steps := idempo.managed_include_steps(s.fingerprint_include, s.name);
        END IF;
        conflict_id := idempo.managed_conflict(s.name, k, o.fingerprint, fp,
            CASE WHEN s.store_params THEN idempo.managed_without(idempo.managed_only(o.params, include_steps), s.fingerprint_ignore) END,
            CASE WHEN s.store_params THEN idempo.managed_without(idempo.managed_only(params, include_steps), s.fingerprint_ignore) END,
            claim.run_id, t);
    END IF;

    res.outcome := outcome;
    IF o.scope IS NOT NULL THEN
        res.status := o.status;
        res.attempt := o.attempt;
        res.first_seen_at := o.first_seen_at;
        res.lease_expires_at := o.lease_expires_at;
        IF outcome = 'replay' THEN
            res.result := o.result;
            res.error := o.error;
        END IF;
        IF outcome IN ('replay', 'expired') THEN
            res.target_ref := o.target_ref;
            res.completed_at := o.completed_at;
        END IF;
    END IF;
    res.conflict_id := conflict_id;
    res.review_id := review_id;
    RETURN res;
END
$$;

-- complete and fail (finish.c): the current attempt, or this transaction's with attempt => NULL
CREATE FUNCTION idempo.managed_finish(p_scope text, p_key text, p_attempt integer, p_to idempo.status,
                                      p_result jsonb, p_target_ref text, p_error text, p_verb text,
                                      p_retryable_null boolean)
    RETURNS idempo.status LANGUAGE plpgsql AS $$
DECLARE
    s idempo.scopes;
    k text;
    mine record;
    o idempo.operations;
    a integer;
    on_commit boolean;
    t timestamptz;
    n integer;
BEGIN
    LOCK TABLE idempo.operations IN ROW EXCLUSIVE MODE;   -- before the scope is read (scope_cache.c)
    s := idempo.managed_scope(p_scope, p_key, true);
    k := idempo.managed_key(s, p_key);
    PERFORM idempo.managed_scope_current(s);
    IF p_retryable_null THEN
        RAISE EXCEPTION 'retryable must not be NULL (key "%" in scope "%")', k, s.name USING ERRCODE = '22004',
            HINT = 'true: the attempt had no effect and may be retried; false: a final failure, replayed to every claim.';
    END IF;
    SELECT * INTO mine FROM idempo.managed_txn_lookup(s.name, k, 'attempt');
    IF p_attempt IS NULL THEN
        IF mine.attempt IS NULL THEN
            SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'cannot % key "%" in scope "%": there is no such operation', p_verb, k, s.name
                    USING ERRCODE = '42704', HINT = 'Claim the key first with idempo.claim(); a finished record may also have expired.';
            END IF;
            RAISE EXCEPTION 'cannot % key "%" in scope "%": this transaction acquired no attempt of it', p_verb, k, s.name
                USING ERRCODE = '55000', DETAIL = format('The operation is %s, at attempt %s.', o.status, o.attempt),
                      HINT = 'Pass attempt => the attempt number idempo.claim() returned to the caller that did the work.';
        END IF;
        a := mine.attempt;
        on_commit := mine.on_commit;
    ELSE
        a := p_attempt;
        on_commit := coalesce(mine.on_commit AND mine.attempt = a, false);
    END IF;
    t := idempo.now();
    IF s.audit THEN
        SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k FOR UPDATE;
    END IF;
    UPDATE idempo.operations AS x
       SET status = p_to, result = p_result, target_ref = p_target_ref, error = p_error,
           completed_at = CASE WHEN p_to IN ('succeeded', 'failed') THEN t END,
           expires_at = CASE WHEN p_to IN ('succeeded', 'failed') THEN idempo.managed_plus(t, s.retention) END,
           lease_expires_at = NULL,
           sweep_at = LEAST(x.sweep_at, CASE WHEN p_to IN ('succeeded', 'failed') THEN idempo.managed_plus(t, s.retention) END)
     WHERE x.scope = s.name AND x.key = k AND x.attempt = a
       AND (x.status IN ('in_progress', 'unknown', 'retryable') OR (on_commit AND x.status = 'succeeded'));
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n <> 1 THEN
        SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'cannot % key "%" in scope "%": there is no such operation', p_verb, k, s.name
                USING ERRCODE = '42704', HINT = 'Claim the key first with idempo.claim(); a finished record may also have expired.';
        END IF;
        IF a < o.attempt THEN
            RAISE EXCEPTION 'cannot % key "%" in scope "%": attempt % was superseded by attempt %', p_verb, k, s.name, a, o.attempt
                USING ERRCODE = '55000', HINT = 'A newer attempt owns the operation; a late attempt must not overwrite it.';
        ELSIF a <> o.attempt THEN
            RAISE EXCEPTION 'cannot % key "%" in scope "%": there is no attempt %, the current one is %', p_verb, k, s.name, a, o.attempt
                USING ERRCODE = '22023', HINT = 'Pass the attempt number idempo.claim() returned.';
        END IF;
        RAISE EXCEPTION 'cannot % key "%" in scope "%": %', p_verb, k, s.name,
            CASE o.status WHEN 'in_progress' THEN 'it is in progress' WHEN 'succeeded' THEN 'it has already succeeded'
                          WHEN 'failed' THEN 'it has already failed' WHEN 'retryable' THEN 'it is retryable'
                          WHEN 'unknown' THEN 'its outcome is unknown' ELSE 'it is in review' END
            USING ERRCODE = '55000',
                  HINT = CASE WHEN o.status = 'in_review' THEN 'A person decides on operations in review: use idempo.resolve().'
                              WHEN o.status IN ('succeeded', 'failed') AND o.sweep_at > o.expires_at
                                  THEN 'The operation finished and its result has expired; every claim answers expired.'
                              WHEN o.status IN ('succeeded', 'failed')
                                  THEN 'The operation is already finished; its result is replayed to every claim.'
                              ELSE 'Claim the key first with idempo.claim().' END;
    END IF;
    IF mine.attempt = a THEN
        UPDATE pg_temp.idempo_txn_attempts AS x SET finished = true
         WHERE x.xact = pg_current_xact_id() AND x.scope = s.name AND x.key = k AND x.kind = 'attempt';
    END IF;
    IF s.audit THEN
        INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, outcome, action, actor)
        VALUES (t, s.name, k, o.run_id, a, o.status, p_to, NULL, p_verb, idempo.managed_caller());
    END IF;
    -- the notice of finish.c: notice_attempts_used()
    IF p_to = 'retryable' AND s.max_attempts > 0 AND a >= s.max_attempts THEN
        SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k;
        IF FOUND AND o.attempt - o.attempt_base >= s.max_attempts THEN
            RAISE NOTICE 'key "%" in scope "%" has used the % attempt% its scope allows: the next claim puts it in review',
                k, s.name, s.max_attempts, CASE WHEN s.max_attempts = 1 THEN '' ELSE 's' END
                USING DETAIL = format('fail() recorded attempt %s as retryable; max_attempts of the scope is %s.', a, s.max_attempts),
                      HINT = 'Do not retry it: the next claim answers in_review (reason attempts_exhausted), and a reviewer''s resolve(..., ''not_executed'') grants new attempts.';
        END IF;
    END IF;
    RETURN p_to;
END
$$;

-- managed-differs: security: writes idempo.operations, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.complete(
    scope      text,
    key        text,
    attempt    integer DEFAULT NULL,
    result     jsonb   DEFAULT NULL,
    target_ref text    DEFAULT NULL)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN idempo.managed_finish(complete.scope, complete.key, complete.attempt, 'succeeded',
                                 complete.result, complete.target_ref, NULL, 'complete', false);
END
$$;

-- managed-differs: security: writes idempo.operations, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.fail(
    scope     text,
    key       text,
    attempt   integer DEFAULT NULL,
    error     text    DEFAULT NULL,
    retryable boolean DEFAULT true)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN idempo.managed_finish(fail.scope, fail.key, fail.attempt,
                                 CASE WHEN fail.retryable IS NULL OR fail.retryable THEN 'retryable' ELSE 'failed' END::idempo.status,
                                 NULL, NULL, fail.error, 'fail', fail.retryable IS NULL);
END
$$;

-- managed-differs: security: writes idempo.operations, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.heartbeat(
    scope   text,
    key     text,
    attempt integer,
    extend  interval DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN idempo.managed_heartbeat(heartbeat.scope, heartbeat.key, heartbeat.attempt, heartbeat.extend);
END
$$;
