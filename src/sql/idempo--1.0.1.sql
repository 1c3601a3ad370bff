-- idempo: the same business action happens once.
-- Every object is schema-qualified; operators are written OPERATOR(pg_catalog.x) wherever a hostile
-- search_path could otherwise choose another one.  Functions that run as the extension owner are
-- SECURITY DEFINER with SET search_path = pg_catalog, pg_temp.

\echo Use "CREATE EXTENSION idempo" to load this file. \quit

------------------------------------------------------------------------------------------------
-- Types
------------------------------------------------------------------------------------------------

-- The order of the labels is part of the C code (src/idempo.h): append only.
CREATE TYPE idempo.status AS ENUM
    ('in_progress', 'succeeded', 'failed', 'retryable', 'unknown', 'in_review');

CREATE TYPE idempo.outcome AS ENUM
    ('acquired', 'replay', 'busy', 'conflict', 'unknown', 'in_review', 'stale', 'expired');

CREATE TYPE idempo.claim_result AS (
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
    completed_at     timestamptz
);

------------------------------------------------------------------------------------------------
-- Tables.  Per-key tables (operations, conflicts, reviews, events) have every unique constraint
-- include "key" so that they can be distributed by key (Citus); no volatile defaults are needed by
-- the C code, which passes every timestamp as a parameter.
------------------------------------------------------------------------------------------------

CREATE TABLE idempo.scopes (
    name                text        NOT NULL PRIMARY KEY,
    retention           interval    NOT NULL DEFAULT '24 hours',
    lease               interval    NOT NULL DEFAULT '5 minutes',
    on_lease_expiry     text        NOT NULL DEFAULT 'unknown',
    verify_settle       interval    NOT NULL DEFAULT '1 minute',
    max_attempts        integer,
    require_fingerprint boolean     NOT NULL DEFAULT false,
    hash_keys           boolean     NOT NULL DEFAULT false,
    store_params        boolean     NOT NULL DEFAULT false,
    audit               boolean     NOT NULL DEFAULT false,
    allowed_role        name,
    owner               text,
    environment         text,
    description         text,
    enabled             boolean     NOT NULL DEFAULT true,
    created_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at          timestamptz NOT NULL DEFAULT pg_catalog.now(),
    durability          text        NOT NULL DEFAULT 'local'
        CONSTRAINT scopes_durability_check CHECK (durability IN ('local', 'replicated')),
    remember            interval    NOT NULL DEFAULT '0',
    fingerprint_ignore  text[]      NOT NULL DEFAULT '{}',
    fingerprint_include text[]      NOT NULL DEFAULT '{}',
    review_role         name,
    CONSTRAINT scopes_name_check CHECK (name OPERATOR(pg_catalog.<>) ''
        AND pg_catalog.octet_length(name) OPERATOR(pg_catalog.<=) 128),
    CONSTRAINT scopes_on_lease_expiry_check CHECK (on_lease_expiry IN ('unknown', 'retry')),
    CONSTRAINT scopes_max_attempts_check CHECK (max_attempts OPERATOR(pg_catalog.>) 0),
    CONSTRAINT scopes_timing_check CHECK (
        lease OPERATOR(pg_catalog.>) '0'::interval
        AND verify_settle OPERATOR(pg_catalog.>) '0'::interval
        AND lease OPERATOR(pg_catalog.<) retention
        AND verify_settle OPERATOR(pg_catalog.<) retention),
    CONSTRAINT scopes_remember_check CHECK (remember OPERATOR(pg_catalog.>=) '0'::interval)
);
COMMENT ON TABLE idempo.scopes IS 'One row per kind of business action, with its policy and timings.';
COMMENT ON COLUMN idempo.scopes.remember IS
    'How long a finished record is remembered (key, fingerprint, status, target_ref) after its result expires; 0: purged at expires_at.';
COMMENT ON COLUMN idempo.scopes.fingerprint_ignore IS
    'Dot paths of object keys left out of the fingerprint (arrays are not entered); fixed while the scope has operations.';
COMMENT ON COLUMN idempo.scopes.fingerprint_include IS
    'Paths of the only fields that count in the fingerprint (items[*].sku enters arrays); empty: every field; fixed while the scope has operations.';
COMMENT ON COLUMN idempo.scopes.review_role IS
    'Whose members review the scope''s records (resolve, conflicts, release); NULL: allowed_role''s members, or anyone when that is NULL too.';

