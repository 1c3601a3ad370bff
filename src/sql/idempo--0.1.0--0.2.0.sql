-- idempo 0.1.0 -> 0.2.0.
-- Released install scripts (idempo--0.1.0.sql) are frozen: every schema change after a release
-- goes into the next version's install script AND into an upgrade script like this one, so that
-- ALTER EXTENSION idempo UPDATE leaves a database with exactly the objects of a fresh install
-- (test/upgrade/run compares the two).  Same rules as the install script: every object
-- schema-qualified, operators written OPERATOR(pg_catalog.x).

\echo Use "ALTER EXTENSION idempo UPDATE" to load this file. \quit


-- Citus (README "Scale-out with Citus"): resolve_conflict locks the row through its key,
-- alter_scope reschedules with an immutable expression, and check_consistency is written so that
-- a cluster distributed by key can run it.
CREATE OR REPLACE FUNCTION idempo.resolve_conflict(conflict_id bigint, resolution text, reviewer text,
                                        note text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c idempo.conflicts;
    k text;
BEGIN
    IF resolution IS NULL OR resolution NOT IN ('kept_stored', 'new_key', 'dismissed') THEN
        RAISE EXCEPTION 'unknown conflict resolution %', coalesce(quote_literal(resolution), 'NULL')
            USING ERRCODE = '22023', HINT = 'Use ''kept_stored'', ''new_key'' or ''dismissed''.';
    END IF;
    IF reviewer IS NULL OR reviewer = '' THEN
        RAISE EXCEPTION 'a reviewer must be named to resolve conflict %', conflict_id
            USING ERRCODE = '22004', HINT = 'Pass reviewer => ''your name''.';
    END IF;
    -- The key first, then the row locked through it: on a cluster distributed by key (Citus) a
    -- row can only be locked by a statement that names its key.
    SELECT x.key INTO k FROM idempo.conflicts AS x WHERE x.id = conflict_id;
    SELECT * INTO c FROM idempo.conflicts AS x WHERE x.id = conflict_id AND x.key = k FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'conflict % does not exist', conflict_id
            USING ERRCODE = '42704', HINT = 'Open conflicts are listed in idempo.conflicts where resolved_at is null.';
    END IF;
    IF c.resolved_at IS NOT NULL THEN
        RAISE EXCEPTION 'conflict % (scope "%", key "%") was already resolved by % at %',
            conflict_id, c.scope, c.key, c.resolved_by, c.resolved_at
            USING ERRCODE = '55000', HINT = 'A resolved conflict cannot be resolved again.';
    END IF;
    UPDATE idempo.conflicts AS x
       SET resolved_at = now(), resolved_by = reviewer,
           resolution = resolve_conflict.resolution, note = resolve_conflict.note
     WHERE x.id = conflict_id AND x.key = c.key;
END
$$;

CREATE OR REPLACE FUNCTION idempo.check_consistency()
    RETURNS TABLE (scope text, key text, problem text)
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET TimeZone = 'UTC' AS $$
    -- Written so that a cluster distributed by key (Citus) can run it too: the checks of a row
    -- form an array (no VALUES with a subquery), open reviews are counted in a join on the key.
    SELECT x.scope, x.key, p.problem
    FROM (
        SELECT o.scope, o.key, ARRAY[
            CASE WHEN s.name IS NULL THEN 'scope does not exist' END,
            CASE WHEN o.status = 'in_progress' AND o.lease_expires_at IS NULL THEN 'in_progress without a lease' END,
            CASE WHEN o.status <> 'in_progress' AND o.lease_expires_at IS NOT NULL THEN 'lease on a record that is not in_progress' END,
            CASE WHEN o.status IN ('succeeded', 'failed') AND (o.completed_at IS NULL OR o.expires_at IS NULL)
                 THEN 'finished without completed_at/expires_at' END,
            CASE WHEN o.status NOT IN ('succeeded', 'failed') AND o.expires_at IS NOT NULL
                 THEN 'unfinished with expires_at' END,
            CASE WHEN o.status = 'in_review' AND o.sweep_at IS NOT NULL THEN 'in_review but scheduled for the sweep' END,
            CASE WHEN o.status <> 'in_review' AND o.sweep_at IS NULL THEN 'never swept' END,
            CASE WHEN o.status IN ('succeeded', 'failed') AND o.sweep_at > o.expires_at THEN 'swept after expiry' END,
            CASE WHEN o.status IN ('in_progress', 'retryable', 'unknown') AND s.name IS NOT NULL
                      AND extract(month FROM s.retention) = 0 AND extract(year FROM s.retention) = 0
                      AND o.sweep_at > o.first_seen_at + s.retention THEN 'swept after retention' END,
            CASE WHEN o.attempt < 0 OR o.attempt_base > o.attempt THEN 'bad attempt numbers' END,
            CASE WHEN o.status = 'in_review' AND coalesce(rv.open, 0) <> 1
                 THEN 'in_review without exactly one open review' END
        ] AS problems
        FROM idempo.operations o
        LEFT JOIN idempo.scopes s ON s.name = o.scope
        LEFT JOIN (SELECT r.scope, r.key, count(*) AS open FROM idempo.reviews r
                   WHERE r.resolved_at IS NULL GROUP BY r.scope, r.key) rv
               ON rv.scope = o.scope AND rv.key = o.key
    ) x
    CROSS JOIN LATERAL unnest(x.problems) AS p(problem)
    WHERE p.problem IS NOT NULL
    UNION ALL
    SELECT r.scope, r.key, 'open review of an operation that is not in_review'
    FROM idempo.reviews r
    WHERE r.resolved_at IS NULL
      AND NOT EXISTS (SELECT FROM idempo.operations o
                      WHERE o.scope = r.scope AND o.key = r.key AND o.status = 'in_review')
$$;

CREATE OR REPLACE FUNCTION idempo.alter_scope(
    name                text,
    retention           interval DEFAULT NULL,
    lease               interval DEFAULT NULL,
    on_lease_expiry     text     DEFAULT NULL,
    verify_settle       interval DEFAULT NULL,
    max_attempts        integer  DEFAULT NULL,
    require_fingerprint boolean  DEFAULT NULL,
    hash_keys           boolean  DEFAULT NULL,
    store_params        boolean  DEFAULT NULL,
    audit               boolean  DEFAULT NULL,
    allowed_role        name     DEFAULT NULL,
    owner               text     DEFAULT NULL,
    environment         text     DEFAULT NULL,
    description         text     DEFAULT NULL)
    RETURNS idempo.scopes
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempo.scopes;
    r interval;
BEGIN
    IF alter_scope.name IS NULL THEN
        RAISE EXCEPTION 'scope name must not be NULL' USING ERRCODE = '22004',
            HINT = 'Pass the name of an existing scope.';
    END IF;
    SELECT * INTO s FROM idempo.scopes AS sc WHERE sc.name = alter_scope.name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'scope "%" does not exist', alter_scope.name
            USING ERRCODE = '42704', HINT = 'Create it with idempo.create_scope(name => ...).';
    END IF;
    IF alter_scope.hash_keys IS NOT NULL AND alter_scope.hash_keys <> s.hash_keys
       AND EXISTS (SELECT FROM idempo.operations o WHERE o.scope = s.name) THEN
        RAISE EXCEPTION 'cannot change hash_keys of scope "%": it has operations', s.name
            USING ERRCODE = '55000',
                  HINT = 'Stored keys would no longer match; create a new scope instead.';
    END IF;
    s.retention := coalesce(alter_scope.retention, s.retention);
    s.lease := coalesce(alter_scope.lease, s.lease);
    s.on_lease_expiry := coalesce(alter_scope.on_lease_expiry, s.on_lease_expiry);
    s.verify_settle := coalesce(alter_scope.verify_settle, s.verify_settle);
    IF alter_scope.max_attempts IS NOT NULL THEN
        s.max_attempts := nullif(alter_scope.max_attempts, 0);
    END IF;
    s.require_fingerprint := coalesce(alter_scope.require_fingerprint, s.require_fingerprint);
    s.hash_keys := coalesce(alter_scope.hash_keys, s.hash_keys);
    s.store_params := coalesce(alter_scope.store_params, s.store_params);
    s.audit := coalesce(alter_scope.audit, s.audit);
    IF alter_scope.allowed_role IS NOT NULL THEN
        s.allowed_role := nullif(alter_scope.allowed_role, '');
    END IF;
    IF alter_scope.owner IS NOT NULL THEN
        s.owner := nullif(alter_scope.owner, '');
    END IF;
    IF alter_scope.environment IS NOT NULL THEN
        s.environment := nullif(alter_scope.environment, '');
    END IF;
    IF alter_scope.description IS NOT NULL THEN
        s.description := nullif(alter_scope.description, '');
    END IF;
    s.updated_at := now();
    PERFORM idempo.check_scope(s);
    UPDATE idempo.scopes AS sc SET
        retention = s.retention, lease = s.lease, on_lease_expiry = s.on_lease_expiry,
        verify_settle = s.verify_settle, max_attempts = s.max_attempts,
        require_fingerprint = s.require_fingerprint, hash_keys = s.hash_keys,
        store_params = s.store_params, audit = s.audit, allowed_role = s.allowed_role,
        owner = s.owner, environment = s.environment, description = s.description,
        updated_at = s.updated_at
    WHERE sc.name = s.name;
    -- A shorter retention must not leave unfinished work waiting for a sweep that comes too late.
    -- The retention as the C code counts it (a day is 24 hours, a month 30 days), added in UTC:
    -- exact, and immutable, which a cluster distributed by key (Citus) needs in an UPDATE.
    r := make_interval(days => ((extract(year FROM s.retention) * 12 + extract(month FROM s.retention)) * 30
                                + extract(day FROM s.retention))::integer)
         + (s.retention - date_trunc('day', s.retention));
    UPDATE idempo.operations AS o SET sweep_at = ((o.first_seen_at AT TIME ZONE 'UTC') + r) AT TIME ZONE 'UTC'
    WHERE o.scope = s.name
      AND o.status IN ('in_progress', 'retryable', 'unknown')
      AND o.sweep_at > ((o.first_seen_at AT TIME ZONE 'UTC') + r) AT TIME ZONE 'UTC';
    RETURN s;
END
$$;
