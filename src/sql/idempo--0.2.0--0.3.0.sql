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