-- sweep_at is the earliest time at which the sweep has something to do with the row (NULL: never,
-- i.e. in_review).  It may be early, never late: the sweep re-reads the row and, if nothing is due
-- yet, moves sweep_at forward.  This lets complete/fail leave it alone, so that their UPDATE changes
-- no indexed column and can be a HOT update.
CREATE TABLE idempo.operations (
    scope            text          NOT NULL,
    key              text          NOT NULL,
    fingerprint      bytea,
    status           idempo.status NOT NULL,
    attempt          integer       NOT NULL,
    run_id           text,
    first_seen_at    timestamptz   NOT NULL,
    last_attempt_at  timestamptz   NOT NULL,
    lease_expires_at timestamptz,
    completed_at     timestamptz,
    expires_at       timestamptz,
    sweep_at         timestamptz,
    result           jsonb,
    target_ref       text,
    error            text,
    params           jsonb,
    attempt_base     integer       NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, key)
) WITH (fillfactor = 90);
CREATE INDEX operations_sweep_at_idx ON idempo.operations (sweep_at)
    WHERE sweep_at IS NOT NULL;
COMMENT ON TABLE idempo.operations IS 'The processing record of every business action, by scope and key.';
COMMENT ON COLUMN idempo.operations.sweep_at IS
    'Earliest time the sweep has work on this row (never later than that; NULL: in review).';
COMMENT ON COLUMN idempo.operations.attempt_base IS
    'Attempts up to this one do not count against max_attempts (a reviewer granted new ones).';

CREATE SEQUENCE idempo.conflicts_id_seq;
CREATE TABLE idempo.conflicts (
    id                   bigint      NOT NULL DEFAULT pg_catalog.nextval('idempo.conflicts_id_seq'),
    scope                text        NOT NULL,
    key                  text        NOT NULL,
    stored_fingerprint   bytea       NOT NULL,
    incoming_fingerprint bytea       NOT NULL,
    stored_params        jsonb,
    incoming_params      jsonb,
    run_id               text,
    first_detected_at    timestamptz NOT NULL,
    last_detected_at     timestamptz NOT NULL,
    occurrences          bigint      NOT NULL DEFAULT 1,
    resolved_at          timestamptz,
    resolved_by          text,
    resolution           text,
    note                 text,
    PRIMARY KEY (id, key)
);
ALTER SEQUENCE idempo.conflicts_id_seq OWNED BY idempo.conflicts.id;
-- Repeats of one incoming request against one stored request are counted on the open row, not
-- duplicated.  (The stored fingerprint is part of it: a later lifetime of the key, with another
-- stored request, is another conflict, with its own stored parameters.)
CREATE UNIQUE INDEX conflicts_open_idx
    ON idempo.conflicts (scope, key, stored_fingerprint, incoming_fingerprint)
    WHERE resolved_at IS NULL;
CREATE INDEX conflicts_queue_idx ON idempo.conflicts (first_detected_at, id) WHERE resolved_at IS NULL;
COMMENT ON TABLE idempo.conflicts IS 'Requests that reused a key with different parameters.';

CREATE SEQUENCE idempo.reviews_id_seq;
CREATE TABLE idempo.reviews (
    id          bigint      NOT NULL DEFAULT pg_catalog.nextval('idempo.reviews_id_seq'),
    scope       text        NOT NULL,
    key         text        NOT NULL,
    reason      text        NOT NULL,
    opened_at   timestamptz NOT NULL,
    operation   idempo.operations,    -- the row when it entered review (cheap to copy; JSON in review_queue)
    detail      text,
    resolved_at timestamptz,
    resolved_by text,
    resolution  text,
    note        text,
    PRIMARY KEY (id, key),
    CONSTRAINT reviews_reason_check
        CHECK (reason IN ('retention_expired', 'stale_retry', 'attempts_exhausted', 'manual'))
);
ALTER SEQUENCE idempo.reviews_id_seq OWNED BY idempo.reviews.id;
-- At most one open review per operation.
CREATE UNIQUE INDEX reviews_open_idx ON idempo.reviews (scope, key) WHERE resolved_at IS NULL;
-- the queues' order (review_queue, conflict_queue): a page of the oldest is an index range
CREATE INDEX reviews_queue_idx ON idempo.reviews (opened_at, id) WHERE resolved_at IS NULL;
COMMENT ON TABLE idempo.reviews IS 'Operations a person must decide on, with a snapshot taken when they entered review.';

