-- A trigger a user puts on idempo.operations (an audit log, a replication hook) fires for every
-- write, including the two that direct writes would make through the access methods: a trigger
-- on the table switches direct writes off.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

SELECT name FROM idempo.create_scope('trg');
CREATE TABLE public.operations_log (op text, key text, status idempo.status, attempt int);
CREATE FUNCTION public.log_operation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.operations_log VALUES (TG_OP, NEW.key, NEW.status, NEW.attempt);
    RETURN NEW;
END $$;
CREATE TRIGGER log_operation AFTER INSERT OR UPDATE ON idempo.operations
    FOR EACH ROW EXECUTE FUNCTION public.log_operation();

-- a new key and its completion in the same transaction: the direct writes' case
BEGIN;
SELECT outcome, attempt FROM idempo.claim('trg', 'k1', '{"a":1}');
SELECT idempo.complete('trg', 'k1', result => '{"ok":true}');
COMMIT;
SELECT outcome FROM idempo.claim('trg', 'k2', complete_on_commit => true);
SELECT op, key, status, attempt FROM public.operations_log ORDER BY key, op DESC, status;

DROP TRIGGER log_operation ON idempo.operations;
DROP FUNCTION public.log_operation();
DROP TABLE public.operations_log;

-- A trigger that calls idempo itself, inside the claim that fired it: alter_scope() makes the
-- scope cache stale, and the nested claim loads the scope again.  The outer claim still uses
-- the scope it read (to remember its attempt, for the audit log): that copy must stay valid
-- until the outer call ends (the cache used to free it under the outer claim, whose complete()
-- then found no attempt of this transaction).
SELECT name FROM idempo.create_scope('trg.nested', audit => true);
SELECT name FROM idempo.create_scope('trg.inner');
CREATE FUNCTION public.nested_idempo() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key = 'outer' AND TG_OP = 'INSERT' THEN
        PERFORM idempo.alter_scope('trg.nested', description => 'changed inside a claim');
        PERFORM idempo.claim('trg.inner', 'inner');
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER nested_idempo AFTER INSERT ON idempo.operations
    FOR EACH ROW EXECUTE FUNCTION public.nested_idempo();
BEGIN;
SELECT outcome, attempt FROM idempo.claim('trg.nested', 'outer');
SELECT idempo.complete('trg.nested', 'outer', result => '{"ok":true}');
SELECT idempo.complete('trg.inner', 'inner');
COMMIT;
SELECT scope, key, status FROM idempo.operations WHERE scope LIKE 'trg.%' ORDER BY scope, key;
SELECT scope, key, action, to_status FROM idempo.events WHERE scope LIKE 'trg.%' ORDER BY id;
SELECT description FROM idempo.scopes WHERE name = 'trg.nested';
DROP TRIGGER nested_idempo ON idempo.operations;
DROP FUNCTION public.nested_idempo();

-- The stale generations are kept only until the outermost idempo call ends, not to the end of
-- the transaction: a long transaction of claims amid scope changes keeps one cache, not one per
-- change (it used to keep about 25 kB per change: 128 MB after 5000).
-- Also after calls that ended in an error (they never closed their SPI session): one at the top
-- level in an earlier transaction, one caught inside this one.
SELECT idempo.claim('no.such.scope', 'k');
BEGIN;
DO $$
BEGIN
    BEGIN
        PERFORM idempo.claim('no.such.scope', 'k');
    EXCEPTION WHEN undefined_object THEN NULL;
    END;
    FOR i IN 1 .. 50 LOOP
        PERFORM idempo.alter_scope('trg.inner', description => 'change ' || i);
        PERFORM idempo.claim('trg.inner', 'many-' || i);
    END LOOP;
END $$;
SELECT count(*) AS scope_caches FROM pg_backend_memory_contexts WHERE name = 'idempo scope cache';
COMMIT;
