-- idempo 0.2.0 -> 0.3.0.
-- Released install scripts are frozen: every schema change after a release goes into the next
-- version's install script AND into an upgrade script like this one, so that ALTER EXTENSION
-- idempo UPDATE leaves a database with exactly the objects of a fresh install (test/upgrade/run
-- compares the two).  Same rules as the install script: every object schema-qualified,
-- operators written OPERATOR(pg_catalog.x).

\echo Use "ALTER EXTENSION idempo UPDATE" to load this file. \quit

------------------------------------------------------------------------------------------------
-- Who may review (src/review_rights.c): a scope's review_role, else its allowed_role, else any
-- role with the grants; idempo's owner always.  The views a reviewer reads show only the scopes
-- the current role may review (security_barrier: a function of the caller's in a WHERE clause
-- cannot see the rows before the filter does).
------------------------------------------------------------------------------------------------

-- PARALLEL UNSAFE: it may read the scope as committed now (src/scope_cache.c), which a query
-- running in parallel mode may not
CREATE FUNCTION idempo.may_review(scope text) RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempo_may_review'
    LANGUAGE C STABLE PARALLEL UNSAFE;
COMMENT ON FUNCTION idempo.may_review(text) IS
    'May the current role review the scope''s records (its review_role, else its allowed_role, else anyone)?';
-- The same from a scope's two settings, reading no table: the views' filter (on Citus it runs on
-- the workers, with each shard's query).
CREATE FUNCTION idempo.may_review(review_role name, allowed_role name) RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempo_may_review_settings'
    LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION idempo.may_review(name, name) IS
    'May the current role review the records of a scope with these review_role and allowed_role?';

-- For resolve_conflict() and release(), which run as the owner: refuses a caller who may not
-- review the scope, and returns the name the decision records.
CREATE FUNCTION idempo.check_reviewer(scope text, key text, reviewer text, what text) RETURNS text
    AS 'MODULE_PATHNAME', 'idempo_check_reviewer'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION idempo.may_review(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.may_review(text) TO PUBLIC;
REVOKE ALL ON FUNCTION idempo.may_review(name, name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.may_review(name, name) TO PUBLIC;
REVOKE ALL ON FUNCTION idempo.check_reviewer(text, text, text, text) FROM PUBLIC;

-- verify() names the attempt its lookup was made for and is refused for any other (a lookup made
-- while attempt N was in doubt says nothing about attempt N+1).  The old form stays, refusing with
-- a hint.  Roles granted EXECUTE on the old form need a GRANT on the new one (docs/upgrading.md).
-- attempt: the attempt the lookup was made for (the one claim() answered 'unknown' with); any
-- other is refused, as complete() and fail() refuse a superseded attempt.
CREATE FUNCTION idempo.verify(
    scope      text,
    key        text,
    attempt    integer,
    found      boolean,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL)
    RETURNS idempo.status
    AS 'MODULE_PATHNAME', 'idempo_verify_attempt'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION idempo.verify(
    scope      text,
    key        text,
    found      boolean,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL)
    RETURNS idempo.status
    AS 'MODULE_PATHNAME', 'idempo_verify_without_attempt'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION idempo.verify(text, text, integer, boolean, text, jsonb) FROM PUBLIC;

-- An open conflict is one stored request against one incoming request: a later lifetime of the key
-- (another stored request) is another conflict, instead of counting on a row that shows the stored
-- parameters of the earlier one.  Existing open rows stay unique under the wider key.
DROP INDEX idempo.conflicts_open_idx;
CREATE UNIQUE INDEX conflicts_open_idx
    ON idempo.conflicts (scope, key, stored_fingerprint, incoming_fingerprint)
    WHERE resolved_at IS NULL;

------------------------------------------------------------------------------------------------
-- Waits are never negative (a review or conflict recorded under a test's idempo.clock_offset may
-- lie in the future of a session without it).
------------------------------------------------------------------------------------------------

CREATE OR REPLACE VIEW idempo.review_queue AS
SELECT r.id, r.scope, r.key, r.reason, r.opened_at,
       GREATEST(idempo.now() OPERATOR(pg_catalog.-) r.opened_at, '0'::interval) AS waiting,
       o.status, o.attempt, o.run_id, o.first_seen_at, o.last_attempt_at, o.target_ref,
       r.detail, pg_catalog.to_jsonb(r.operation) AS snapshot
FROM idempo.reviews r
LEFT JOIN idempo.operations o
       ON o.scope OPERATOR(pg_catalog.=) r.scope AND o.key OPERATOR(pg_catalog.=) r.key
WHERE r.resolved_at IS NULL
ORDER BY r.opened_at, r.id;

CREATE OR REPLACE VIEW idempo.stats AS
WITH ops AS (
    SELECT o.scope,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'in_progress') AS in_progress,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'succeeded'
                                       AND NOT COALESCE(o.sweep_at OPERATOR(pg_catalog.>) o.expires_at, false)) AS succeeded,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'failed'
                                       AND NOT COALESCE(o.sweep_at OPERATOR(pg_catalog.>) o.expires_at, false)) AS failed,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'retryable') AS retryable,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'unknown') AS unknown,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'in_review') AS in_review,
           -- a remembered key: finished, its result expired (sweep_at past expires_at, see op_row_remembered())
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) ANY ('{succeeded,failed}')
                                       AND o.sweep_at OPERATOR(pg_catalog.>) o.expires_at) AS remembered
    FROM idempo.operations o GROUP BY o.scope),
revs AS (
    SELECT r.scope, pg_catalog.count(*) AS open_reviews, pg_catalog.min(r.opened_at) AS oldest
    FROM idempo.reviews r WHERE r.resolved_at IS NULL GROUP BY r.scope),
cons AS (
    SELECT c.scope, pg_catalog.count(*) AS open_conflicts
    FROM idempo.conflicts c WHERE c.resolved_at IS NULL GROUP BY c.scope)
SELECT s.name AS scope, s.enabled,
       COALESCE(ops.in_progress, 0) AS in_progress, COALESCE(ops.succeeded, 0) AS succeeded,
       COALESCE(ops.failed, 0) AS failed, COALESCE(ops.retryable, 0) AS retryable,
       COALESCE(ops.unknown, 0) AS unknown, COALESCE(ops.in_review, 0) AS in_review,
       COALESCE(revs.open_reviews, 0) AS open_reviews,
       CASE WHEN revs.oldest IS NOT NULL
            THEN GREATEST(idempo.now() OPERATOR(pg_catalog.-) revs.oldest, '0'::interval) END AS oldest_review_wait,
       COALESCE(cons.open_conflicts, 0) AS open_conflicts,
       COALESCE(ops.remembered, 0) AS remembered
FROM idempo.scopes s
LEFT JOIN ops ON ops.scope OPERATOR(pg_catalog.=) s.name
LEFT JOIN revs ON revs.scope OPERATOR(pg_catalog.=) s.name
LEFT JOIN cons ON cons.scope OPERATOR(pg_catalog.=) s.name;

CREATE OR REPLACE VIEW idempo.conflict_queue AS
SELECT c.id, c.scope, c.key, c.occurrences, c.first_detected_at, c.last_detected_at,
       GREATEST(idempo.now() OPERATOR(pg_catalog.-) c.first_detected_at, '0'::interval) AS waiting, c.run_id,
       o.status AS stored_status, o.target_ref AS stored_target_ref,
       (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('field', d.field,
                   'stored', d.stored_value, 'incoming', d.incoming_value) ORDER BY d.field)
          FROM idempo.params_diff(c.stored_params, c.incoming_params) d) AS changed_fields,
       c.stored_params, c.incoming_params
FROM idempo.conflicts c
LEFT JOIN idempo.operations o
       ON o.scope OPERATOR(pg_catalog.=) c.scope AND o.key OPERATOR(pg_catalog.=) c.key
WHERE c.resolved_at IS NULL
ORDER BY c.first_detected_at, c.id;

------------------------------------------------------------------------------------------------
-- Logical replication: where idempo's records come from a publisher, nothing writes them here
-- (src/replication.c); resolve_conflict checks it too.
------------------------------------------------------------------------------------------------