CREATE SEQUENCE idempo.events_id_seq;
CREATE TABLE idempo.events (
    id          bigint        NOT NULL DEFAULT pg_catalog.nextval('idempo.events_id_seq'),
    at          timestamptz   NOT NULL,
    scope       text          NOT NULL,
    key         text          NOT NULL,
    run_id      text,
    attempt     integer,
    from_status idempo.status,
    to_status   idempo.status,
    outcome     idempo.outcome,
    action      text          NOT NULL,
    actor       name          NOT NULL,
    PRIMARY KEY (id, key)
);
ALTER SEQUENCE idempo.events_id_seq OWNED BY idempo.events.id;
CREATE INDEX events_scope_key_idx ON idempo.events (scope, key, id);
-- what happened when (the review console's days): rows arrive in time order, so a BRIN index
-- of a few pages finds a day's rows and costs an insert next to nothing
CREATE INDEX events_at_idx ON idempo.events USING brin (at);
COMMENT ON TABLE idempo.events IS 'Audit log of claim outcomes and transitions in scopes with audit = true.';

-- pg_dump keeps the rows of extension tables only when told to.
SELECT pg_catalog.pg_extension_config_dump('idempo.scopes', '');
SELECT pg_catalog.pg_extension_config_dump('idempo.operations', '');
SELECT pg_catalog.pg_extension_config_dump('idempo.conflicts', '');
SELECT pg_catalog.pg_extension_config_dump('idempo.conflicts_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idempo.reviews', '');
SELECT pg_catalog.pg_extension_config_dump('idempo.reviews_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idempo.events', '');
SELECT pg_catalog.pg_extension_config_dump('idempo.events_id_seq', '');

------------------------------------------------------------------------------------------------
-- The claim path (C).  These run their SQL as the extension owner; callers need EXECUTE only.
------------------------------------------------------------------------------------------------

CREATE FUNCTION idempo.fingerprint(params jsonb) RETURNS bytea
    AS 'MODULE_PATHNAME', 'idempo_fingerprint'
    LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION idempo.fingerprint(jsonb) IS
    'SHA-256 of the canonical encoding of params (key order, whitespace and numeric scale do not matter).';
-- The fingerprint of params without the fields named by ignore (dot paths of object keys from the
-- top; arrays are not entered, absent paths are ignored): what a claim computes in a scope with
-- fingerprint_ignore.  NULL ignore ignores nothing.
CREATE FUNCTION idempo.fingerprint(params jsonb, ignore text[]) RETURNS bytea
    AS 'MODULE_PATHNAME', 'idempo_fingerprint_ignoring'
    LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idempo.fingerprint(jsonb, text[]) IS
    'SHA-256 of the canonical encoding of params without the fields named by ignore (scope option fingerprint_ignore).';
-- The fingerprint of params projected onto the fields named by include (paths that may enter
-- arrays: items[*].sku), without those named by ignore: what a claim computes in a scope with
-- fingerprint_include and fingerprint_ignore.  NULL lists: no such rule.
CREATE FUNCTION idempo.fingerprint(params jsonb, ignore text[], include text[]) RETURNS bytea
    AS 'MODULE_PATHNAME', 'idempo_fingerprint_rules'
    LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION idempo.fingerprint(jsonb, text[], text[]) IS
    'SHA-256 of the canonical encoding of params with only the fields named by include, without those named by ignore (scope options fingerprint_include, fingerprint_ignore).';

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

-- The version of the installed SQL objects (the same on the managed edition, which is no
-- extension): what the client libraries check once at first use (ALTER EXTENSION UPDATE changes it).
CREATE FUNCTION idempo.version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '1.0.1'::text $$;
COMMENT ON FUNCTION idempo.version() IS 'The version of idempo''s installed SQL objects.';

CREATE FUNCTION idempo.complete(
    scope      text,
    key        text,
    attempt    integer DEFAULT NULL,
    result     jsonb   DEFAULT NULL,
    target_ref text    DEFAULT NULL)
    RETURNS idempo.status
    AS 'MODULE_PATHNAME', 'idempo_complete'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION idempo.fail(
    scope     text,
    key       text,
    attempt   integer DEFAULT NULL,
    error     text    DEFAULT NULL,
    retryable boolean DEFAULT true)
    RETURNS idempo.status
    AS 'MODULE_PATHNAME', 'idempo_fail'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

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

CREATE FUNCTION idempo.lookup(scope text, key text) RETURNS idempo.operations
    AS 'MODULE_PATHNAME', 'idempo_lookup'
    LANGUAGE C STABLE PARALLEL UNSAFE;

-- The key as stored: the clear key, or its SHA-256 digest (hex) in hash_keys scopes.
-- PARALLEL UNSAFE: it may read the scope as committed now (src/scope_cache.c), which a query
-- running in parallel mode may not (0.2.0 said RESTRICTED: a parallel query failed, XX000)
CREATE FUNCTION idempo.stored_key(scope text, key text) RETURNS text
    AS 'MODULE_PATHNAME', 'idempo_stored_key'
    LANGUAGE C STABLE PARALLEL UNSAFE;

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

-- The form of 0.1.0 and 0.2.0, without the attempt: refused with a hint (code written for it
-- fails loudly instead of deciding about an attempt it did not name).
CREATE FUNCTION idempo.verify(
    scope      text,
    key        text,
    found      boolean,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL)
    RETURNS idempo.status
    AS 'MODULE_PATHNAME', 'idempo_verify_without_attempt'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION idempo.resolve(
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

CREATE FUNCTION idempo.request_review(scope text, key text, note text DEFAULT NULL)
    RETURNS bigint
    AS 'MODULE_PATHNAME', 'idempo_request_review'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

CREATE FUNCTION idempo.sweep(batch integer DEFAULT 1000)
    RETURNS TABLE (lease_expired bigint, moved_to_review bigint, purged bigint)
    AS 'MODULE_PATHNAME', 'idempo_sweep'
    LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 1;

-- Shared-memory counters (need shared_preload_libraries = 'idempo').
CREATE FUNCTION idempo.counters()
    RETURNS TABLE (name text, value bigint, since timestamptz)
    AS 'MODULE_PATHNAME', 'idempo_counters'
    LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION idempo.reset_counters() RETURNS void
    AS 'MODULE_PATHNAME', 'idempo_reset_counters'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- The background worker's processes: the launcher and one sweeper per database served; and the
-- databases it should serve but found no worker slot for (kind 'unserved', pid NULL).
CREATE FUNCTION idempo.workers()
    RETURNS TABLE (kind text, database_id oid, pid integer, state text, rounds bigint,
                   wakeups bigint, last_round_at timestamptz, next_round_at timestamptz)
    AS 'MODULE_PATHNAME', 'idempo_workers'
    LANGUAGE C VOLATILE PARALLEL SAFE;

-- The time idempo decides with: the system clock shifted by idempo.clock_offset (tests only).
CREATE FUNCTION idempo.now() RETURNS timestamptz
    AS 'MODULE_PATHNAME', 'idempo_clock_now'
    LANGUAGE C VOLATILE PARALLEL SAFE;

-- Raises 25006 where idempo's records come from a publisher by logical replication (the write
-- check of the C functions, for resolve_conflict).
CREATE FUNCTION idempo.refuse_on_subscriber(scope text, key text) RETURNS void
    AS 'MODULE_PATHNAME', 'idempo_refuse_on_subscriber_sql'
    LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- Statement trigger on idempo.scopes: tells every backend to drop its cached copy of the scopes.
CREATE FUNCTION idempo.scopes_changed() RETURNS trigger
    AS 'MODULE_PATHNAME', 'idempo_scopes_changed'
    LANGUAGE C;
CREATE TRIGGER scopes_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idempo.scopes
    FOR EACH STATEMENT EXECUTE FUNCTION idempo.scopes_changed();

------------------------------------------------------------------------------------------------
-- Scope administration (PL/pgSQL: not on the hot path).
------------------------------------------------------------------------------------------------

-- Refuses a scope row that the claim path could not work with, with a hint.
CREATE FUNCTION idempo.check_scope(s idempo.scopes) RETURNS void
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

-- NULL leaves a setting unchanged.  To clear a nullable setting pass max_attempts => 0,
-- allowed_role => '', owner/environment/description => ''; fingerprint_ignore => '{}' lets every
-- field count again.  fingerprint_ignore cannot change while the scope has operations: their
-- fingerprints were computed under the old rule, and a redelivery would become a conflict.
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

CREATE FUNCTION idempo.set_scope_enabled(name text, enabled boolean) RETURNS idempo.scopes
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempo.scopes;
BEGIN
    IF set_scope_enabled.name IS NULL THEN
        RAISE EXCEPTION 'scope name must not be NULL' USING ERRCODE = '22004',
            HINT = 'Pass the name of an existing scope.';
    END IF;
    UPDATE idempo.scopes AS sc SET enabled = set_scope_enabled.enabled, updated_at = now()
    WHERE sc.name = set_scope_enabled.name
    RETURNING * INTO s;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'scope "%" does not exist', set_scope_enabled.name
            USING ERRCODE = '42704', HINT = 'Create it with idempo.create_scope(name => ...).';
    END IF;
    RETURN s;
END
$$;

CREATE FUNCTION idempo.disable_scope(name text) RETURNS idempo.scopes
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN idempo.set_scope_enabled(name, false);

CREATE FUNCTION idempo.enable_scope(name text) RETURNS idempo.scopes
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
    RETURN idempo.set_scope_enabled(name, true);

------------------------------------------------------------------------------------------------
-- Conflicts
------------------------------------------------------------------------------------------------

-- resolution: 'kept_stored' (the stored request stands, the incoming one was refused),
-- 'new_key' (the incoming request was re-sent under a new key), 'dismissed' (nothing to do).
CREATE FUNCTION idempo.resolve_conflict(conflict_id bigint, resolution text, reviewer text DEFAULT NULL,
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

------------------------------------------------------------------------------------------------
-- Who may review (src/review_rights.c): a scope's review_role, else its allowed_role, else any
-- role with the grants; idempo's owner always.  The views below show only the scopes the current
-- role may review; a reviewer reads through the functions after them, which filter first.
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

------------------------------------------------------------------------------------------------
-- What people look at
------------------------------------------------------------------------------------------------

-- Open reviews, oldest first, with how long each has waited (never negative: a review opened under a
-- test's idempo.clock_offset may lie in the future of a session without it).
CREATE VIEW idempo.review_queue WITH (security_barrier) AS
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

-- Per scope: operations per status, open reviews and the oldest one's wait, open conflicts.
-- Counting operations reads the whole table: query it for monitoring, not in a hot loop.
CREATE VIEW idempo.stats AS
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

-- The top-level fields whose values differ between two parameter documents (store_params scopes).
-- STRICT: without one side (a conflict with a remembered key, whose params are gone) nothing is
-- listed, rather than a made-up field.
CREATE FUNCTION idempo.params_diff(stored jsonb, incoming jsonb)
    RETURNS TABLE (field text, stored_value jsonb, incoming_value jsonb)
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
    SELECT COALESCE(s.key, i.key), s.value, i.value
    FROM jsonb_each(CASE WHEN jsonb_typeof(stored) = 'object' THEN stored ELSE jsonb_build_object('', stored) END) s
    FULL JOIN jsonb_each(CASE WHEN jsonb_typeof(incoming) = 'object' THEN incoming ELSE jsonb_build_object('', incoming) END) i
           ON i.key = s.key
    WHERE s.value IS DISTINCT FROM i.value
    ORDER BY 1
$$;

-- Open conflicts, oldest first, with what changed (when the scope stores params).
CREATE VIEW idempo.conflict_queue WITH (security_barrier) AS
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

-- Rows that break the state machine's invariants (src/idempo.h); empty when all is well.
-- Used by the tests after every fault; cheap enough to run by hand on a live system.
CREATE FUNCTION idempo.check_consistency()
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

------------------------------------------------------------------------------------------------
-- Dropping the extension deletes every record: refused while records exist (src/drop_guard.c)
------------------------------------------------------------------------------------------------

-- DROP EXTENSION idempo, DROP SCHEMA idempo CASCADE and DROP OWNED BY the extension's owner are
-- refused while operations, open reviews or open conflicts exist, unless a superuser set
-- idempo.allow_drop_with_records.  A member of the extension (it goes with it), fired before the
-- statement runs; ENABLE ALWAYS, so session_replication_role = replica does not skip it.  It fires
-- for every DROP: calling it loads the library, whose object_access_hook refuses the cascades that
-- reach the extension by other routes (DROP EXTENSION plpgsql CASCADE ...).
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

------------------------------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC but fingerprint().  See docs/security.md for the grant sets.
------------------------------------------------------------------------------------------------

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA idempo FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.fingerprint(jsonb) TO PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.fingerprint(jsonb, text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.fingerprint(jsonb, text[], text[]) TO PUBLIC;
-- used by the views; harmless
GRANT EXECUTE ON FUNCTION idempo.now() TO PUBLIC;
-- the client libraries check it before anything else, whatever the role may do
GRANT EXECUTE ON FUNCTION idempo.version() TO PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.params_diff(jsonb, jsonb) TO PUBLIC;
-- the filter of the views a reviewer reads, executed as the reader; it answers for them only
GRANT EXECUTE ON FUNCTION idempo.may_review(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION idempo.may_review(name, name) TO PUBLIC;
