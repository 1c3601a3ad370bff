-- Least privilege: the three grant sets of the README, each tried by a real role; the
-- scope's allowed_role; no direct writes to idempo's tables; a hostile search_path.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;


CREATE ROLE regress_idempo_app;
CREATE ROLE regress_idempo_reviewer;
CREATE ROLE regress_idempo_admin;
CREATE ROLE regress_idempo_outsider;
CREATE ROLE regress_idempo_app_member IN ROLE regress_idempo_app;

-- The grant sets, exactly as in README.md ("Security").
-- application
GRANT USAGE ON SCHEMA idempo TO regress_idempo_app;
GRANT EXECUTE ON FUNCTION
    idempo.claim(text, text, jsonb, bytea, text, timestamptz, boolean, boolean, interval, boolean),
    idempo.complete(text, text, integer, jsonb, text),
    idempo.fail(text, text, integer, text, boolean),
    idempo.heartbeat(text, text, integer, interval),
    idempo.verify(text, text, integer, boolean, text, jsonb),
    idempo.lookup(text, text)
TO regress_idempo_app;
-- reviewer
GRANT USAGE ON SCHEMA idempo TO regress_idempo_reviewer;
GRANT SELECT ON idempo.stats TO regress_idempo_reviewer;
GRANT EXECUTE ON FUNCTION
    idempo.review_queue_page(text, text, text, interval, timestamptz, bigint, integer),
    idempo.conflict_queue_page(text, text, interval, timestamptz, bigint, integer),
    idempo.unknown_queue_page(text, text, interval, timestamptz, text, text, integer),
    idempo.reviewable_operations_of(text[], text[]),
    idempo.open_reviews_of(text[], text[]),
    idempo.open_conflicts_of(text[], text[]),
    idempo.reviewable_events_of(text, text),
    idempo.reviewable_events_since(timestamptz),
    idempo.resolve(text, text, text, text, text, jsonb, text),
    idempo.request_review(text, text, text),
    idempo.release(text, text, text, text),
    idempo.resolve_conflict(bigint, text, text, text),
    idempo.verify(text, text, integer, boolean, text, jsonb),
    idempo.lookup(text, text)
TO regress_idempo_reviewer;
-- administrator
GRANT USAGE ON SCHEMA idempo TO regress_idempo_admin;
GRANT SELECT ON idempo.scopes, idempo.stats TO regress_idempo_admin;
GRANT EXECUTE ON FUNCTION
    idempo.create_scope, idempo.alter_scope,  -- by name: their parameter lists grow
    idempo.disable_scope(text), idempo.enable_scope(text),
    idempo.sweep(integer), idempo.counters(), idempo.reset_counters(), idempo.workers(),
    idempo.check_consistency()
TO regress_idempo_admin;

-- the administrator sets up scopes; nobody else can
SET ROLE regress_idempo_admin;
SELECT name FROM idempo.create_scope('orders', retention => '1 hour', lease => '1 minute', verify_settle => '1 minute',
                                     store_params => true);
SELECT name FROM idempo.create_scope('orders.app_only', allowed_role => 'regress_idempo_app');
SELECT * FROM idempo.sweep();
SELECT count(*) > 0 AS counters FROM idempo.counters();
SELECT regress.err($$SELECT idempo.claim('orders', 'k')$$) AS admin_claims;
SELECT regress.err($$SELECT idempo.resolve('orders', 'k', 'failed', 'x')$$) AS admin_resolves;
RESET ROLE;

