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
-- a scope named 'v' (0.2.0 checked no whitespace) stays a scope that can be altered after the update
SELECT name FROM idempo.create_scope('v', retention => '1 day', lease => '5 minutes');
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
SELECT name, lease FROM idempo.alter_scope('v', lease => '6 minutes');
DROP FUNCTION regress_claim_plain(text);
SELECT * FROM idempo.check_consistency();

-- An attempt made unknown under 0.1.0/0.2.0 kept the claim's time in last_attempt_at, but it
-- could send its request until its lease ended: the update moves last_attempt_at to the lease's
-- end (the scope's lease after the claim, on the UTC calendar), so that verify(found => false)
-- is believed only verify_settle after that, as for an attempt made unknown by 0.3.0.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo VERSION '0.2.0';
RESET client_min_messages;
SELECT name FROM idempo.create_scope('old_unknown', retention => '1 day', lease => '5 minutes',
                                     verify_settle => '1 minute');
SELECT outcome FROM idempo.claim('old_unknown', 'k');
-- as 0.2.0's library left it: claimed 3 minutes ago, its lease ran out, unknown, no lease held
UPDATE idempo.operations
   SET status = 'unknown', first_seen_at = first_seen_at - interval '3 minutes',
       last_attempt_at = last_attempt_at - interval '3 minutes', lease_expires_at = NULL
 WHERE scope = 'old_unknown';
CREATE TEMP TABLE old_unknown_before AS
SELECT last_attempt_at FROM idempo.operations WHERE scope = 'old_unknown';
ALTER EXTENSION idempo UPDATE;
SELECT o.last_attempt_at - b.last_attempt_at AS moved_by, o.status
FROM idempo.operations o, old_unknown_before b WHERE o.scope = 'old_unknown';
-- 2 minutes after the claim's settle window, 3 before the lease's: not yet proof
SELECT idempo.verify('old_unknown', 'k', 1, false);
-- after the lease's end and its settle window
SET idempo.clock_offset = '4min';
SELECT idempo.verify('old_unknown', 'k', 1, false);
RESET idempo.clock_offset;
SELECT * FROM idempo.check_consistency();

-- A lease written in months: 0.2.0 counted a month as 30 days, 0.3.0 counts it on the calendar;
-- the update takes the later end.  Claimed January 31: 0.2.0's lease ran to March 2 (the calendar
-- says February 28); claimed January 15: the calendar says February 15 (0.2.0, February 14).
-- A year is 12 such months for 0.2.0: '1 year 1 mon' from January 31, 2026 ran 390 days, to
-- February 25, 2027; the calendar says February 28, 2027 (a year counted on the calendar and its
-- month as 30 days would say March 2).  The session's time zone springs forward on February 8
-- (a POSIX rule): 30 days added in it, not in UTC, would end an hour early.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo VERSION '0.2.0';
RESET client_min_messages;
SELECT name FROM idempo.create_scope('month_lease', retention => '1 year', lease => '1 month');
SELECT name FROM idempo.create_scope('year_lease', retention => '2 years', lease => '1 year 1 month');
SELECT (idempo.claim('month_lease', k)).outcome FROM unnest('{jan31,jan15}'::text[]) k;
SELECT (idempo.claim('year_lease', 'jan31')).outcome;
UPDATE idempo.operations
   SET status = 'unknown', lease_expires_at = NULL,
       first_seen_at = CASE key WHEN 'jan31' THEN '2026-01-31 00:00+00' ELSE '2026-01-15 00:00+00' END::timestamptz,
       last_attempt_at = CASE key WHEN 'jan31' THEN '2026-01-31 00:00+00' ELSE '2026-01-15 00:00+00' END::timestamptz
 WHERE scope IN ('month_lease', 'year_lease');
SET TimeZone = 'XST5XDT,M2.2.0,M11.1.0';
ALTER EXTENSION idempo UPDATE;
SET TimeZone = 'UTC';
SELECT scope, key, last_attempt_at FROM idempo.operations
 WHERE scope IN ('month_lease', 'year_lease') ORDER BY scope, key;
RESET TimeZone;
