-- idempo 0.3.0 -> 1.0.0.
-- 1.0.0 is 0.3.0's API, promised for the 1.x series (docs/upgrading.md): the objects are the
-- same but for the version they report.  Released install scripts are frozen: every later schema
-- change goes into the next version's install script AND into an update script like this one
-- (test/upgrade/run compares an updated database with a fresh install).

\echo Use "ALTER EXTENSION idempo UPDATE" to load this file. \quit

-- CREATE OR REPLACE keeps the function's grants and comment
CREATE OR REPLACE FUNCTION idempo.version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '1.0.0'::text $$;
