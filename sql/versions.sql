-- One library serves every database, whatever version of idempo's SQL objects each one has:
-- it works with the versions it supports, before and after ALTER EXTENSION idempo UPDATE, and
-- refuses, with a hint, objects of a version it does not know.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo VERSION '0.1.0';
RESET client_min_messages;
SELECT name FROM idempo.create_scope('v', retention => '1 day', lease => '5 minutes');
SELECT outcome FROM idempo.claim('v', 'before-update', complete_on_commit => true);
ALTER EXTENSION idempo UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'idempo') AS updated
FROM pg_extension WHERE extname = 'idempo';
SELECT outcome FROM idempo.claim('v', 'before-update');
SELECT outcome FROM idempo.claim('v', 'after-update');

-- as if the database's objects were newer than this library (a downgrade of the binaries)
UPDATE pg_extension SET extversion = '9.9.9' WHERE extname = 'idempo';
\c -
SELECT regress.err($$SELECT idempo.claim('v', 'refused')$$);
SELECT regress.err($$SELECT idempo.lookup('v', 'after-update')$$);
UPDATE pg_extension SET extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'idempo')
WHERE extname = 'idempo';
\c -
SELECT outcome FROM idempo.claim('v', 'refused');
SELECT * FROM idempo.check_consistency();

-- 0.2.0 -> 0.3.0 drops and creates claim(), create_scope() and alter_scope() again (they gain
-- parameters): a user's view or BEGIN ATOMIC function that uses one stops the update with a
-- message naming it and saying what to do (not PostgreSQL's "use DROP ... CASCADE", which would
-- drop the user's objects); nothing is changed.  A plain SQL or PL/pgSQL function, which
-- PostgreSQL records no dependency for, keeps working.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo VERSION '0.2.0';
RESET client_min_messages;
SELECT name FROM idempo.create_scope('dep', retention => '1 day', lease => '5 minutes');
CREATE VIEW regress_claim_view AS SELECT outcome FROM idempo.claim('dep', 'v');
CREATE FUNCTION regress_claim_atomic(k text) RETURNS idempo.claim_result LANGUAGE sql
BEGIN ATOMIC; SELECT idempo.claim('dep', k); END;
CREATE FUNCTION regress_claim_plain(k text) RETURNS idempo.outcome LANGUAGE sql
AS $$ SELECT outcome FROM idempo.claim('dep', k) $$;
-- (no CONTEXT: from 18 on it quotes the update script's statement)
\set VERBOSITY default
\set SHOW_CONTEXT never
ALTER EXTENSION idempo UPDATE;
\set SHOW_CONTEXT errors
\set VERBOSITY terse
SELECT extversion FROM pg_extension WHERE extname = 'idempo';
DROP VIEW regress_claim_view;
DROP FUNCTION regress_claim_atomic(text);
ALTER EXTENSION idempo UPDATE;
SELECT extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'idempo') AS updated
FROM pg_extension WHERE extname = 'idempo';
SELECT regress_claim_plain('p1') AS plain_function_still_works;
DROP FUNCTION regress_claim_plain(text);
SELECT * FROM idempo.check_consistency();
