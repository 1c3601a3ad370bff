-- DROP EXTENSION idempo would delete every processing record: it is refused while operations,
-- open reviews or open conflicts exist, and so are DROP SCHEMA idempo CASCADE, DROP OWNED BY
-- the extension's owner and every cascade that reaches the extension, unless a superuser sets
-- idempo.allow_drop_with_records.
-- (test/tap/t/011_drop_guard.pl shows the same without the library preloaded.)
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

-- SQLSTATE, message, detail and hint of a refused statement, or 'ok' (then it took effect)
CREATE FUNCTION pg_temp.err(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; detail text; hint text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL,
                            hint = PG_EXCEPTION_HINT;
    RETURN st || ': ' || msg || coalesce(E'\nDETAIL: ' || nullif(detail, ''), '')
        || coalesce(E'\nHINT: ' || nullif(hint, ''), '');
END $$;
CREATE FUNCTION pg_temp.records() RETURNS text LANGUAGE sql AS $$
    SELECT (SELECT count(*) FROM idempo.operations) || ' operations, '
        || (SELECT count(*) FROM idempo.reviews WHERE resolved_at IS NULL) || ' open reviews, '
        || (SELECT count(*) FROM idempo.conflicts WHERE resolved_at IS NULL) || ' open conflicts'
$$;

-- the guard is part of the extension, and fires whatever session_replication_role says, for
-- every DROP (so the library and its hook are loaded before anything is dropped)
SELECT evtname, evtevent, evtenabled, evtfoid::regprocedure, cardinality(evttags) AS tags,
       (SELECT bool_and(t LIKE 'DROP %') FROM unnest(evttags) t) AS all_drop,
       evttags @> '{DROP EXTENSION,DROP SCHEMA,DROP OWNED,DROP TYPE,DROP FUNCTION}' AS these
FROM pg_event_trigger WHERE evtname = 'idempo_drop_guard';
SELECT pg_describe_object(classid, objid, 0) AS member FROM pg_depend
WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idempo') AND deptype = 'e'
  AND classid = 'pg_event_trigger'::regclass;

-- An empty extension drops as before.
SELECT pg_temp.err('DROP EXTENSION idempo');
CREATE EXTENSION idempo;

-- Records: a finished operation, work in doubt, a review and a conflict.
SELECT name FROM idempo.create_scope('g', retention => '1 day', lease => '5 minutes');
SELECT outcome FROM idempo.claim('g', 'shipped', '{"qty":1}', complete_on_commit => true);
SELECT outcome FROM idempo.claim('g', 'in-doubt');
SELECT idempo.request_review('g', 'in-doubt', 'customer called') > 0 AS review_opened;
SELECT outcome FROM idempo.claim('g', 'shipped', '{"qty":2}');
SELECT pg_temp.records();

-- Every statement that would drop the extension is refused, and nothing is dropped.
SELECT pg_temp.err('DROP EXTENSION idempo');
SELECT pg_temp.err('DROP EXTENSION idempo CASCADE');
SELECT pg_temp.err('DROP EXTENSION IF EXISTS no_such_extension, idempo');
SELECT pg_temp.err('DROP SCHEMA idempo CASCADE');
SET session_replication_role = replica;
SELECT pg_temp.err('DROP EXTENSION idempo');
RESET session_replication_role;
-- without CASCADE PostgreSQL refuses DROP SCHEMA by itself
SELECT pg_temp.err('DROP SCHEMA idempo');
SELECT pg_temp.records();

-- Only open reviews and conflicts count: resolved ones are history.
SELECT idempo.resolve('g', 'in-doubt', 'failed', 'alice', note => 'cancelled');
SELECT idempo.resolve_conflict(id, 'kept_stored', 'alice') FROM idempo.conflicts;
SELECT pg_temp.err('DROP EXTENSION idempo');

-- A role that may not drop the extension gets PostgreSQL's own refusal, and no counts; it may
-- not set the override either.
CREATE ROLE regress_idempo_stranger;
SET ROLE regress_idempo_stranger;
SELECT pg_temp.err('DROP EXTENSION idempo');
SELECT pg_temp.err('SET idempo.allow_drop_with_records = on');
RESET ROLE;
DROP ROLE regress_idempo_stranger;

-- Once the records are gone (here: expired and purged by the sweep), the drop goes through.
SET idempo.clock_offset = '3 days';
SELECT * FROM idempo.sweep();
RESET idempo.clock_offset;
SELECT pg_temp.records();
SELECT pg_temp.err('DROP EXTENSION idempo');
CREATE EXTENSION idempo;

-- The override: a superuser drops the records knowingly.
SELECT name FROM idempo.create_scope('g');
SELECT outcome FROM idempo.claim('g', 'k', complete_on_commit => true);
SET idempo.allow_drop_with_records = on;
SELECT pg_temp.err('DROP EXTENSION idempo');
RESET idempo.allow_drop_with_records;
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempo';

-- DROP OWNED BY the role that owns the extension drops it too.
CREATE ROLE regress_idempo_owner SUPERUSER;
SET ROLE regress_idempo_owner;
CREATE EXTENSION idempo;
SELECT name FROM idempo.create_scope('g');
SELECT outcome FROM idempo.claim('g', 'k', complete_on_commit => true);
RESET ROLE;
SELECT extowner::regrole FROM pg_extension WHERE extname = 'idempo';
SELECT pg_temp.err('DROP OWNED BY regress_idempo_owner');
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempo';
SET idempo.allow_drop_with_records = on;
SELECT pg_temp.err('DROP OWNED BY regress_idempo_owner');
RESET idempo.allow_drop_with_records;
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempo';
DROP ROLE regress_idempo_owner;

-- A cascade reaches the extension by other routes too: PostgreSQL drops the whole extension when
-- it drops one of its members.  The library's object_access_hook sees the extension's objects
-- being dropped, whatever the statement, and refuses like the statement check.
-- (The cascade's NOTICE lists this session's pg_temp functions: not shown.)
CREATE EXTENSION idempo;
SELECT name FROM idempo.create_scope('g');
SELECT outcome FROM idempo.claim('g', 'k', complete_on_commit => true);
SET client_min_messages = warning;
-- idempo's PL/pgSQL functions depend on the language
SELECT pg_temp.err('DROP EXTENSION plpgsql CASCADE');
-- one of idempo's functions marked as depending on another extension
ALTER FUNCTION idempo.fingerprint(jsonb) DEPENDS ON EXTENSION plpgsql;
SELECT pg_temp.err('DROP EXTENSION plpgsql CASCADE');
ALTER FUNCTION idempo.fingerprint(jsonb) NO DEPENDS ON EXTENSION plpgsql;
RESET client_min_messages;
SELECT count(*) AS extensions FROM pg_extension WHERE extname IN ('idempo', 'plpgsql');
-- The hook alone refuses the direct forms too (here the event trigger is disabled).
ALTER EVENT TRIGGER idempo_drop_guard DISABLE;
SELECT pg_temp.err('DROP EXTENSION idempo');
SELECT pg_temp.err('DROP SCHEMA idempo CASCADE');
ALTER EVENT TRIGGER idempo_drop_guard ENABLE ALWAYS;
SELECT pg_temp.records();
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo;
RESET idempo.allow_drop_with_records;

-- The schema idempo was created beforehand by another role: DROP OWNED BY that role CASCADE
-- drops the schema and the extension with it.
DROP SCHEMA idempo;  -- left behind by DROP EXTENSION (not a member)
CREATE ROLE regress_idempo_schema_owner;
CREATE SCHEMA idempo AUTHORIZATION regress_idempo_schema_owner;
CREATE EXTENSION idempo;
-- (the extension's owner is whoever runs the suite: postgres here, the test user under autopkgtest)
SELECT nspowner::regrole, (SELECT extowner = current_user::regrole FROM pg_extension WHERE extname = 'idempo')
         AS extension_owned_by_caller
FROM pg_namespace WHERE nspname = 'idempo';
SELECT name FROM idempo.create_scope('g');
SELECT outcome FROM idempo.claim('g', 'k', complete_on_commit => true);
SET client_min_messages = warning;
SELECT pg_temp.err('DROP OWNED BY regress_idempo_schema_owner CASCADE');
-- that role itself may run it (no privilege on idempo's tables needed: the hook counts as the
-- extension's owner)
SET ROLE regress_idempo_schema_owner;
SELECT pg_temp.err('DROP OWNED BY regress_idempo_schema_owner CASCADE');
RESET ROLE;
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempo';
-- the override lets it through, as for the other forms
SET idempo.allow_drop_with_records = on;
SELECT pg_temp.err('DROP OWNED BY regress_idempo_schema_owner CASCADE');
RESET idempo.allow_drop_with_records;
RESET client_min_messages;
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idempo';
SELECT count(*) AS schemas FROM pg_namespace WHERE nspname = 'idempo';
DROP ROLE regress_idempo_schema_owner;

-- The extension's own update script may drop its objects: ALTER EXTENSION UPDATE with records.
CREATE EXTENSION idempo VERSION '0.2.0';
SELECT name FROM idempo.create_scope('g');
SELECT outcome FROM idempo.claim('g', 'k', complete_on_commit => true);
ALTER EXTENSION idempo UPDATE;
SELECT extversion, (SELECT count(*) FROM idempo.operations) AS operations
FROM pg_extension WHERE extname = 'idempo';
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo;
RESET idempo.allow_drop_with_records;

CREATE EXTENSION idempo;