-- the application does its job ...
SET ROLE regress_idempo_app;
SELECT outcome FROM idempo.claim('orders', 'o-1', '{"q":1,"sku":"A"}');
SELECT idempo.complete('orders', 'o-1', 1, '{"ok":true}', 'T-1');
SELECT outcome FROM idempo.claim('orders', 'o-2');
SELECT idempo.fail('orders', 'o-2', 1, 'e');
SELECT status FROM idempo.lookup('orders', 'o-1');
SELECT outcome FROM idempo.claim('orders', 'o-1', '{"q":2,"sku":"A","note":"rush"}');
-- ... and nothing else: no direct table access, no review, no administration
SELECT regress.err(stmt) AS refused FROM (VALUES
    ($$UPDATE idempo.operations SET status = 'succeeded' WHERE key = 'o-2'$$),
    ($$DELETE FROM idempo.operations$$),
    ($$INSERT INTO idempo.operations (scope, key, status, attempt, first_seen_at, last_attempt_at) VALUES ('orders', 'x', 'succeeded', 1, now(), now())$$),
    ($$SELECT * FROM idempo.operations$$),
    ($$DELETE FROM idempo.conflicts$$),
    ($$UPDATE idempo.reviews SET resolved_at = now()$$),
    ($$UPDATE idempo.scopes SET enabled = true$$),
    ($$SELECT * FROM idempo.review_queue$$),
    ($$SELECT * FROM idempo.review_queue_page()$$),
    ($$SELECT idempo.resolve('orders', 'o-2', 'succeeded', 'me')$$),
    ($$SELECT idempo.request_review('orders', 'o-2')$$),
    ($$SELECT idempo.resolve_conflict(1, 'dismissed', 'me')$$),
    ($$SELECT idempo.create_scope('mine')$$),
    ($$SELECT idempo.disable_scope('orders')$$),
    ($$SELECT * FROM idempo.sweep()$$),
    ($$SELECT idempo.reset_counters()$$)
) AS t(stmt);
RESET ROLE;

-- the reviewer reads the queues and decides, and nothing else
SET ROLE regress_idempo_reviewer;
SELECT scope, key, occurrences, changed_fields FROM idempo.conflict_queue_page();
SELECT idempo.request_review('orders', 'o-2', 'looks odd') > 0 AS opened;
SELECT key, reason, detail FROM idempo.review_queue_page();
-- a decision records the role that made it: the reviewer argument left out, or its own name
SELECT idempo.resolve('orders', 'o-2', 'not_executed');
SELECT idempo.resolve_conflict((SELECT id FROM idempo.conflict_queue_page(page_size => 1)), 'kept_stored',
                               'regress_idempo_reviewer');
SELECT regress.err(stmt) AS names_another FROM (VALUES
    ($$SELECT idempo.resolve('orders', 'o-2', 'failed', 'rita')$$),
    ($$SELECT idempo.resolve_conflict(1, 'dismissed', 'regress_idempo_admin')$$),
    ($$SELECT idempo.release('orders', 'o-2', 'rita')$$)
) AS t(stmt);
SELECT regress.err(stmt) AS refused FROM (VALUES
    ($$SELECT idempo.claim('orders', 'r-1')$$),
    ($$SELECT idempo.complete('orders', 'o-2', 1)$$),
    ($$SELECT * FROM idempo.sweep()$$),
    ($$SELECT idempo.create_scope('mine')$$),
    ($$UPDATE idempo.operations SET status = 'failed'$$),
    ($$SELECT * FROM idempo.reviews$$)
) AS t(stmt);
RESET ROLE;

-- allowed_role: EXECUTE is not enough, the role must be a member
GRANT EXECUTE ON FUNCTION idempo.claim(text, text, jsonb, bytea, text, timestamptz, boolean, boolean, interval, boolean),
    idempo.complete(text, text, integer, jsonb, text), idempo.fail(text, text, integer, text, boolean),
    idempo.verify(text, text, integer, boolean, text, jsonb) TO regress_idempo_outsider;
