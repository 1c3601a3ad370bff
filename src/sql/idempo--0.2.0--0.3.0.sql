-- idempo 0.2.0 -> 0.3.0.
-- Released install scripts are frozen: every schema change after a release goes into the next
-- version's install script AND into an upgrade script like this one, so that ALTER EXTENSION
-- idempo UPDATE leaves a database with exactly the objects of a fresh install (test/upgrade/run
-- compares the two).  Same rules as the install script: every object schema-qualified,
-- operators written OPERATOR(pg_catalog.x).

\echo Use "ALTER EXTENSION idempo UPDATE" to load this file. \quit

-- verify() names the attempt its lookup was made for and is refused for any other (a lookup made
-- while attempt N was in doubt says nothing about attempt N+1).  The old form stays, refusing with
-- a hint.  Roles granted EXECUTE on the old form need a GRANT on the new one (README, Upgrades).
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
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'succeeded') AS succeeded,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'failed') AS failed,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'retryable') AS retryable,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'unknown') AS unknown,
           pg_catalog.count(*) FILTER (WHERE o.status OPERATOR(pg_catalog.=) 'in_review') AS in_review
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
       COALESCE(cons.open_conflicts, 0) AS open_conflicts
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
    -- where the records come from a publisher (logical replication), only the publisher resolves
    PERFORM idempo.refuse_on_subscriber(c.scope, c.key);
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

------------------------------------------------------------------------------------------------
-- DROP EXTENSION idempo is refused while records exist (src/drop_guard.c)
------------------------------------------------------------------------------------------------

CREATE FUNCTION idempo.drop_guard() RETURNS event_trigger
    AS 'MODULE_PATHNAME', 'idempo_drop_guard'
    LANGUAGE C;
CREATE EVENT TRIGGER idempo_drop_guard ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION idempo.drop_guard();
ALTER EVENT TRIGGER idempo_drop_guard ENABLE ALWAYS;
REVOKE ALL ON FUNCTION idempo.drop_guard() FROM PUBLIC;
