-- Helpers shared by the regression tests that follow (they run in this order, in one database).
-- regress.err(statement) runs a statement and returns 'SQLSTATE: message', with the hint on a
-- second line, or 'ok'; the statement's effects roll back with its subtransaction.
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS regress CASCADE;
RESET client_min_messages;
CREATE SCHEMA regress;
GRANT USAGE ON SCHEMA regress TO PUBLIC;
CREATE FUNCTION regress.err(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; hint text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    RETURN st || ': ' || msg || coalesce(E'\nHINT: ' || nullif(hint, ''), '');
END $$;