GRANT USAGE ON SCHEMA idempo TO regress_idempo_outsider;
SET ROLE regress_idempo_app_member;
SELECT outcome FROM idempo.claim('orders.app_only', 'm-1');
RESET ROLE;
SET ROLE regress_idempo_outsider;
SELECT regress.err(stmt) AS outsider FROM (VALUES
    ($$SELECT idempo.claim('orders.app_only', 'm-2')$$),
    ($$SELECT idempo.complete('orders.app_only', 'm-1', 1)$$),
    ($$SELECT idempo.fail('orders.app_only', 'm-1', 1)$$),
    ($$SELECT idempo.verify('orders.app_only', 'm-1', 1, true)$$)
) AS t(stmt);
SELECT outcome FROM idempo.claim('orders', 'outsider-in-open-scope');
RESET ROLE;
SELECT key, status FROM idempo.operations WHERE scope = 'orders.app_only';

-- allowed_role keeps others out of the scope's records too: lookup() is refused to a role
-- outside it, even with EXECUTE (the reviewer's grant set has it); members read as before, and
-- the reviewer keeps its own view, the queues it has SELECT on.
SET ROLE regress_idempo_app_member;
SELECT idempo.complete('orders.app_only', 'm-1', 1, '{"card_last4":"4242"}');
SELECT status, result FROM idempo.lookup('orders.app_only', 'm-1');
RESET ROLE;
GRANT EXECUTE ON FUNCTION idempo.lookup(text, text) TO regress_idempo_outsider;
SET ROLE regress_idempo_outsider;
SELECT regress.err($$SELECT idempo.lookup('orders.app_only', 'm-1')$$) AS outsider_lookup;
SELECT status FROM idempo.lookup('orders', 'outsider-in-open-scope');
RESET ROLE;
-- A reviewer outside allowed_role reviews nothing of the scope: its records are not in the
-- queues, and every decision on them is refused (docs/security.md, Reviewers)
SET ROLE regress_idempo_reviewer;
SELECT regress.err(stmt) AS reviewer_outside FROM (VALUES
    ($$SELECT idempo.lookup('orders.app_only', 'm-1')$$),
    ($$SELECT idempo.request_review('orders.app_only', 'm-1', 'asked by support')$$),
    ($$SELECT idempo.resolve('orders.app_only', 'm-1', 'succeeded')$$)
) AS t(stmt);
RESET ROLE;
SELECT idempo.request_review('orders.app_only', 'm-1', 'opened by the owner') > 0 AS owner_opens;
SET ROLE regress_idempo_reviewer;
SELECT count(*) AS reviewer_sees FROM idempo.review_queue_page(scope => 'orders.app_only');
RESET ROLE;
-- review_role makes it a reviewer of the scope without the application's rights
SELECT review_role FROM idempo.alter_scope('orders.app_only', review_role => 'regress_idempo_reviewer');
SET ROLE regress_idempo_reviewer;
SELECT status, result FROM idempo.lookup('orders.app_only', 'm-1');
SELECT scope, key, reason FROM idempo.review_queue_page(scope => 'orders.app_only');
SELECT idempo.resolve('orders.app_only', 'm-1', 'succeeded', note => 'seen in the queue');
SELECT regress.err($$SELECT idempo.claim('orders.app_only', 'm-9')$$) AS reviewer_claims;
RESET ROLE;
SELECT resolved_by, resolution FROM idempo.reviews WHERE scope = 'orders.app_only' AND key = 'm-1';
SELECT review_role FROM idempo.alter_scope('orders.app_only', review_role => '');

-- allowed_role is a role name, looked up at each call: after the role is renamed away and
-- another role takes its name (no scope change tells the backends), the scope follows the name
-- (this backend has the scope cached from the claims above).
ALTER ROLE regress_idempo_app RENAME TO regress_idempo_app_renamed;
CREATE ROLE regress_idempo_app;
GRANT regress_idempo_app TO regress_idempo_outsider;
SET ROLE regress_idempo_app_member;
SELECT regress.err($$SELECT idempo.claim('orders.app_only', 'm-3')$$) AS member_of_renamed_role;
RESET ROLE;
SET ROLE regress_idempo_outsider;
SELECT outcome FROM idempo.claim('orders.app_only', 'm-4');
RESET ROLE;
DROP ROLE regress_idempo_app;
SET ROLE regress_idempo_app_member;
SELECT regress.err($$SELECT idempo.claim('orders.app_only', 'm-5')$$) AS role_gone;
RESET ROLE;
ALTER ROLE regress_idempo_app_renamed RENAME TO regress_idempo_app;
SET ROLE regress_idempo_app_member;
SELECT outcome FROM idempo.claim('orders.app_only', 'm-6');
RESET ROLE;
SELECT key, status FROM idempo.operations WHERE scope = 'orders.app_only' ORDER BY key;

-- PUBLIC has nothing but fingerprint() and the views' helpers
SELECT p.proname FROM pg_proc p
WHERE p.pronamespace = 'idempo'::regnamespace AND has_function_privilege('public', p.oid, 'EXECUTE')
ORDER BY 1;
SELECT c.relname FROM pg_class c
WHERE c.relnamespace = 'idempo'::regnamespace AND c.relkind IN ('r', 'v', 'S')
  AND has_table_privilege('public', c.oid, 'SELECT')
ORDER BY 1;

-- SECURITY DEFINER functions all pin their search_path
SELECT p.proname, p.proconfig FROM pg_proc p
WHERE p.pronamespace = 'idempo'::regnamespace AND p.prosecdef
  AND NOT ('search_path=pg_catalog, pg_temp' = ANY (coalesce(p.proconfig, '{}')))
ORDER BY 1;

-- A hostile search_path: look-alikes of pg_catalog's operators and functions earlier on the
-- path change no decision.
CREATE SCHEMA evil;
CREATE FUNCTION evil.always(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.always);
CREATE FUNCTION evil.never(text, text) RETURNS boolean LANGUAGE sql AS 'SELECT false';
CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.never);
CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql AS $$SELECT '2000-01-01'::timestamptz$$;
CREATE FUNCTION evil.to_jsonb(anyelement) RETURNS jsonb LANGUAGE sql AS $$SELECT '"hijacked"'::jsonb$$;
CREATE FUNCTION evil.unnest(text[]) RETURNS SETOF text LANGUAGE sql AS $$SELECT 'hijacked'$$;
CREATE FUNCTION evil.jsonb_each(jsonb) RETURNS TABLE (key text, value jsonb) LANGUAGE sql AS $$SELECT 'x', 'null'::jsonb$$;
GRANT USAGE ON SCHEMA evil TO PUBLIC;
SET search_path = evil, pg_catalog, public;
SELECT outcome FROM idempo.claim('orders', 'e-1', '{"q":1}');
SELECT outcome FROM idempo.claim('orders', 'e-1', '{"q":1}');
SELECT outcome FROM idempo.claim('orders', 'e-1', '{"q":2}');
SELECT outcome FROM idempo.claim('orders', 'e-2');
SELECT idempo.complete('orders', 'e-2', 1);
SELECT idempo.request_review('orders', 'e-1', 'hostile path') > 0 AS review;
SELECT reason, snapshot->>'status' AS snapshot_status FROM idempo.review_queue WHERE key = 'e-1';
SELECT changed_fields FROM idempo.conflict_queue WHERE key = 'e-1';
SET idempo.clock_offset = '2h';
SELECT * FROM idempo.sweep();
RESET idempo.clock_offset;
RESET search_path;
SELECT key, status FROM idempo.operations WHERE scope = 'orders' ORDER BY key;
SELECT count(*) AS problems FROM idempo.check_consistency();
SET client_min_messages = warning;
DROP SCHEMA evil CASCADE;
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo CASCADE;
RESET idempo.allow_drop_with_records;
DROP OWNED BY regress_idempo_app_member, regress_idempo_app, regress_idempo_reviewer, regress_idempo_admin, regress_idempo_outsider;
DROP ROLE regress_idempo_app_member, regress_idempo_app, regress_idempo_reviewer, regress_idempo_admin, regress_idempo_outsider;
