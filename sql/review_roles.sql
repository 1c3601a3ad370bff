-- Who reviews a scope (review_role, else allowed_role, else anyone with the grants), what the
-- reviewer reads (and why not through the views), and whom a decision names (src/review_rights.c, docs/security.md).
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

CREATE ROLE regress_rr_billing_app;
CREATE ROLE regress_rr_shop_app;
CREATE ROLE regress_rr_billing_reviewers;
CREATE ROLE regress_rr_rita IN ROLE regress_rr_billing_reviewers;   -- reviews billing
CREATE ROLE regress_rr_sam;                                         -- reviews nothing special
CREATE ROLE regress_rr_desk IN ROLE regress_rr_rita;                -- a member of rita's role
-- (the test's role claims in the applications' scopes, and SET ROLEs to the people: on a
-- managed service it is no superuser)
GRANT regress_rr_billing_app, regress_rr_shop_app, regress_rr_rita, regress_rr_sam, regress_rr_desk
    TO current_user;
-- the reviewer's grant set of docs/security.md, to a group of the people
CREATE ROLE regress_rr_reviewers;
GRANT regress_rr_reviewers TO regress_rr_rita, regress_rr_sam, regress_rr_desk;
GRANT USAGE ON SCHEMA idempo TO regress_rr_reviewers;
GRANT SELECT ON idempo.stats TO regress_rr_reviewers;
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
TO regress_rr_reviewers;

-- billing: its own reviewers; shop: reviewed by its application's members; open: by anyone
SELECT name, review_role FROM idempo.create_scope('billing', allowed_role => 'regress_rr_billing_app',
    review_role => 'regress_rr_billing_reviewers', audit => true, store_params => true);
SELECT name, review_role FROM idempo.create_scope('shop', allowed_role => 'regress_rr_shop_app',
    audit => true, store_params => true);
SELECT name, review_role FROM idempo.create_scope('open', audit => true);
SELECT regress.err($$SELECT idempo.create_scope('nobody', allowed_role => 'regress_rr_shop_app',
                                                 review_role => 'regress_rr_no_such_role')$$) AS review_role_must_exist;
-- without allowed_role every role with EXECUTE is the application (lookup, verify, request_review):
-- a review_role would keep nobody out of the records
SELECT regress.err($$SELECT idempo.create_scope('nobody', review_role => 'regress_rr_billing_reviewers')$$)
    AS review_role_needs_allowed_role;
SELECT regress.err($$SELECT idempo.alter_scope('open', review_role => 'regress_rr_billing_reviewers')$$)
    AS alter_too;

-- one record of each scope in review, one conflict each, all with events
SELECT s, outcome FROM unnest(ARRAY['billing', 'shop', 'open']) AS s,
    LATERAL idempo.claim(s, 'k-1', '{"amount": 10}');
SELECT s, outcome FROM unnest(ARRAY['billing', 'shop', 'open']) AS s,
    LATERAL idempo.claim(s, 'k-1', '{"amount": 99}');
SELECT s, idempo.request_review(s, 'k-1', 'check it') > 0 AS in_review
FROM unnest(ARRAY['billing', 'shop', 'open']) AS s;

-- and one operation of each in doubt: its lease ran out
SELECT s, outcome FROM unnest(ARRAY['billing', 'shop', 'open']) AS s, LATERAL idempo.claim(s, 'u-1');
SET idempo.clock_offset = '10 minutes';
SELECT s, outcome FROM unnest(ARRAY['billing', 'shop', 'open']) AS s, LATERAL idempo.claim(s, 'u-1');
RESET idempo.clock_offset;