CREATE FUNCTION idempo.refuse_on_subscriber(scope text, key text) RETURNS void
    AS 'MODULE_PATHNAME', 'idempo_refuse_on_subscriber_sql'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION idempo.refuse_on_subscriber(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION idempo.resolve_conflict(conflict_id bigint, resolution text, reviewer text DEFAULT NULL,
                                        note text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    c idempo.conflicts;
    k text;
    decided_by text;
BEGIN
    IF resolution IS NULL OR resolution NOT IN ('kept_stored', 'new_key', 'dismissed') THEN
        RAISE EXCEPTION 'unknown conflict resolution %', coalesce(quote_literal(resolution), 'NULL')
            USING ERRCODE = '22023', HINT = 'Use ''kept_stored'', ''new_key'' or ''dismissed''.';
    END IF;
    -- The key first, then the row locked through it: on a cluster distributed by key (Citus) a
    -- row can only be locked by a statement that names its key.
    SELECT x.key INTO k FROM idempo.conflicts AS x WHERE x.id = conflict_id;
    SELECT * INTO c FROM idempo.conflicts AS x WHERE x.id = conflict_id AND x.key = k FOR UPDATE;
    -- a conflict of a scope the caller does not review does not exist for it: conflict ids are a
    -- sequence, and a refusal naming the scope would list another scope's conflicts
    IF FOUND AND NOT EXISTS (SELECT FROM idempo.scopes AS s WHERE s.name = c.scope
                             AND idempo.caller_may_review(s.review_role, s.allowed_role)) THEN
        FOUND := false;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'conflict % does not exist', conflict_id
            USING ERRCODE = '42704', HINT = 'The open conflicts of the scopes you review are listed by idempo.conflict_queue_page().';
    END IF;
    -- the scope's reviewers only; the name recorded is the caller's (src/review_rights.c); the
    -- refusal names no key: conflict ids are a sequence anyone may try
    decided_by := idempo.check_reviewer(c.scope, NULL, reviewer, 'resolve conflicts');
    -- where the records come from a publisher (logical replication), only the publisher resolves
    PERFORM idempo.refuse_on_subscriber(c.scope, c.key);
    IF c.resolved_at IS NOT NULL THEN
        RAISE EXCEPTION 'conflict % (scope "%", key "%") was already resolved by % at %',
            conflict_id, c.scope, c.key, c.resolved_by, c.resolved_at
            USING ERRCODE = '55000', HINT = 'A resolved conflict cannot be resolved again.';
    END IF;
    UPDATE idempo.conflicts AS x
       SET resolved_at = now(), resolved_by = decided_by,
           resolution = resolve_conflict.resolution, note = resolve_conflict.note
     WHERE x.id = conflict_id AND x.key = c.key;
END
$$;

------------------------------------------------------------------------------------------------
-- DROP EXTENSION idempo is refused while records exist (src/drop_guard.c)
------------------------------------------------------------------------------------------------

-- It fires for every DROP, so the library and its object_access_hook (cascades) are loaded first.

CREATE FUNCTION idempo.drop_guard() RETURNS event_trigger
    AS 'MODULE_PATHNAME', 'idempo_drop_guard'
    LANGUAGE C;
CREATE EVENT TRIGGER idempo_drop_guard ON ddl_command_start
    WHEN TAG IN ('DROP ACCESS METHOD', 'DROP AGGREGATE', 'DROP CAST', 'DROP COLLATION',
                 'DROP CONVERSION', 'DROP DOMAIN', 'DROP EXTENSION',
                 'DROP FOREIGN DATA WRAPPER', 'DROP FOREIGN TABLE', 'DROP FUNCTION',
                 'DROP INDEX', 'DROP LANGUAGE', 'DROP MATERIALIZED VIEW', 'DROP OPERATOR',
                 'DROP OPERATOR CLASS', 'DROP OPERATOR FAMILY', 'DROP OWNED', 'DROP POLICY',
                 'DROP PROCEDURE', 'DROP PUBLICATION', 'DROP ROUTINE', 'DROP RULE',
                 'DROP SCHEMA', 'DROP SEQUENCE', 'DROP SERVER', 'DROP STATISTICS', 'DROP TABLE',
                 'DROP TEXT SEARCH CONFIGURATION', 'DROP TEXT SEARCH DICTIONARY',
                 'DROP TEXT SEARCH PARSER', 'DROP TEXT SEARCH TEMPLATE', 'DROP TRANSFORM',
                 'DROP TRIGGER', 'DROP TYPE', 'DROP USER MAPPING', 'DROP VIEW')
    EXECUTE FUNCTION idempo.drop_guard();
ALTER EVENT TRIGGER idempo_drop_guard ENABLE ALWAYS;
REVOKE ALL ON FUNCTION idempo.drop_guard() FROM PUBLIC;

------------------------------------------------------------------------------------------------
-- Scopes may demand that their claims survive failover: durability 'replicated'
-- (src/durability.c)
------------------------------------------------------------------------------------------------

-- create_scope(), alter_scope() and claim() gain parameters, so they are dropped and created
-- again (below); an EXECUTE right granted on them cannot be carried over by this script (a GRANT
-- made here would count as part of the extension, and pg_dump would then leave it out), so each
-- one is named.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT p.proname,
                    CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                         ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END AS grantee,
                    a.is_grantable
             FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
             WHERE p.pronamespace = 'idempo'::pg_catalog.regnamespace
               AND p.proname IN ('create_scope', 'alter_scope', 'claim')
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
             ORDER BY 1, 2
    LOOP
        RAISE WARNING 'idempo.%() gains parameters in 0.3.0: the EXECUTE right of % on it is not carried over',
            r.proname, r.grantee
            USING HINT = pg_catalog.format('Grant it again after the update: GRANT EXECUTE ON FUNCTION idempo.%s TO %s%s;',
                                           r.proname, r.grantee,
                                           CASE WHEN r.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
    END LOOP;
END
$$;

ALTER TABLE idempo.scopes ADD COLUMN durability text NOT NULL DEFAULT 'local'
    CONSTRAINT scopes_durability_check CHECK (durability IN ('local', 'replicated'));

-- Remembered keys (scope option remember, docs/remembered-keys.md) and fingerprint rules (scope
-- option fingerprint_ignore, docs/fingerprint-rules.md); create_scope/alter_scope below take them.
ALTER TABLE idempo.scopes
    ADD COLUMN remember interval NOT NULL DEFAULT '0',
    ADD COLUMN fingerprint_ignore text[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT scopes_remember_check CHECK (remember OPERATOR(pg_catalog.>=) '0'::interval);
COMMENT ON COLUMN idempo.scopes.remember IS
    'How long a finished record is remembered (key, fingerprint, status, target_ref) after its result expires; 0: purged at expires_at.';
COMMENT ON COLUMN idempo.scopes.fingerprint_ignore IS
    'Dot paths of object keys left out of the fingerprint (arrays are not entered); fixed while the scope has operations.';
-- The only fields that count (scope option fingerprint_include, docs/fingerprint-rules.md).
ALTER TABLE idempo.scopes ADD COLUMN fingerprint_include text[] NOT NULL DEFAULT '{}';
COMMENT ON COLUMN idempo.scopes.fingerprint_include IS
    'Paths of the only fields that count in the fingerprint (items[*].sku enters arrays); empty: every field; fixed while the scope has operations.';
-- what happened when (the review console's days); see the install script
CREATE INDEX events_at_idx ON idempo.events USING brin (at);
-- Who reviews the scope's records (src/review_rights.c).
ALTER TABLE idempo.scopes ADD COLUMN review_role name;
COMMENT ON COLUMN idempo.scopes.review_role IS
    'Whose members review the scope''s records (resolve, conflicts, release); NULL: allowed_role''s members, or anyone when that is NULL too.';

CREATE OR REPLACE FUNCTION idempo.check_scope(s idempo.scopes) RETURNS void
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p text;
    iv interval;
    rule text;
    paths text[];
    dims_hint text;
    many_hint text;
BEGIN
    IF s.name IS NULL OR s.name = '' THEN
        RAISE EXCEPTION 'scope name must not be empty' USING ERRCODE = '22023',
            HINT = 'Name the kind of business action, e.g. ''warehouse.outbound''.';
    END IF;
    IF btrim(s.name, E' \t\n\r\f\x0b') = '' THEN
        RAISE EXCEPTION 'scope name must not be only whitespace' USING ERRCODE = '22023',
            HINT = 'Name the kind of business action, e.g. ''warehouse.outbound''.';
    END IF;
    IF octet_length(s.name) > 128 THEN
        RAISE EXCEPTION 'scope name is % bytes long, the limit is 128', octet_length(s.name)
            USING ERRCODE = '22023', HINT = 'Use a shorter scope name.';
    END IF;
    IF s.retention IS NULL OR s.retention <= '0'::interval THEN
        RAISE EXCEPTION 'retention of scope "%" must be positive, not %', s.name, s.retention
            USING ERRCODE = '22023', HINT = 'Give an interval such as ''24 hours''.';
    END IF;
    IF s.lease IS NULL OR s.lease <= '0'::interval THEN
        RAISE EXCEPTION 'lease of scope "%" must be positive, not %', s.name, s.lease
            USING ERRCODE = '22023', HINT = 'Give an interval such as ''5 minutes''.';
    END IF;
    IF s.verify_settle IS NULL OR s.verify_settle <= '0'::interval THEN
        RAISE EXCEPTION 'verify_settle of scope "%" must be positive, not %', s.name, s.verify_settle
            USING ERRCODE = '22023', HINT = 'Give an interval such as ''1 minute''.';
    END IF;
    IF s.retention > '100 years'::interval OR s.lease > '100 years'::interval
       OR s.verify_settle > '100 years'::interval THEN
        RAISE EXCEPTION 'timings of scope "%" must be at most 100 years (retention %, lease %, verify_settle %)',
            s.name, s.retention, s.lease, s.verify_settle
            USING ERRCODE = '22023', HINT = 'Records are kept for the retention; give a realistic interval.';
    END IF;
    IF s.lease >= s.retention OR s.verify_settle >= s.retention THEN
        RAISE EXCEPTION 'lease (%) and verify_settle (%) of scope "%" must be shorter than its retention (%)',
            s.lease, s.verify_settle, s.name, s.retention
            USING ERRCODE = '22023',
                  HINT = 'Unfinished work goes to review when retention runs out; a lease or settle window that outlives it would never be used.';
    END IF;
    IF s.on_lease_expiry IS NULL OR s.on_lease_expiry NOT IN ('unknown', 'retry') THEN
        RAISE EXCEPTION 'on_lease_expiry of scope "%" must be ''unknown'' or ''retry'', not %',
            s.name, coalesce(quote_literal(s.on_lease_expiry), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use ''retry'' only when the target system honours the same idempotency key.';
    END IF;
    IF s.max_attempts IS NOT NULL AND s.max_attempts < 1 THEN
        RAISE EXCEPTION 'max_attempts of scope "%" must be at least 1, not %', s.name, s.max_attempts
            USING ERRCODE = '22023', HINT = 'Leave it NULL (alter_scope: 0) for no limit.';
    END IF;
    IF s.durability IS NULL OR s.durability NOT IN ('local', 'replicated') THEN
        RAISE EXCEPTION 'durability of scope "%" must be ''local'' or ''replicated'', not %',
            s.name, coalesce(quote_literal(s.durability), 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Use ''replicated'' when a claim must survive a failover: its commit then needs a synchronous standby.';
    END IF;
    IF s.allowed_role IS NOT NULL
       AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = s.allowed_role) THEN
        RAISE EXCEPTION 'role "%" does not exist', s.allowed_role
            USING ERRCODE = '42704', HINT = 'Create the role first, or leave allowed_role NULL.';
    END IF;
    IF s.review_role IS NOT NULL AND s.allowed_role IS NULL THEN
        RAISE EXCEPTION 'review_role of scope "%" needs an allowed_role', s.name
            USING ERRCODE = '22023',
                  DETAIL = 'Without allowed_role every role with EXECUTE acts as the application: it may look the records up, verify and request review.',
                  HINT = 'Name the application''s role too: allowed_role => ''...''.';
    END IF;
    IF s.review_role IS NOT NULL
       AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = s.review_role) THEN
        RAISE EXCEPTION 'role "%" does not exist', s.review_role
            USING ERRCODE = '42704', HINT = 'Create the role first, or leave review_role NULL.';
    END IF;
    IF s.remember IS NULL OR s.remember < '0'::interval OR s.remember > '100 years'::interval THEN
        RAISE EXCEPTION 'remember of scope "%" must be between 0 and 100 years, not %', s.name,
            coalesce(s.remember::text, 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'Give an interval such as ''1 year'' to keep finished keys after their results expire, or ''0'' to purge them at expires_at.';
    END IF;
    -- Each is added to a time on the calendar (months, then days, then the rest: src/clock.c), so
    -- every part must run forward: '1 mon -29 days' compares as 1 day but would end on 31 January
    -- for a record written on 1 March, before it began.
    FOR p, iv IN VALUES ('retention', s.retention), ('lease', s.lease),
                        ('verify_settle', s.verify_settle), ('remember', s.remember) LOOP
        IF extract(year FROM iv) * 12 + extract(month FROM iv) < 0 OR extract(day FROM iv) < 0
           OR extract(epoch FROM iv - make_interval(months => (extract(year FROM iv) * 12
                                                                + extract(month FROM iv))::int,
                                                    days => extract(day FROM iv)::int)) < 0 THEN
            RAISE EXCEPTION '% of scope "%" has a part that runs backwards: %', p, s.name, iv
                USING ERRCODE = '22023',
                      HINT = 'Give no part a negative sign, e.g. ''1 day'' rather than ''1 mon -29 days''.';
        END IF;
    END LOOP;
    -- The fingerprint rules' path lists, both checked as the C code that compiles them checks
    -- (src/fingerprint_rules.c, src/fingerprint_include.c): the list, each path, then the
    -- grammar of each rule (fingerprint_ignore: keys separated by single dots; fingerprint_include:
    -- [*] after a key for every element of an array, a backslash takes the next character)
    FOR rule, paths, dims_hint, many_hint IN VALUES
            ('fingerprint_ignore', s.fingerprint_ignore, 'Pass e.g. ARRAY[''delivered_at'', ''meta.trace_id''].',
             'Name the few volatile fields (delivery times, attempt counters, trace ids); leave the object that holds many of them out as one path.'),
            ('fingerprint_include', s.fingerprint_include, 'Pass e.g. ARRAY[''order'', ''items[*].sku''].',
             'Name the fields that identify the request; a path that ends on an object counts all of it.') LOOP
        IF paths IS NULL THEN
            RAISE EXCEPTION '% of scope "%" must not be NULL', rule, s.name
                USING ERRCODE = '22004', HINT = 'Pass an empty array (''{}'') to let every field count.';
        END IF;
        IF array_ndims(paths) > 1 THEN
            RAISE EXCEPTION '% of scope "%" must be a one-dimensional array', rule, s.name
                USING ERRCODE = '22023', HINT = dims_hint;
        END IF;
        IF cardinality(paths) > 256 THEN
            RAISE EXCEPTION '% of scope "%" has % paths, the limit is 256', rule, s.name, cardinality(paths)
                USING ERRCODE = '22023', HINT = many_hint;
        END IF;
        FOR i IN 1 .. coalesce(cardinality(paths), 0) LOOP
            p := paths[array_lower(paths, 1) + i - 1];
            IF p IS NULL THEN
                RAISE EXCEPTION '% of scope "%": path % is NULL', rule, s.name, i
                    USING ERRCODE = '22023', HINT = 'Remove the NULL element.';
            ELSIF octet_length(p) > 1024 THEN
                RAISE EXCEPTION '% of scope "%": path % is % bytes long, the limit is 1024',
                    rule, s.name, i, octet_length(p)
                    USING ERRCODE = '22023', HINT = 'Use a shorter path.';
            ELSIF rule = 'fingerprint_ignore' AND p = '' THEN
                RAISE EXCEPTION 'fingerprint_ignore of scope "%": path % is empty', s.name, i
                    USING ERRCODE = '22023', HINT = 'A path names a field, e.g. ''delivered_at'' or ''meta.trace_id''.';
            ELSIF rule = 'fingerprint_ignore' AND (starts_with(p, '.') OR right(p, 1) = '.' OR strpos(p, '..') > 0) THEN
                RAISE EXCEPTION 'fingerprint_ignore of scope "%": path % ("%") has an empty segment', s.name, i, p
                    USING ERRCODE = '22023', HINT = 'Separate object keys with single dots, without a dot at either end.';
            ELSIF rule = 'fingerprint_include'
                  AND p !~ '^(?:[^.[\\]|\\.)+(?:\[\*\])*(?:\.(?:[^.[\\]|\\.)+(?:\[\*\])*)*$' THEN
                RAISE EXCEPTION 'fingerprint_include of scope "%": path % ("%") is not a path', s.name, i, p
                    USING ERRCODE = '22023',
                          HINT = 'A path is object keys separated by dots, each optionally followed by [*] for every element of an array, e.g. ''order'', ''customer.id'', ''items[*].sku''; a backslash takes the next character literally (''a\.b'' is the key "a.b").';
            END IF;
        END LOOP;
    END LOOP;
END
$$;

-- 0.3.0 adds the scopes' intervals on the calendar (0.2.0 counted a month as 30 days): a scope
-- whose interval has a part that runs backwards would now end before it begins.  None should
-- exist (0.2.0 accepted them only as positive in total); if one does, say so before updating.
DO $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(format('%I (%s %s)', t.name, t.setting, t.iv), ', ') INTO bad
    FROM idempo.scopes AS sc,
         LATERAL (VALUES (sc.name, 'retention', sc.retention), (sc.name, 'lease', sc.lease),
                         (sc.name, 'verify_settle', sc.verify_settle)) AS t(name, setting, iv)
    WHERE extract(year FROM t.iv) * 12 + extract(month FROM t.iv) < 0 OR extract(day FROM t.iv) < 0
       OR extract(epoch FROM t.iv - make_interval(months => (extract(year FROM t.iv) * 12
                                                           + extract(month FROM t.iv))::int,
                                                 days => extract(day FROM t.iv)::int)) < 0;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'cannot update idempo to 0.3.0: these scopes have an interval with a part that runs backwards: %', bad
            USING ERRCODE = '22023',
                  HINT = 'Change them with idempo.alter_scope() so that no part of an interval is negative, then update.';
    END IF;
END
$$;

-- The update drops claim(), create_scope() and alter_scope() and creates them again with more
-- parameters.  A user's view or BEGIN ATOMIC function that uses one would stop it with
-- PostgreSQL's "use DROP ... CASCADE" (which would drop the user's objects): name them and say
-- what to do instead, before anything is changed.  Plain SQL and PL/pgSQL functions record no
-- dependency and keep working.
DO $$
DECLARE
    deps text;
BEGIN
    SELECT pg_catalog.string_agg(t.what, '; ' ORDER BY t.what) INTO deps
    FROM (SELECT DISTINCT
                 CASE WHEN d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
                      THEN (SELECT pg_catalog.pg_describe_object('pg_catalog.pg_class'::pg_catalog.regclass, r.ev_class, 0)
                            FROM pg_catalog.pg_rewrite r WHERE r.oid OPERATOR(pg_catalog.=) d.objid)
                      ELSE pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid) END
                 OPERATOR(pg_catalog.||) ' uses idempo.' OPERATOR(pg_catalog.||) p.proname OPERATOR(pg_catalog.||) '()' AS what
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.refobjid
          WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
            AND p.pronamespace OPERATOR(pg_catalog.=) 'idempo'::pg_catalog.regnamespace
            AND p.proname IN ('claim', 'create_scope', 'alter_scope')
            AND d.deptype OPERATOR(pg_catalog.=) 'n') AS t;
    IF deps IS NOT NULL THEN
        RAISE EXCEPTION 'cannot update idempo to 0.3.0: %', deps
            USING ERRCODE = '2BP01',
                  DETAIL = 'The update replaces idempo.claim(), idempo.create_scope() and idempo.alter_scope() with forms that take more parameters; nothing was changed.',
                  HINT = 'Drop these objects (keep their definitions: pg_get_viewdef(), pg_get_functiondef()), update, then create them again; the same calls work with the new functions.';
    END IF;
END
$$;

DROP FUNCTION idempo.create_scope(text, interval, interval, text, interval, integer, boolean, boolean, boolean, boolean, name, text, text, text);
CREATE FUNCTION idempo.create_scope(
    name                text,
    retention           interval DEFAULT '24 hours',
    lease               interval DEFAULT '5 minutes',
    on_lease_expiry     text     DEFAULT 'unknown',
    verify_settle       interval DEFAULT '1 minute',
    max_attempts        integer  DEFAULT NULL,
    require_fingerprint boolean  DEFAULT false,
    hash_keys           boolean  DEFAULT false,
    store_params        boolean  DEFAULT false,
    audit               boolean  DEFAULT false,
    allowed_role        name     DEFAULT NULL,
    owner               text     DEFAULT NULL,
    environment         text     DEFAULT NULL,
    description         text     DEFAULT NULL,
    durability          text     DEFAULT 'local',
    remember            interval DEFAULT '0',
    fingerprint_ignore  text[]   DEFAULT '{}',
    fingerprint_include text[]   DEFAULT '{}',
    review_role         name     DEFAULT NULL)
    RETURNS idempo.scopes
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempo.scopes;
BEGIN
    s.name := create_scope.name;
    s.retention := create_scope.retention;
    s.lease := create_scope.lease;
    s.on_lease_expiry := create_scope.on_lease_expiry;
    s.verify_settle := create_scope.verify_settle;
    s.max_attempts := create_scope.max_attempts;
    s.require_fingerprint := coalesce(create_scope.require_fingerprint, false);
    s.hash_keys := coalesce(create_scope.hash_keys, false);
    s.store_params := coalesce(create_scope.store_params, false);
    s.audit := coalesce(create_scope.audit, false);
    s.allowed_role := create_scope.allowed_role;
    s.owner := create_scope.owner;
    s.environment := create_scope.environment;
    s.description := create_scope.description;
    s.durability := create_scope.durability;
    s.remember := create_scope.remember;
    s.fingerprint_ignore := create_scope.fingerprint_ignore;
    s.fingerprint_include := create_scope.fingerprint_include;
    s.review_role := create_scope.review_role;
    s.enabled := true;
    s.created_at := now();
    s.updated_at := now();
    PERFORM idempo.check_scope(s);
    BEGIN
        INSERT INTO idempo.scopes SELECT s.*;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'scope "%" already exists', s.name
            USING ERRCODE = '42710', HINT = 'Change it with idempo.alter_scope().';
    END;
    RETURN s;
END
$$;

DROP FUNCTION idempo.alter_scope(text, interval, interval, text, interval, integer, boolean, boolean, boolean, boolean, name, text, text, text);
CREATE FUNCTION idempo.alter_scope(
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
    description         text     DEFAULT NULL,
    durability          text     DEFAULT NULL,
    remember            interval DEFAULT NULL,
    fingerprint_ignore  text[]   DEFAULT NULL,
    fingerprint_include text[]   DEFAULT NULL,
    review_role         name     DEFAULT NULL)
    RETURNS idempo.scopes
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempo.scopes;
    old_remember interval;
    old_lock_timeout text;
    locked boolean := false;
    changes_hash boolean;
    changes_rule text;
    changes_timing boolean;
    what text;
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
    -- hash_keys and fingerprint_ignore decide how a new record is stored, so they change only
    -- while the scope has no operations.  Pass 1 refuses at once where operations are there
    -- already.  Claims in flight have not committed theirs yet: before pass 2, a lock that
    -- conflicts with their ROW EXCLUSIVE waits for them (and a claim that comes after waits for
    -- this transaction and then sees the change: every writer of records takes that lock before
    -- it reads the scope, see idempo_scope_get_for_write() in scope_cache.c), so that pass 2,
    -- with a new snapshot, sees every operation.  retention and remember decide when records
    -- are swept, and a change reschedules them (below): the same lock makes the rescheduling see
    -- every record written with the old value (a claim or sweep that shrank a key, made a lease
    -- unknown) instead of skipping it while it is being written.  (lease, verify_settle,
    -- on_lease_expiry and the rest are used when a call decides, and are not stored in a
    -- record's schedule: a call that read the old value happened before the change.)  SHARE
    -- ROW EXCLUSIVE conflicts with itself: two such changes take turns.  New claims queue
    -- behind a waiting lock, so it is tried for 200 ms at a time, letting them through in
    -- between.
    changes_hash := alter_scope.hash_keys IS NOT NULL AND alter_scope.hash_keys <> s.hash_keys;
    -- the fingerprint rule that changes (fingerprint_include is fixed with operations for the
    -- reason fingerprint_ignore is), named first when both do
    changes_rule := CASE
        WHEN alter_scope.fingerprint_include IS NOT NULL
             AND ARRAY(SELECT DISTINCT x FROM unnest(alter_scope.fingerprint_include) AS x ORDER BY 1)
                 IS DISTINCT FROM ARRAY(SELECT DISTINCT x FROM unnest(s.fingerprint_include) AS x ORDER BY 1)
        THEN 'fingerprint_include'
        WHEN alter_scope.fingerprint_ignore IS NOT NULL
             AND ARRAY(SELECT DISTINCT x FROM unnest(alter_scope.fingerprint_ignore) AS x ORDER BY 1)
                 IS DISTINCT FROM ARRAY(SELECT DISTINCT x FROM unnest(s.fingerprint_ignore) AS x ORDER BY 1)
        THEN 'fingerprint_ignore' END;
    -- as written, not as interval equality ('1 month' = '30 days'): any other way to count it
    changes_timing := (alter_scope.retention IS NOT NULL AND alter_scope.retention::text <> s.retention::text)
        OR (alter_scope.remember IS NOT NULL AND alter_scope.remember::text <> s.remember::text);
    what := array_to_string(ARRAY[CASE WHEN changes_hash THEN 'hash_keys' END,
                                  changes_rule,
                                  CASE WHEN alter_scope.retention::text <> s.retention::text THEN 'retention' END,
                                  CASE WHEN alter_scope.remember::text <> s.remember::text THEN 'remember' END], ', ');
    -- where idempo's records come from a publisher, rescheduling them is the publisher's to do
    IF changes_timing THEN
        PERFORM idempo.refuse_on_subscriber(s.name, NULL);
    END IF;
    FOR pass IN 1 .. 2 LOOP
        EXIT WHEN NOT (changes_hash OR changes_rule IS NOT NULL OR changes_timing);
        IF changes_hash AND EXISTS (SELECT FROM idempo.operations o WHERE o.scope = s.name) THEN
            RAISE EXCEPTION 'cannot change hash_keys of scope "%": it has operations', s.name
                USING ERRCODE = '55000',
                      HINT = 'Stored keys would no longer match; create a new scope instead.';
        END IF;
        IF changes_rule IS NOT NULL AND EXISTS (SELECT FROM idempo.operations o WHERE o.scope = s.name) THEN
            RAISE EXCEPTION 'cannot change % of scope "%": it has operations', changes_rule, s.name
                USING ERRCODE = '55000',
                      HINT = 'Their fingerprints were computed under the old rule, so a redelivery would become a conflict; create a new scope, or change the rule once the scope''s records are gone.';
        END IF;
        EXIT WHEN pass = 2;
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'cannot change % of scope "%" in a % transaction',
                what, s.name, upper(current_setting('transaction_isolation'))
                USING ERRCODE = '0A000',
                      HINT = 'Run it in a READ COMMITTED transaction: it waits for the claims in flight and must then see their operations, which an older snapshot does not show.';
        END IF;
        old_lock_timeout := current_setting('lock_timeout');
        FOR try IN 1 .. 45 LOOP
            BEGIN
                PERFORM set_config('lock_timeout', '200ms', true);
                LOCK TABLE idempo.operations IN SHARE ROW EXCLUSIVE MODE;
                locked := true;
            EXCEPTION WHEN lock_not_available THEN
                PERFORM pg_sleep(0.02);
            END;
            EXIT WHEN locked;
        END LOOP;
        PERFORM set_config('lock_timeout', old_lock_timeout, true);
        IF NOT locked THEN
            RAISE EXCEPTION 'cannot change scope "%": claims kept idempo.operations busy for 10 seconds', s.name
                USING ERRCODE = '55P03',
                      HINT = format('Changing %s waits for the transactions writing idempo.operations; retry when they are fewer or shorter.', what);
        END IF;
    END LOOP;
    old_remember := s.remember;
    s.remember := coalesce(alter_scope.remember, s.remember);
    s.fingerprint_ignore := coalesce(alter_scope.fingerprint_ignore, s.fingerprint_ignore);
    s.fingerprint_include := coalesce(alter_scope.fingerprint_include, s.fingerprint_include);
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
    IF alter_scope.review_role IS NOT NULL THEN
        s.review_role := nullif(alter_scope.review_role, '');
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
    s.durability := coalesce(alter_scope.durability, s.durability);
    s.updated_at := now();
    PERFORM idempo.check_scope(s);
    UPDATE idempo.scopes AS sc SET
        retention = s.retention, lease = s.lease, on_lease_expiry = s.on_lease_expiry,
        verify_settle = s.verify_settle, max_attempts = s.max_attempts,
        require_fingerprint = s.require_fingerprint, hash_keys = s.hash_keys,
        store_params = s.store_params, audit = s.audit, allowed_role = s.allowed_role,
        owner = s.owner, environment = s.environment, description = s.description,
        durability = s.durability, updated_at = s.updated_at, remember = s.remember,
        fingerprint_ignore = s.fingerprint_ignore, fingerprint_include = s.fingerprint_include,
        review_role = s.review_role
    WHERE sc.name = s.name;
    -- A shorter retention must not leave unfinished work waiting for a sweep that comes too late.
    -- The retention added as the C code adds it (src/clock.c: on the calendar of UTC, whatever
    -- the session's TimeZone), so that the sweep comes at the instant a claim decides with;
    -- immutable, which a cluster distributed by key (Citus) needs in an UPDATE.
    UPDATE idempo.operations AS o
       SET sweep_at = ((o.first_seen_at AT TIME ZONE 'UTC') + s.retention) AT TIME ZONE 'UTC'
    WHERE o.scope = s.name
      AND o.status IN ('in_progress', 'retryable', 'unknown')
      AND o.sweep_at > ((o.first_seen_at AT TIME ZONE 'UTC') + s.retention) AT TIME ZONE 'UTC';
    -- Keys remembered so far are remembered for the new period: a longer one must not let a key
    -- be forgotten (and its action run again) at the old horizon, a shorter one or 0 forgets
    -- them sooner.  A remembered key is a finished row with sweep_at = expires_at + remember;
    -- with 0 it becomes an expired record (sweep_at = expires_at), which claims treat as absent.
    -- compared as written: interval equality says '30 days' = '1 mon', the calendar does not
    IF s.remember::text IS DISTINCT FROM old_remember::text THEN
        UPDATE idempo.operations AS o
           SET sweep_at = ((o.expires_at AT TIME ZONE 'UTC') + s.remember) AT TIME ZONE 'UTC'
         WHERE o.scope = s.name
           AND o.status IN ('succeeded', 'failed')
           AND o.sweep_at > o.expires_at;
    END IF;
    RETURN s;
END
$$;

REVOKE ALL ON FUNCTION idempo.create_scope(text, interval, interval, text, interval, integer, boolean, boolean, boolean, boolean, name, text, text, text, text, interval, text[], text[], name) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.alter_scope(text, interval, interval, text, interval, integer, boolean, boolean, boolean, boolean, name, text, text, text, text, interval, text[], text[], name) FROM PUBLIC;

------------------------------------------------------------------------------------------------
-- Fingerprint rules: idempo.fingerprint(params, ignore)
------------------------------------------------------------------------------------------------

-- The fingerprint of params without the fields named by ignore (dot paths of object keys from the
-- top; arrays are not entered, absent paths are ignored): what a claim computes in a scope with
-- fingerprint_ignore.  NULL ignore ignores nothing.
CREATE FUNCTION idempo.fingerprint(params jsonb, ignore text[]) RETURNS bytea
    AS 'MODULE_PATHNAME', 'idempo_fingerprint_ignoring'
    LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idempo.fingerprint(jsonb, text[]) IS
    'SHA-256 of the canonical encoding of params without the fields named by ignore (scope option fingerprint_ignore).';
-- (revoked first, so that its privileges read as a fresh install's)
REVOKE ALL ON FUNCTION idempo.fingerprint(jsonb, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.fingerprint(jsonb, text[]) TO PUBLIC;

------------------------------------------------------------------------------------------------
-- Remembered keys
------------------------------------------------------------------------------------------------

-- Remembered keys: a claim of one answers 'expired', with the time the action finished.
ALTER TYPE idempo.outcome ADD VALUE 'expired';
ALTER TYPE idempo.claim_result ADD ATTRIBUTE completed_at timestamptz;

-- Releases a remembered key on purpose: a finished record whose result has expired (a claim
-- answers 'expired' for it) is deleted, so that the next claim of the key is 'acquired' and the
-- action runs again.  Recorded as a closed review (reason 'manual', resolution 'released', the
-- reviewer, the note, the row as it was) and, in audited scopes, as an event 'release'.
CREATE FUNCTION idempo.release(scope text, key text, reviewer text DEFAULT NULL, note text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o idempo.operations;
    k text;
    t timestamptz := idempo.now();
    review bigint;
    decided_by text;
BEGIN
    k := idempo.stored_key(release.scope, release.key);   -- refuses an unknown scope or a bad key
    -- the scope's reviewers only; the name recorded is the caller's (src/review_rights.c)
    decided_by := idempo.check_reviewer(release.scope, k, release.reviewer, 'release');
    PERFORM idempo.refuse_on_subscriber(release.scope, k);
    SELECT * INTO o FROM idempo.operations AS x
     WHERE x.scope = release.scope AND x.key = k FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot release key "%" in scope "%": there is no such operation', release.key, release.scope
            USING ERRCODE = '42704', HINT = 'Nothing to release: the next claim of the key acquires it.';
    END IF;
    IF o.status NOT IN ('succeeded', 'failed') OR o.expires_at > t THEN
        RAISE EXCEPTION 'cannot release key "%" in scope "%": it is not a remembered key (%)',
            release.key, release.scope,
            CASE WHEN o.status IN ('succeeded', 'failed') THEN o.status || ', its result has not expired yet'
                 ELSE o.status::text END
            USING ERRCODE = '55000',
                  HINT = 'Only a finished record whose result has expired can be released; put a live record in review with idempo.request_review().';
    END IF;
    INSERT INTO idempo.reviews AS r (scope, key, reason, opened_at, operation, detail, resolved_at,
                                     resolved_by, resolution, note)
    VALUES (o.scope, o.key, 'manual', t, o, 'remembered key released: the action may run again', t,
            decided_by, 'released', release.note)
    RETURNING r.id INTO review;
    DELETE FROM idempo.operations AS x WHERE x.scope = o.scope AND x.key = o.key;
    IF (SELECT s.audit FROM idempo.scopes AS s WHERE s.name = o.scope) THEN
        INSERT INTO idempo.events (at, scope, key, attempt, from_status, action, actor)
        VALUES (t, o.scope, o.key, o.attempt, o.status, 'release',
                CASE WHEN current_setting('role') = 'none' THEN session_user   -- the caller (SET ROLE's)
                     ELSE current_setting('role')::name END);
    END IF;
    RETURN review;
END
$$;
REVOKE ALL ON FUNCTION idempo.release(text, text, text, text) FROM PUBLIC;

-- Rows that break the state machine's invariants (src/idempo.h); empty when all is well.
-- Used by the tests after every fault; cheap enough to run by hand on a live system.
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
            -- an unknown record may carry a verification lease (src/claim.c)
            CASE WHEN o.status NOT IN ('in_progress', 'unknown') AND o.lease_expires_at IS NOT NULL
                 THEN 'lease on a record that is neither in_progress nor unknown' END,
            CASE WHEN o.status IN ('succeeded', 'failed') AND (o.completed_at IS NULL OR o.expires_at IS NULL)
                 THEN 'finished without completed_at/expires_at' END,
            CASE WHEN o.status NOT IN ('succeeded', 'failed') AND o.expires_at IS NOT NULL
                 THEN 'unfinished with expires_at' END,
            CASE WHEN o.status = 'in_review' AND o.sweep_at IS NOT NULL THEN 'in_review but scheduled for the sweep' END,
            CASE WHEN o.status <> 'in_review' AND o.sweep_at IS NULL THEN 'never swept' END,
            -- a finished row swept after its expiry is a remembered key (src/expiry.c): it holds no result
            CASE WHEN o.status IN ('succeeded', 'failed') AND o.sweep_at > o.expires_at
                      AND (o.result IS NOT NULL OR o.params IS NOT NULL OR o.error IS NOT NULL OR o.run_id IS NOT NULL)
                 THEN 'swept after expiry, still holding its result' END,
            -- TimeZone is UTC here: + adds on the UTC calendar, as src/clock.c does
            CASE WHEN o.status IN ('in_progress', 'retryable', 'unknown') AND s.name IS NOT NULL
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

-- The top-level fields whose values differ between two parameter documents (store_params scopes).
-- STRICT: without one side (a conflict with a remembered key, whose params are gone) nothing is
-- listed, rather than a made-up field.
CREATE OR REPLACE FUNCTION idempo.params_diff(stored jsonb, incoming jsonb)
    RETURNS TABLE (field text, stored_value jsonb, incoming_value jsonb)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT COALESCE(s.key, i.key), s.value, i.value
    FROM jsonb_each(CASE WHEN jsonb_typeof(stored) = 'object' THEN stored ELSE jsonb_build_object('', stored) END) s
    FULL JOIN jsonb_each(CASE WHEN jsonb_typeof(incoming) = 'object' THEN incoming ELSE jsonb_build_object('', incoming) END) i
           ON i.key = s.key
    WHERE s.value IS DISTINCT FROM i.value
    ORDER BY 1
$$;

------------------------------------------------------------------------------------------------
-- The SQL API the client libraries need: idempo.version(), claim(..., lease)
------------------------------------------------------------------------------------------------

CREATE FUNCTION idempo.version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '0.3.0'::text $$;
COMMENT ON FUNCTION idempo.version() IS 'The version of idempo''s installed SQL objects.';
REVOKE ALL ON FUNCTION idempo.version() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.version() TO PUBLIC;

-- claim() gains lease (the lease this claim takes instead of the scope's) and verify_unknown
-- (false: a caller that cannot verify an unknown outcome leaves the verification lease free), so
-- it is dropped and created again; an EXECUTE right granted on it was named with create_scope()'s above.
DROP FUNCTION idempo.claim(text, text, jsonb, bytea, text, timestamptz, boolean, boolean);
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
    AS 'MODULE_PATHNAME', 'idempo_claim'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION idempo.claim(text, text, jsonb, bytea, text, timestamptz, boolean, boolean, interval, boolean) FROM PUBLIC;

-- heartbeat(): a running attempt extends its lease (src/heartbeat.c)
-- Extends the lease of the running attempt (in_progress, its lease not yet run out) to now + extend
-- (NULL: the scope's lease), never shortening it; returns the lease it holds now (src/heartbeat.c).
CREATE FUNCTION idempo.heartbeat(
    scope   text,
    key     text,
    attempt integer,
    extend  interval DEFAULT NULL)
    RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'idempo_heartbeat'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;
REVOKE ALL ON FUNCTION idempo.heartbeat(text, text, integer, interval) FROM PUBLIC;

-- The fingerprint of params projected onto the fields named by include (paths that may enter
-- arrays: items[*].sku), without those named by ignore: what a claim computes in a scope with
-- fingerprint_include and fingerprint_ignore.  NULL lists: no such rule.
CREATE FUNCTION idempo.fingerprint(params jsonb, ignore text[], include text[]) RETURNS bytea
    AS 'MODULE_PATHNAME', 'idempo_fingerprint_rules'
    LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idempo.fingerprint(jsonb, text[], text[]) IS
    'SHA-256 of the canonical encoding of params with only the fields named by include, without those named by ignore (scope options fingerprint_include, fingerprint_ignore).';
REVOKE ALL ON FUNCTION idempo.fingerprint(jsonb, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.fingerprint(jsonb, text[], text[]) TO PUBLIC;

------------------------------------------------------------------------------------------------
-- Batches: many keys of one scope in one call, one answer per element (src/claim_batch.c)
------------------------------------------------------------------------------------------------

-- Each element is decided by claim() itself, in the order of the stored keys (overlapping batches
-- never deadlock); the rows come back in input order.  duplicate_of: the position of the first
-- occurrence of a key given again.
CREATE FUNCTION idempo.claim_batch(
    scope              text,
    keys               text[],
    params             jsonb[]       DEFAULT NULL,
    run_id             text          DEFAULT NULL,
    intent_at          timestamptz[] DEFAULT NULL,
    wait               boolean       DEFAULT true,
    complete_on_commit boolean       DEFAULT false)
    RETURNS TABLE (
        "position"       integer,
        key              text,
        duplicate_of     integer,
        outcome          idempo.outcome,
        status           idempo.status,
        attempt          integer,
        result           jsonb,
        target_ref       text,
        error            text,
        first_seen_at    timestamptz,
        lease_expires_at timestamptz,
        conflict_id      bigint,
        review_id        bigint,
        completed_at     timestamptz)
    AS 'MODULE_PATHNAME', 'idempo_claim_batch'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

CREATE FUNCTION idempo.complete_batch(
    scope       text,
    keys        text[],
    attempts    integer[] DEFAULT NULL,
    results     jsonb[]   DEFAULT NULL,
    target_refs text[]    DEFAULT NULL)
    RETURNS TABLE ("position" integer, key text, status idempo.status)
    AS 'MODULE_PATHNAME', 'idempo_complete_batch'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

CREATE FUNCTION idempo.fail_batch(
    scope     text,
    keys      text[],
    attempts  integer[] DEFAULT NULL,
    errors    text[]    DEFAULT NULL,
    retryable boolean   DEFAULT true)
    RETURNS TABLE ("position" integer, key text, status idempo.status)
    AS 'MODULE_PATHNAME', 'idempo_fail_batch'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;

REVOKE ALL ON FUNCTION idempo.claim_batch(text, text[], jsonb[], text, timestamptz[], boolean, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.complete_batch(text, text[], integer[], jsonb[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.fail_batch(text, text[], integer[], text[], boolean) FROM PUBLIC;

------------------------------------------------------------------------------------------------
-- verify()'s settle window counts from the end of the attempt's lease (src/expiry.c,
-- op_row_make_unknown)
------------------------------------------------------------------------------------------------

-- An attempt made unknown by the library of 0.1.0/0.2.0 kept the claim's time in last_attempt_at,
-- though it could send its request until its lease ended: verify(found => false) would free the
-- key while a request sent late under the lease may still land.  Its lease was the scope's, taken
-- at the claim (0.2.0 had neither claim(lease =>) nor heartbeat(), and its unknown records hold no
-- verification lease): last_attempt_at becomes that end.  0.1.0/0.2.0 measured the lease as a
-- fixed length (a month 30 days, src/clock.c of 0.2.0) and 0.3.0 on the UTC calendar (src/clock.c
-- now): the later of the two, so that a lease written in months, which ends up to two days later
-- as 0.2.0 counted it (January 31 + 1 month), is not cut short.  Never moved backwards: a record
-- the library of 0.3.0 made unknown while these were still the old objects holds its lease's end
-- already, and only gets a later, safer window.
--
-- Not where idempo.operations is a logical replication subscriber's copy (src/replication.c):
-- its rows are the publisher's, moved by the publisher's own update and replicated here; moving
-- them here as well would move them twice if the publisher was updated first.  Rows the
-- publisher's update never reaches keep the claim's time (a window up to a lease early): a
-- migration target whose old server is retired without the update, or a subscription dropped
-- before the move arrived.  The update cannot tell, so it says so (the DO block below).
UPDATE idempo.operations AS o
   SET last_attempt_at = GREATEST(o.last_attempt_at,
                                  ((o.last_attempt_at AT TIME ZONE 'UTC') OPERATOR(pg_catalog.+) s.lease)
                                  AT TIME ZONE 'UTC',
                                  ((o.last_attempt_at AT TIME ZONE 'UTC')
                                   OPERATOR(pg_catalog.+) (s.lease OPERATOR(pg_catalog.-) l.months)
                                   OPERATOR(pg_catalog.+) l.months_as_days)
                                  AT TIME ZONE 'UTC')
  FROM idempo.scopes AS s,
       LATERAL (SELECT pg_catalog.make_interval(months => m.n) AS months,
                       pg_catalog.make_interval(days => 30 OPERATOR(pg_catalog.*) m.n) AS months_as_days
                FROM (SELECT (pg_catalog.date_part('year', s.lease) OPERATOR(pg_catalog.*) 12
                              OPERATOR(pg_catalog.+) pg_catalog.date_part('month', s.lease))::integer AS n) AS m) AS l
 WHERE s.name OPERATOR(pg_catalog.=) o.scope
   AND o.status OPERATOR(pg_catalog.=) 'unknown'
   AND NOT EXISTS (SELECT FROM pg_catalog.pg_subscription_rel AS sr
                   WHERE sr.srrelid OPERATOR(pg_catalog.=) 'idempo.operations'::pg_catalog.regclass);

DO $$
DECLARE
    sub name;
    n bigint;
BEGIN
    SELECT su.subname INTO sub
      FROM pg_catalog.pg_subscription_rel AS sr
      JOIN pg_catalog.pg_subscription AS su ON su.oid OPERATOR(pg_catalog.=) sr.srsubid
     WHERE sr.srrelid OPERATOR(pg_catalog.=) 'idempo.operations'::pg_catalog.regclass
     ORDER BY su.subname LIMIT 1;
    IF sub IS NULL THEN
        RETURN;
    END IF;
    SELECT pg_catalog.count(*) INTO n FROM idempo.operations AS o
     WHERE o.status OPERATOR(pg_catalog.=) 'unknown';
    IF n OPERATOR(pg_catalog.>) 0 THEN
        RAISE WARNING 'the update left last_attempt_at of % unknown operation% as the publisher sends it: database "%" receives idempo.operations from subscription "%"',
            n, CASE WHEN n OPERATOR(pg_catalog.=) 1 THEN '' ELSE 's' END, pg_catalog.current_database(), sub
            USING DETAIL = 'The publisher''s own update to 0.3.0 moves it to the end of the attempt''s lease, where verify()''s settle window now starts, and replicates the move here. A row the publisher''s update never reaches keeps the claim''s time: a window up to a lease too early.',
                  HINT = 'Update the publisher too, and keep this subscription until the publisher''s update has arrived. A database that stops subscribing first (a migration target whose old server is retired) must move the rows itself: see "Logical replication" in docs/upgrading.md.';
    END IF;
END
$$;

-- resolve's reviewer may be left out: the caller is recorded (src/review_rights.c)
CREATE OR REPLACE FUNCTION idempo.resolve(
    scope      text,
    key        text,
    resolution text,
    reviewer   text  DEFAULT NULL,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL,
    note       text  DEFAULT NULL)
    RETURNS idempo.status
    AS 'MODULE_PATHNAME', 'idempo_resolve'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- A reviewer's window on the records: the operations and audit events of the scopes the
-- current role may review (idempo.may_review), for the review console and people's own SQL.
CREATE VIEW idempo.reviewable_operations WITH (security_barrier) AS
SELECT o.scope, o.key, o.fingerprint, o.status, o.attempt, o.run_id, o.first_seen_at,
       o.last_attempt_at, o.lease_expires_at, o.completed_at, o.expires_at, o.sweep_at, o.result,
       o.target_ref, o.error, o.params, o.attempt_base
FROM idempo.operations o
WHERE o.scope OPERATOR(pg_catalog.=) ANY (SELECT s.name FROM idempo.scopes s WHERE idempo.may_review(s.review_role, s.allowed_role));
COMMENT ON VIEW idempo.reviewable_operations IS
    'The operations of the scopes the current role may review.';

CREATE VIEW idempo.reviewable_events WITH (security_barrier) AS
SELECT e.id, e.at, e.scope, e.key, e.run_id, e.attempt, e.from_status, e.to_status, e.outcome,
       e.action, e.actor
FROM idempo.events e
WHERE e.scope OPERATOR(pg_catalog.=) ANY (SELECT s.name FROM idempo.scopes s WHERE idempo.may_review(s.review_role, s.allowed_role));
COMMENT ON VIEW idempo.reviewable_events IS
    'The audit events of the scopes the current role may review.';

-- the queues show only the scopes the reading role reviews (after review_role exists)
CREATE OR REPLACE VIEW idempo.review_queue WITH (security_barrier) AS
SELECT r.id, r.scope, r.key, r.reason, r.opened_at,
       GREATEST(idempo.now() OPERATOR(pg_catalog.-) r.opened_at, '0'::interval) AS waiting,
       o.status, o.attempt, o.run_id, o.first_seen_at, o.last_attempt_at, o.target_ref,
       r.detail, pg_catalog.to_jsonb(r.operation) AS snapshot
FROM idempo.reviews r
LEFT JOIN idempo.operations o
       ON o.scope OPERATOR(pg_catalog.=) r.scope AND o.key OPERATOR(pg_catalog.=) r.key
WHERE r.resolved_at IS NULL
  AND r.scope OPERATOR(pg_catalog.=) ANY (SELECT s.name FROM idempo.scopes s WHERE idempo.may_review(s.review_role, s.allowed_role))
ORDER BY r.opened_at, r.id;

CREATE OR REPLACE VIEW idempo.conflict_queue WITH (security_barrier) AS
SELECT c.id, c.scope, c.key, c.occurrences, c.first_detected_at, c.last_detected_at,
       GREATEST(idempo.now() OPERATOR(pg_catalog.-) c.first_detected_at, '0'::interval) AS waiting, c.run_id,
       o.status AS stored_status, o.target_ref AS stored_target_ref,
       (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('field', d.field,
                   'stored', d.stored_value, 'incoming', d.incoming_value) ORDER BY d.field)
          FROM idempo.params_diff(c.stored_params, c.incoming_params) d) AS changed_fields,
       c.stored_params, c.incoming_params
FROM idempo.conflicts c
LEFT JOIN idempo.operations o
       ON o.scope OPERATOR(pg_catalog.=) c.scope AND o.key OPERATOR(pg_catalog.=) c.key
WHERE c.resolved_at IS NULL
  AND c.scope OPERATOR(pg_catalog.=) ANY (SELECT s.name FROM idempo.scopes s WHERE idempo.may_review(s.review_role, s.allowed_role))
ORDER BY c.first_detected_at, c.id;

-- stored_key() may read the scope as committed now, which a query in parallel mode may not:
-- RESTRICTED let such a query fail (XX000, "cannot update SecondarySnapshot")
ALTER FUNCTION idempo.stored_key(text, text) PARALLEL UNSAFE;

-- the queues' order (review_queue, conflict_queue): a page of the oldest is an index range
CREATE INDEX reviews_queue_idx ON idempo.reviews (opened_at, id) WHERE resolved_at IS NULL;
CREATE INDEX conflicts_queue_idx ON idempo.conflicts (first_detected_at, id) WHERE resolved_at IS NULL;

-- Operations whose outcome is unknown, the longest in doubt first: the third queue a person
-- works (next to review_queue and conflict_queue), of the scopes the reading role reviews.
-- verifying_until: a verification lease some caller holds (it looks the action up now).
CREATE VIEW idempo.unknown_queue WITH (security_barrier) AS
SELECT o.scope, o.key, o.attempt, o.run_id, o.first_seen_at, o.last_attempt_at,
       GREATEST(idempo.now() OPERATOR(pg_catalog.-) o.last_attempt_at, '0'::interval) AS waiting,
       o.lease_expires_at AS verifying_until
FROM idempo.operations o
WHERE o.status OPERATOR(pg_catalog.=) 'unknown'
  AND o.scope OPERATOR(pg_catalog.=) ANY (SELECT s.name FROM idempo.scopes s WHERE idempo.may_review(s.review_role, s.allowed_role))
ORDER BY o.last_attempt_at, o.scope, o.key;
COMMENT ON VIEW idempo.unknown_queue IS
    'Operations whose outcome is unknown, longest in doubt first, of the scopes the current role may review.';

------------------------------------------------------------------------------------------------
-- What a reviewer reads: functions that filter first (src/review_rights.c's rule)
------------------------------------------------------------------------------------------------

-- The views above are filtered by the reader's role, but a reader's WHERE clause can still run
-- before their filter: a CASE whose test compares the view's columns and whose branch calls a
-- function of the reader's with no column in its arguments counts as leakproof, so PostgreSQL
-- may evaluate it on every scope's rows (row security has the same rule).  A reviewer therefore
-- reads through these functions instead: PL/pgSQL (never inlined into the reader's query), they
-- take the page's conditions as arguments and return only rows of the scopes the caller reviews,
-- so nothing the reader writes runs before the filter.  Each returns the rows of the view it is
-- named after: *_page a page of a queue in the queue's order, *_of the rows of given records.
-- SECURITY DEFINER (the reader needs no right on the tables); the filter answers for the caller,
-- not for the owner the function runs as.

-- May the caller (the role outside SECURITY DEFINER functions) review a scope with these
-- settings?  The filter of the functions below; only idempo's owner executes it.
CREATE FUNCTION idempo.caller_may_review(review_role name, allowed_role name) RETURNS boolean
    AS 'MODULE_PATHNAME', 'idempo_caller_may_review'
    LANGUAGE C STABLE PARALLEL RESTRICTED;

-- The scopes the caller reviews (only the one named, when one is), and of those the ones that
-- keep keys in clear and the ones that keep digests (hash_keys): a key search is a prefix in the
-- first and the whole key, compared by its digest, in the others (the digest is never searched
-- by a prefix: that would be a guess at the key a character at a time).
CREATE FUNCTION idempo.reviewer_scopes(only_scope text, OUT visible text[], OUT clear text[], OUT hashed text[])
    LANGUAGE sql STABLE AS $$
    SELECT COALESCE(pg_catalog.array_agg(s.name), '{}'),
           COALESCE(pg_catalog.array_agg(s.name) FILTER (WHERE NOT s.hash_keys), '{}'),
           COALESCE(pg_catalog.array_agg(s.name) FILTER (WHERE s.hash_keys), '{}')
    FROM idempo.scopes s
    WHERE idempo.caller_may_review(s.review_role, s.allowed_role)
      AND (only_scope IS NULL OR s.name OPERATOR(pg_catalog.=) only_scope)
$$;

-- The forms a key search compares in hash_keys scopes: the text typed and its digest (someone
-- may paste the digest the console shows).
CREATE FUNCTION idempo.key_search_forms(key_search text) RETURNS text[]
    LANGUAGE sql STABLE AS $$
    SELECT ARRAY[key_search,
                 pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(key_search, 'UTF8')), 'hex')]
$$;

-- A page of open reviews, oldest first: the rows of review_queue of the scopes the caller
-- reviews.  scope, reason: only those; key_search: see reviewer_scopes(); older_than: waiting at
-- least that long; after_opened_at, after_id: the previous page's last row (keyset paging);
-- page_size: rows at most (NULL: all).  The query is planned with the values (EXECUTE), so a page
-- is a range of reviews_queue_idx.
CREATE FUNCTION idempo.review_queue_page(
    scope           text        DEFAULT NULL,
    reason          text        DEFAULT NULL,
    key_search      text        DEFAULT NULL,
    older_than      interval    DEFAULT NULL,
    after_opened_at timestamptz DEFAULT NULL,
    after_id        bigint      DEFAULT NULL,
    page_size       integer     DEFAULT 50)
    RETURNS SETOF idempo.review_queue
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 50 AS $$
DECLARE
    v record;
BEGIN
    SELECT * INTO v FROM idempo.reviewer_scopes(review_queue_page.scope);
    RETURN QUERY EXECUTE $q$
        SELECT r.id, r.scope, r.key, r.reason, r.opened_at,
               GREATEST(idempo.now() OPERATOR(pg_catalog.-) r.opened_at, '0'::interval) AS waiting,
               o.status, o.attempt, o.run_id, o.first_seen_at, o.last_attempt_at, o.target_ref,
               r.detail, pg_catalog.to_jsonb(r.operation) AS snapshot
        FROM idempo.reviews r
        LEFT JOIN idempo.operations o
               ON o.scope OPERATOR(pg_catalog.=) r.scope AND o.key OPERATOR(pg_catalog.=) r.key
        WHERE r.resolved_at IS NULL
          AND r.scope OPERATOR(pg_catalog.=) ANY ($1)
          AND ($4::text IS NULL OR r.reason OPERATOR(pg_catalog.=) $4)
          AND ($5::text IS NULL
               OR (r.scope OPERATOR(pg_catalog.=) ANY ($2) AND pg_catalog.starts_with(r.key, $5))
               OR (r.scope OPERATOR(pg_catalog.=) ANY ($3) AND r.key OPERATOR(pg_catalog.=) ANY (idempo.key_search_forms($5))))
          AND ($6::interval IS NULL
               OR GREATEST(idempo.now() OPERATOR(pg_catalog.-) r.opened_at, '0'::interval) OPERATOR(pg_catalog.>=) $6)
          AND ($7::timestamptz IS NULL
               OR (r.opened_at, r.id) OPERATOR(pg_catalog.>) ($7, COALESCE($8, 0)))
        ORDER BY r.opened_at, r.id
        LIMIT $9
    $q$ USING v.visible, v.clear, v.hashed, reason, key_search, older_than, after_opened_at, after_id, page_size;
END
$$;
COMMENT ON FUNCTION idempo.review_queue_page(text, text, text, interval, timestamptz, bigint, integer) IS
    'A page of open reviews of the scopes the caller may review, oldest first (review_queue''s rows).';

-- A page of open conflicts, oldest first (conflict_queue's rows); the arguments as in
-- review_queue_page().  A range of conflicts_queue_idx.
CREATE FUNCTION idempo.conflict_queue_page(
    scope                   text        DEFAULT NULL,
    key_search              text        DEFAULT NULL,
    older_than              interval    DEFAULT NULL,
    after_first_detected_at timestamptz DEFAULT NULL,
    after_id                bigint      DEFAULT NULL,
    page_size               integer     DEFAULT 50)
    RETURNS SETOF idempo.conflict_queue
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 50 AS $$
DECLARE
    v record;
BEGIN
    SELECT * INTO v FROM idempo.reviewer_scopes(conflict_queue_page.scope);
    RETURN QUERY EXECUTE $q$
        SELECT c.id, c.scope, c.key, c.occurrences, c.first_detected_at, c.last_detected_at,
               GREATEST(idempo.now() OPERATOR(pg_catalog.-) c.first_detected_at, '0'::interval) AS waiting, c.run_id,
               o.status AS stored_status, o.target_ref AS stored_target_ref,
               (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('field', d.field,
                           'stored', d.stored_value, 'incoming', d.incoming_value) ORDER BY d.field)
                  FROM idempo.params_diff(c.stored_params, c.incoming_params) d) AS changed_fields,
               c.stored_params, c.incoming_params
        FROM idempo.conflicts c
        LEFT JOIN idempo.operations o
               ON o.scope OPERATOR(pg_catalog.=) c.scope AND o.key OPERATOR(pg_catalog.=) c.key
        WHERE c.resolved_at IS NULL
          AND c.scope OPERATOR(pg_catalog.=) ANY ($1)
          AND ($4::text IS NULL
               OR (c.scope OPERATOR(pg_catalog.=) ANY ($2) AND pg_catalog.starts_with(c.key, $4))
               OR (c.scope OPERATOR(pg_catalog.=) ANY ($3) AND c.key OPERATOR(pg_catalog.=) ANY (idempo.key_search_forms($4))))
          AND ($5::interval IS NULL
               OR GREATEST(idempo.now() OPERATOR(pg_catalog.-) c.first_detected_at, '0'::interval) OPERATOR(pg_catalog.>=) $5)
          AND ($6::timestamptz IS NULL
               OR (c.first_detected_at, c.id) OPERATOR(pg_catalog.>) ($6, COALESCE($7, 0)))
        ORDER BY c.first_detected_at, c.id
        LIMIT $8
    $q$ USING v.visible, v.clear, v.hashed, key_search, older_than, after_first_detected_at, after_id, page_size;
END
$$;
COMMENT ON FUNCTION idempo.conflict_queue_page(text, text, interval, timestamptz, bigint, integer) IS
    'A page of open conflicts of the scopes the caller may review, oldest first (conflict_queue''s rows).';

-- A page of operations whose outcome is unknown, the longest in doubt first (unknown_queue's
-- rows); after_*: the previous page's last row.
CREATE FUNCTION idempo.unknown_queue_page(
    scope                 text        DEFAULT NULL,
    key_search            text        DEFAULT NULL,
    older_than            interval    DEFAULT NULL,
    after_last_attempt_at timestamptz DEFAULT NULL,
    after_scope           text        DEFAULT NULL,
    after_key             text        DEFAULT NULL,
    page_size             integer     DEFAULT 50)
    RETURNS SETOF idempo.unknown_queue
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 50 AS $$
DECLARE
    v record;
BEGIN
    SELECT * INTO v FROM idempo.reviewer_scopes(unknown_queue_page.scope);
    RETURN QUERY EXECUTE $q$
        SELECT o.scope, o.key, o.attempt, o.run_id, o.first_seen_at, o.last_attempt_at,
               GREATEST(idempo.now() OPERATOR(pg_catalog.-) o.last_attempt_at, '0'::interval) AS waiting,
               o.lease_expires_at AS verifying_until
        FROM idempo.operations o
        WHERE o.status OPERATOR(pg_catalog.=) 'unknown'
          AND o.scope OPERATOR(pg_catalog.=) ANY ($1)
          AND ($4::text IS NULL
               OR (o.scope OPERATOR(pg_catalog.=) ANY ($2) AND pg_catalog.starts_with(o.key, $4))
               OR (o.scope OPERATOR(pg_catalog.=) ANY ($3) AND o.key OPERATOR(pg_catalog.=) ANY (idempo.key_search_forms($4))))
          AND ($5::interval IS NULL
               OR GREATEST(idempo.now() OPERATOR(pg_catalog.-) o.last_attempt_at, '0'::interval) OPERATOR(pg_catalog.>=) $5)
          AND ($6::timestamptz IS NULL
               OR (o.last_attempt_at, o.scope, o.key) OPERATOR(pg_catalog.>) ($6, COALESCE($7, ''), COALESCE($8, '')))
        ORDER BY o.last_attempt_at, o.scope, o.key
        LIMIT $9
    $q$ USING v.visible, v.clear, v.hashed, key_search, older_than, after_last_attempt_at, after_scope, after_key,
              page_size;
END
$$;
COMMENT ON FUNCTION idempo.unknown_queue_page(text, text, interval, timestamptz, text, text, integer) IS
    'A page of unknown operations of the scopes the caller may review, longest in doubt first (unknown_queue''s rows).';

-- The records (scopes[i], keys[i]) of the scopes the caller reviews: their operations, their open
-- reviews, their open conflicts.  Keys as stored (the digest in hash_keys scopes).  The pairs of
-- other scopes are dropped before any lookup (not even their time tells); each other pair is a
-- primary key or open-index lookup.
CREATE FUNCTION idempo.reviewable_operations_of(scopes text[], keys text[])
    RETURNS SETOF idempo.reviewable_operations
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 10 AS $$
DECLARE
    visible text[] := (idempo.reviewer_scopes(NULL)).visible;
BEGIN
    RETURN QUERY
        SELECT o.scope, o.key, o.fingerprint, o.status, o.attempt, o.run_id, o.first_seen_at,
               o.last_attempt_at, o.lease_expires_at, o.completed_at, o.expires_at, o.sweep_at, o.result,
               o.target_ref, o.error, o.params, o.attempt_base
        FROM (SELECT DISTINCT p.s, p.k FROM ROWS FROM (pg_catalog.unnest(scopes), pg_catalog.unnest(keys)) AS p(s, k)
              WHERE p.s OPERATOR(pg_catalog.=) ANY (visible)) p
        JOIN idempo.operations o ON o.scope OPERATOR(pg_catalog.=) p.s AND o.key OPERATOR(pg_catalog.=) p.k;
END
$$;
COMMENT ON FUNCTION idempo.reviewable_operations_of(text[], text[]) IS
    'The operations (scopes[i], keys[i]) of the scopes the caller may review.';

CREATE FUNCTION idempo.open_reviews_of(scopes text[], keys text[])
    RETURNS SETOF idempo.review_queue
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 10 AS $$
DECLARE
    visible text[] := (idempo.reviewer_scopes(NULL)).visible;
BEGIN
    RETURN QUERY
        SELECT r.id, r.scope, r.key, r.reason, r.opened_at,
               GREATEST(idempo.now() OPERATOR(pg_catalog.-) r.opened_at, '0'::interval) AS waiting,
               o.status, o.attempt, o.run_id, o.first_seen_at, o.last_attempt_at, o.target_ref,
               r.detail, pg_catalog.to_jsonb(r.operation) AS snapshot
        FROM (SELECT DISTINCT p.s, p.k FROM ROWS FROM (pg_catalog.unnest(scopes), pg_catalog.unnest(keys)) AS p(s, k)
              WHERE p.s OPERATOR(pg_catalog.=) ANY (visible)) p
        JOIN idempo.reviews r ON r.scope OPERATOR(pg_catalog.=) p.s AND r.key OPERATOR(pg_catalog.=) p.k
        LEFT JOIN idempo.operations o
               ON o.scope OPERATOR(pg_catalog.=) r.scope AND o.key OPERATOR(pg_catalog.=) r.key
        WHERE r.resolved_at IS NULL
        ORDER BY r.opened_at, r.id;
END
$$;
COMMENT ON FUNCTION idempo.open_reviews_of(text[], text[]) IS
    'The open reviews of the records (scopes[i], keys[i]) of the scopes the caller may review (review_queue''s rows).';

CREATE FUNCTION idempo.open_conflicts_of(scopes text[], keys text[])
    RETURNS SETOF idempo.conflict_queue
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 10 AS $$
DECLARE
    visible text[] := (idempo.reviewer_scopes(NULL)).visible;
BEGIN
    RETURN QUERY
        SELECT c.id, c.scope, c.key, c.occurrences, c.first_detected_at, c.last_detected_at,
               GREATEST(idempo.now() OPERATOR(pg_catalog.-) c.first_detected_at, '0'::interval) AS waiting, c.run_id,
               o.status AS stored_status, o.target_ref AS stored_target_ref,
               (SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('field', d.field,
                           'stored', d.stored_value, 'incoming', d.incoming_value) ORDER BY d.field)
                  FROM idempo.params_diff(c.stored_params, c.incoming_params) d) AS changed_fields,
               c.stored_params, c.incoming_params
        FROM (SELECT DISTINCT p.s, p.k FROM ROWS FROM (pg_catalog.unnest(scopes), pg_catalog.unnest(keys)) AS p(s, k)
              WHERE p.s OPERATOR(pg_catalog.=) ANY (visible)) p
        JOIN idempo.conflicts c ON c.scope OPERATOR(pg_catalog.=) p.s AND c.key OPERATOR(pg_catalog.=) p.k
        LEFT JOIN idempo.operations o
               ON o.scope OPERATOR(pg_catalog.=) c.scope AND o.key OPERATOR(pg_catalog.=) c.key
        WHERE c.resolved_at IS NULL
        ORDER BY c.id;
END
$$;
COMMENT ON FUNCTION idempo.open_conflicts_of(text[], text[]) IS
    'The open conflicts of the records (scopes[i], keys[i]) of the scopes the caller may review (conflict_queue''s rows).';

-- The audit events of one record (key as stored), in order, if the caller reviews its scope.
CREATE FUNCTION idempo.reviewable_events_of(scope text, key text)
    RETURNS SETOF idempo.reviewable_events
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 20 AS $$
DECLARE
    visible text[] := (idempo.reviewer_scopes(reviewable_events_of.scope)).visible;
BEGIN
    RETURN QUERY
        SELECT e.id, e.at, e.scope, e.key, e.run_id, e.attempt, e.from_status, e.to_status, e.outcome,
               e.action, e.actor
        FROM idempo.events e
        WHERE e.scope OPERATOR(pg_catalog.=) reviewable_events_of.scope
          AND e.key OPERATOR(pg_catalog.=) reviewable_events_of.key
          AND e.scope OPERATOR(pg_catalog.=) ANY (visible)
        ORDER BY e.id;
END
$$;
COMMENT ON FUNCTION idempo.reviewable_events_of(text, text) IS
    'The audit events of one record of a scope the caller may review, in order.';

-- The audit events since a time, of the scopes the caller reviews (what a day's activity is
-- counted from; a BRIN range of events_at_idx).
CREATE FUNCTION idempo.reviewable_events_since(since timestamptz)
    RETURNS SETOF idempo.reviewable_events
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp ROWS 1000 AS $$
DECLARE
    visible text[] := (idempo.reviewer_scopes(NULL)).visible;
BEGIN
    RETURN QUERY
        SELECT e.id, e.at, e.scope, e.key, e.run_id, e.attempt, e.from_status, e.to_status, e.outcome,
               e.action, e.actor
        FROM idempo.events e
        WHERE e.at OPERATOR(pg_catalog.>=) since
          AND e.scope OPERATOR(pg_catalog.=) ANY (visible);
END
$$;
COMMENT ON FUNCTION idempo.reviewable_events_since(timestamptz) IS
    'The audit events at or after since, of the scopes the caller may review.';

REVOKE ALL ON FUNCTION idempo.caller_may_review(name, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.reviewer_scopes(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.key_search_forms(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.review_queue_page(text, text, text, interval, timestamptz, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.conflict_queue_page(text, text, interval, timestamptz, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.unknown_queue_page(text, text, interval, timestamptz, text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.reviewable_operations_of(text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.open_reviews_of(text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.open_conflicts_of(text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.reviewable_events_of(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idempo.reviewable_events_since(timestamptz) FROM PUBLIC;
