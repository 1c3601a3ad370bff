-- idempo 1.0.0 -> 1.0.1.
-- The same API (docs/upgrading.md): what changes is said in docs/CHANGELOG.md.  Released install
-- scripts are frozen: every later schema change goes into the next version's install script AND
-- into an update script like this one (test/upgrade/run compares an updated database with a
-- fresh install).

\echo Use "ALTER EXTENSION idempo UPDATE" to load this file. \quit

-- CREATE OR REPLACE keeps the function's grants and comment
CREATE OR REPLACE FUNCTION idempo.version() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT '1.0.1'::text $$;