-- What each role sees: only the scopes it reviews, through every function a reviewer reads
-- (the records: every scope's k-1 and u-1)
CREATE FUNCTION pg_temp.seen() RETURNS TABLE (what text, scopes text)
    LANGUAGE sql AS $$
    WITH p AS (SELECT array_agg(s) AS scopes, array_agg(k) AS keys
               FROM unnest(ARRAY['billing', 'shop', 'open']) AS s, unnest(ARRAY['k-1', 'u-1']) AS k)
    SELECT 'review_queue_page', string_agg(scope, ',' ORDER BY scope) FROM idempo.review_queue_page()
    UNION ALL SELECT 'conflict_queue_page', string_agg(scope, ',' ORDER BY scope) FROM idempo.conflict_queue_page()
    UNION ALL SELECT 'unknown_queue_page', string_agg(scope, ',' ORDER BY scope) FROM idempo.unknown_queue_page()
    UNION ALL SELECT 'reviewable_operations_of', string_agg(DISTINCT x.scope, ',' ORDER BY x.scope)
              FROM p, idempo.reviewable_operations_of(p.scopes, p.keys) x
    UNION ALL SELECT 'open_reviews_of', string_agg(x.scope, ',' ORDER BY x.scope)
              FROM p, idempo.open_reviews_of(p.scopes, p.keys) x
    UNION ALL SELECT 'open_conflicts_of', string_agg(x.scope, ',' ORDER BY x.scope)
              FROM p, idempo.open_conflicts_of(p.scopes, p.keys) x
    UNION ALL SELECT 'reviewable_events_of', string_agg(DISTINCT x.scope, ',' ORDER BY x.scope)
              FROM unnest(ARRAY['billing', 'shop', 'open']) AS s, idempo.reviewable_events_of(s, 'k-1') x
    UNION ALL SELECT 'reviewable_events_since', string_agg(DISTINCT scope, ',' ORDER BY scope)
              FROM idempo.reviewable_events_since('-infinity')
$$;
SET ROLE regress_rr_rita;
SELECT * FROM pg_temp.seen();
RESET ROLE;
SET ROLE regress_rr_sam;
SELECT * FROM pg_temp.seen();
RESET ROLE;
SELECT * FROM pg_temp.seen();   -- idempo's owner (here a superuser) sees every scope
SELECT s, idempo.may_review(s) FROM unnest(ARRAY['billing', 'shop', 'open', 'no-such-scope', '', NULL]) AS s;

-- Why a reviewer reads through functions: the views (idempo's owner and monitoring read them)
-- are filtered by the reading role, but a condition PostgreSQL deems leakproof runs before their
-- filter, and a CASE that compares a column and calls a function of the reader's with no column
-- in its arguments is one: a one-bit oracle per guess on every scope's rows.  Here sam, given
-- the views, learns that billing has an open review, a conflict and an unknown record.
CREATE FUNCTION pg_temp.tick() RETURNS int
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE NOTICE 'ran on a row of billing';
    RETURN 1;
END
$$;
GRANT SELECT ON idempo.review_queue, idempo.conflict_queue, idempo.unknown_queue,
    idempo.reviewable_operations TO regress_rr_sam;
SET ROLE regress_rr_sam;
SELECT count(*) FROM idempo.review_queue WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.conflict_queue WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.unknown_queue WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.reviewable_operations
WHERE CASE WHEN scope = 'billing' AND key >= 'k' THEN pg_temp.tick() ELSE 1 END = 1;
RESET ROLE;
REVOKE SELECT ON idempo.review_queue, idempo.conflict_queue, idempo.unknown_queue,
    idempo.reviewable_operations FROM regress_rr_sam;

-- Through the functions the same probe, and a function of the reader's given the columns, run
-- on no row of billing: each function filters before it returns a row, and nothing of the
-- reader's query runs inside it (no NOTICE below).
CREATE FUNCTION pg_temp.spy(scope text, key text) RETURNS boolean
    LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN
    RAISE NOTICE 'spy saw % %', scope, key;
    RETURN true;
END
$$;
SET ROLE regress_rr_sam;
SELECT count(*) FROM idempo.review_queue_page() WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.review_queue_page(scope => 'billing');
SELECT count(*) FROM idempo.conflict_queue_page() WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.conflict_queue_page(scope => 'billing', key_search => 'k');
SELECT count(*) FROM idempo.unknown_queue_page() WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.unknown_queue_page(scope => 'billing');
SELECT count(*) FROM idempo.reviewable_operations_of('{billing,billing,shop}', '{k-1,u-1,k-1}')
WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.open_reviews_of('{billing}', '{k-1}')
WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.open_conflicts_of('{billing}', '{k-1}')
WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.reviewable_events_of('billing', 'k-1')
WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.reviewable_events_since('-infinity')
WHERE CASE WHEN scope = 'billing' THEN pg_temp.tick() ELSE 1 END = 1;
SELECT count(*) FROM idempo.review_queue_page() WHERE pg_temp.spy(scope, key);
SELECT count(*) FROM idempo.reviewable_operations_of('{billing,shop}', '{k-1,k-1}') WHERE pg_temp.spy(scope, key);
RESET ROLE;
-- nor may a reviewer call the filter itself, nor the helpers
SET ROLE regress_rr_rita;
SELECT regress.err($$SELECT idempo.caller_may_review(NULL, NULL)$$) AS caller_may_review_not_granted;
SELECT regress.err($$SELECT idempo.reviewer_scopes(NULL)$$) AS reviewer_scopes_not_granted;
SELECT regress.err($$SELECT * FROM idempo.review_queue$$) AS views_not_in_the_grant_set;
RESET ROLE;

-- A page: the queue's order, keyset paging, the page's filters
SET ROLE regress_rr_rita;
SELECT scope, key, reason FROM idempo.review_queue_page(page_size => 1);
SELECT scope, key FROM idempo.review_queue_page(after_opened_at => (SELECT opened_at FROM idempo.review_queue_page(page_size => 1)),
                                                after_id => (SELECT id FROM idempo.review_queue_page(page_size => 1)));
SELECT count(*) FROM idempo.review_queue_page(reason => 'retention_expired');
SELECT count(*) FROM idempo.review_queue_page(older_than => '1 day');
SELECT scope, key FROM idempo.unknown_queue_page(key_search => 'u-');
SELECT count(*) FROM idempo.unknown_queue_page(key_search => 'u-1x');
-- the next page starts after the last row shown (the two records' last attempts may be equal)
SELECT scope, key FROM idempo.unknown_queue_page(
    after_last_attempt_at => (SELECT last_attempt_at FROM idempo.unknown_queue_page(page_size => 1)),
    after_scope => (SELECT scope FROM idempo.unknown_queue_page(page_size => 1)),
    after_key => (SELECT key FROM idempo.unknown_queue_page(page_size => 1)));
RESET ROLE;

-- Decisions: a role decides only on the scopes it reviews
SET ROLE regress_rr_sam;
SELECT regress.err(stmt) AS sam_on_billing FROM (VALUES
    ($$SELECT idempo.resolve('billing', 'k-1', 'failed')$$),
    ($$SELECT idempo.release('billing', 'k-1')$$),
    ($$SELECT idempo.request_review('billing', 'k-1')$$),
    ($$SELECT idempo.lookup('billing', 'k-1')$$),
    ($$SELECT idempo.verify('billing', 'k-1', 1, true)$$),
    ($$SELECT idempo.resolve('shop', 'k-1', 'failed')$$)
) AS t(stmt);
SELECT idempo.resolve('open', 'k-1', 'failed', note => 'anyone may: no allowed_role, no review_role');
RESET ROLE;
-- (sam cannot name the conflict it may not see: for sam, conflict ids of other scopes do not exist)
SELECT id AS billing_conflict FROM idempo.conflicts WHERE scope = 'billing' \gset
SET ROLE regress_rr_sam;
SELECT regress.err($$SELECT idempo.resolve_conflict($$ || :billing_conflict || $$, 'dismissed')$$) AS sam_by_id;
RESET ROLE;

-- rita reviews billing: reads it, verifies, decides, without the application's rights
SET ROLE regress_rr_rita;
SELECT status, attempt FROM idempo.lookup('billing', 'k-1');
SELECT idempo.resolve('billing', 'k-1', 'succeeded', target_ref => 'INV-1');
SELECT idempo.resolve_conflict(:billing_conflict, 'kept_stored', note => 'the first amount stands');
SELECT regress.err($$SELECT idempo.claim('billing', 'k-2')$$) AS rita_claims;
RESET ROLE;

-- The name a decision records: the caller's own, a role it is a member of, never another's
SET ROLE regress_rr_desk;   -- desk is a member of rita (may SET ROLE to it and act as rita)
SELECT idempo.request_review('billing', 'k-1') > 0 AS desk_opens;
SELECT idempo.resolve('billing', 'k-1', 'succeeded', reviewer => 'regress_rr_rita');
SELECT regress.err($$SELECT idempo.resolve('billing', 'k-1', 'succeeded', reviewer => 'regress_rr_sam')$$) AS desk_as_sam;
SELECT regress.err($$SELECT idempo.resolve('billing', 'k-1', 'succeeded', reviewer => 'Rita Smith')$$) AS desk_as_a_name;
RESET ROLE;
SELECT scope, key, resolution, resolved_by FROM idempo.reviews WHERE resolved_at IS NOT NULL ORDER BY id;
SELECT scope, key, resolution, resolved_by FROM idempo.conflicts WHERE resolved_at IS NOT NULL ORDER BY id;
SELECT scope, key, action, CASE WHEN actor = current_user THEN '(this test''s role)' ELSE actor END AS actor
FROM idempo.events WHERE action IN ('resolve', 'request_review') ORDER BY id;

-- In resolve_conflict() and release() (PL/pgSQL, run as idempo's owner) the caller is the role
-- in effect outside them: SET ROLE's.
SELECT outcome FROM idempo.claim('billing', 'k-3', '{"amount": 1}');
SELECT outcome FROM idempo.claim('billing', 'k-3', '{"amount": 2}');
SET ROLE regress_rr_rita;
SELECT idempo.resolve_conflict((SELECT id FROM idempo.conflict_queue_page(key_search => 'k-3')), 'dismissed');
RESET ROLE;
SELECT resolved_by FROM idempo.conflicts WHERE key = 'k-3';
-- the owner may record any name (importing decisions made elsewhere): it can write the tables
SELECT outcome FROM idempo.claim('billing', 'k-3', '{"amount": 3}');
SELECT idempo.resolve_conflict((SELECT id FROM idempo.conflict_queue WHERE key = 'k-3'), 'dismissed',
                               'imported: J. Doe, 2026-11-30');
SELECT resolved_by FROM idempo.conflicts WHERE key = 'k-3' ORDER BY id DESC LIMIT 1;

-- A review_role that no longer exists: its scope is hidden from everyone but the owner, and
-- decisions are refused naming the setting; other scopes are not affected
SELECT outcome FROM idempo.claim('billing', 'k-4');
SELECT idempo.request_review('billing', 'k-4') > 0 AS opened;
ALTER ROLE regress_rr_billing_reviewers RENAME TO regress_rr_billing_reviewers_old;
SET ROLE regress_rr_rita;
SELECT * FROM pg_temp.seen();
SELECT regress.err($$SELECT idempo.resolve('billing', 'k-4', 'failed')$$) AS role_gone;
RESET ROLE;
ALTER ROLE regress_rr_billing_reviewers_old RENAME TO regress_rr_billing_reviewers;
-- review_role => '' falls back to allowed_role: rita no longer reviews billing
SELECT name, review_role FROM idempo.alter_scope('billing', review_role => '');
SET ROLE regress_rr_rita;
SELECT * FROM pg_temp.seen();
RESET ROLE;

-- In a query planned in parallel, with the scope not cached (a change to it was just seen):
-- may_review() and stored_key() read the scope as committed now, which parallel mode forbids;
-- they are PARALLEL UNSAFE so that such a query runs without workers instead of failing (XX000)
CREATE TABLE regress_rr_many AS SELECT 'k-' || i AS key FROM generate_series(1, 20000) i;
ANALYZE regress_rr_many;
SET max_parallel_workers_per_gather = 2;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SELECT name FROM idempo.alter_scope('open', description => 'cache: gone');
SELECT count(*) FILTER (WHERE idempo.may_review('open')) AS reviewable FROM regress_rr_many;
SELECT name FROM idempo.alter_scope('open', description => 'cache: gone again');
SELECT count(DISTINCT idempo.stored_key('open', key)) AS keys FROM regress_rr_many;
RESET max_parallel_workers_per_gather;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;
DROP TABLE regress_rr_many;

-- A key searched in a hash_keys scope is the whole key, compared by its digest (or the digest
-- itself): never a prefix, which would let a reader guess a key a character at a time
SELECT name FROM idempo.create_scope('vault', hash_keys => true);
SELECT outcome FROM idempo.claim('vault', 'secret-1');
SET idempo.clock_offset = '10 minutes';
SELECT outcome FROM idempo.claim('vault', 'secret-1');
RESET idempo.clock_offset;
SELECT idempo.stored_key('vault', 'secret-1') AS digest \gset
SET ROLE regress_rr_sam;
SELECT n, count(x.key) AS found FROM unnest(ARRAY['secret-1', 'secret', 's', :'digest', left(:'digest', 8)])
        WITH ORDINALITY AS t(q, n)
    LEFT JOIN LATERAL idempo.unknown_queue_page(scope => 'vault', key_search => t.q) x ON true
GROUP BY t.n ORDER BY t.n;
RESET ROLE;

-- check_reviewer() is idempo's own: nobody else may execute it
SET ROLE regress_rr_rita;
SELECT regress.err($$SELECT idempo.check_reviewer('open', 'k-1', 'regress_rr_sam', 'resolve')$$) AS not_granted;
RESET ROLE;

REVOKE regress_rr_billing_app, regress_rr_shop_app, regress_rr_rita, regress_rr_sam, regress_rr_desk
    FROM current_user;
GRANT regress_rr_reviewers TO current_user;   -- DROP OWNED needs it where the role is no superuser
DROP OWNED BY regress_rr_reviewers;
DROP ROLE regress_rr_desk, regress_rr_rita, regress_rr_sam, regress_rr_reviewers,
    regress_rr_billing_reviewers, regress_rr_billing_app, regress_rr_shop_app;
