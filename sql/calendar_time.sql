-- Durations follow the calendar: retention, lease, verify_settle and remember are added to a
-- time as timestamptz + interval does with TimeZone 'UTC' (months and days on the UTC date), in
-- claims, in the sweep and in alter_scope() alike, whatever the session's TimeZone.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;
SET TimeZone = 'Europe/Berlin';  -- not UTC: the rule must not depend on it

-- A key remembered for a year is remembered 365 or 366 days, not 360: claimed again on day
-- 363 it answers 'expired' and its action does not run again.
SELECT name FROM idempo.create_scope('annual', retention => '1 hour', remember => '1 year');
SELECT outcome FROM idempo.claim('annual', 'a-1', complete_on_commit => true);
SELECT outcome FROM idempo.claim('annual', 'a-2', complete_on_commit => true);
SET idempo.clock_offset = '363 days';
SELECT outcome, status FROM idempo.claim('annual', 'a-1');
-- the sweep keeps the other one just as long
SELECT purged FROM idempo.sweep();
SELECT key, sweep_at = ((expires_at AT TIME ZONE 'UTC') + interval '1 year') AT TIME ZONE 'UTC' AS one_year
FROM idempo.operations WHERE scope = 'annual' ORDER BY key;
SELECT outcome FROM idempo.claim('annual', 'a-2');
-- a year and a day later both are forgotten
SET idempo.clock_offset = '367 days';
SELECT purged FROM idempo.sweep();
SELECT outcome, attempt FROM idempo.claim('annual', 'a-1');
RESET idempo.clock_offset;

-- A month from January 31 ends on February 28 (as timestamptz + interval '1 month' does), not
-- 30 days later on March 2.
SELECT name FROM idempo.create_scope('monthly', retention => '1 hour', remember => '1 month');
SELECT outcome FROM idempo.claim('monthly', 'm-1', complete_on_commit => true);
SELECT outcome FROM idempo.claim('monthly', 'm-2', complete_on_commit => true);
UPDATE idempo.operations
   SET completed_at = '2027-01-31 11:00+00', expires_at = '2027-01-31 12:00+00', sweep_at = '2027-01-31 12:00+00'
 WHERE scope = 'monthly';
SELECT set_config('idempo.clock_offset', (timestamptz '2027-02-01 00:00+00' - now())::text, false) IS NOT NULL AS set;
SELECT purged FROM idempo.sweep();
SELECT key, sweep_at AT TIME ZONE 'UTC' AS forgotten_at FROM idempo.operations WHERE scope = 'monthly' ORDER BY key;
-- on February 28 before noon it is still remembered; on March 1 it is forgotten, by a claim
-- and by the sweep alike
SELECT set_config('idempo.clock_offset', (timestamptz '2027-02-28 06:00+00' - now())::text, false) IS NOT NULL AS set;
SELECT outcome FROM idempo.claim('monthly', 'm-1');
SELECT purged FROM idempo.sweep();
SELECT set_config('idempo.clock_offset', (timestamptz '2027-03-01 00:00+00' - now())::text, false) IS NOT NULL AS set;
SELECT outcome, attempt FROM idempo.claim('monthly', 'm-1');
SELECT purged FROM idempo.sweep();
SELECT key, status FROM idempo.operations WHERE scope = 'monthly' ORDER BY key;
RESET idempo.clock_offset;

-- alter_scope() reschedules remembered keys with the same arithmetic: the new sweep_at is the
-- instant a claim decides with.
SELECT outcome FROM idempo.claim('monthly', 'm-3', complete_on_commit => true);
UPDATE idempo.operations
   SET completed_at = '2027-01-31 11:00+00', expires_at = '2027-01-31 12:00+00', sweep_at = '2027-02-28 12:00+00'
 WHERE scope = 'monthly' AND key = 'm-3';
SELECT remember FROM idempo.alter_scope('monthly', remember => '1 mon 1 day');
SELECT sweep_at AT TIME ZONE 'UTC' AS forgotten_at FROM idempo.operations WHERE scope = 'monthly' AND key = 'm-3';
SELECT set_config('idempo.clock_offset', (timestamptz '2027-02-28 18:00+00' - now())::text, false) IS NOT NULL AS set;
SELECT outcome FROM idempo.claim('monthly', 'm-3');
SELECT set_config('idempo.clock_offset', (timestamptz '2027-03-01 18:00+00' - now())::text, false) IS NOT NULL AS set;
SELECT outcome, attempt FROM idempo.claim('monthly', 'm-3');
RESET idempo.clock_offset;

-- A day is 24 hours, also across a daylight saving change of the session's TimeZone (Berlin
-- moves its clocks on 2027-03-28): a day after 2027-03-27 12:00 UTC is 2027-03-28 12:00 UTC.
SELECT name FROM idempo.create_scope('daily', retention => '1 hour', remember => '2 days');
SELECT outcome FROM idempo.claim('daily', 'd-1', complete_on_commit => true);
UPDATE idempo.operations
   SET completed_at = '2027-03-27 11:00+00', expires_at = '2027-03-27 12:00+00', sweep_at = '2027-03-29 12:00+00'
 WHERE scope = 'daily';
SELECT remember FROM idempo.alter_scope('daily', remember => '1 day');
SELECT sweep_at AT TIME ZONE 'UTC' AS forgotten_at FROM idempo.operations WHERE scope = 'daily';
SELECT set_config('idempo.clock_offset', (timestamptz '2027-03-28 11:30+00' - now())::text, false) IS NOT NULL AS set;
SELECT outcome FROM idempo.claim('daily', 'd-1');
SELECT purged FROM idempo.sweep();
RESET idempo.clock_offset;

-- Unfinished work goes to review a calendar month after it was first seen; a shorter retention
-- reschedules it to that instant.
SELECT name FROM idempo.create_scope('review', retention => '2 months', lease => '1 hour');
SELECT outcome FROM idempo.claim('review', 'r-1');
-- first seen on January 31, its attempt's outcome unknown: due for review on March 31
UPDATE idempo.operations SET status = 'unknown', first_seen_at = '2027-01-31 12:00+00',
                             last_attempt_at = '2027-01-31 12:00+00', lease_expires_at = NULL,
                             sweep_at = '2027-03-31 12:00+00'
 WHERE scope = 'review';
SELECT retention FROM idempo.alter_scope('review', retention => '1 month');
SELECT sweep_at AT TIME ZONE 'UTC' AS review_at FROM idempo.operations WHERE scope = 'review';
SELECT set_config('idempo.clock_offset', (timestamptz '2027-02-28 06:00+00' - now())::text, false) IS NOT NULL AS set;
SELECT outcome, status FROM idempo.claim('review', 'r-1');
SELECT set_config('idempo.clock_offset', (timestamptz '2027-03-01 00:00+00' - now())::text, false) IS NOT NULL AS set;
SELECT outcome, status FROM idempo.claim('review', 'r-1');
RESET idempo.clock_offset;

-- The clock offset follows the calendar too.
SET idempo.clock_offset = '1 mon';
SELECT idempo.now() - now() BETWEEN interval '28 days' AND interval '31 days 1 minute' AS one_month;
RESET idempo.clock_offset;

SELECT * FROM idempo.check_consistency();
RESET TimeZone;

-- Every part of a scope's intervals must run forward: '1 mon -29 days' is 1 day in total, but
-- on the calendar a record written on 1 March would expire on 31 January, before it began.
SELECT regress.err($$SELECT idempo.create_scope('backwards', retention => '1 mon -29 days')$$);
SELECT regress.err($$SELECT idempo.create_scope('backwards', retention => '1 hour', remember => '1 mon -29 days')$$);
SELECT regress.err($$SELECT idempo.create_scope('backwards', retention => '2 days', lease => '1 day -1 hour')$$);
SELECT regress.err($$SELECT idempo.create_scope('backwards', retention => '1 day', verify_settle => '-1 day 25 hours')$$);
SELECT count(*) FROM idempo.scopes WHERE name = 'backwards';

-- alter_scope() compares remember as written: '30 days' and '1 mon' are equal as intervals
-- but not on the calendar, so switching between them reschedules the remembered keys.
SELECT name FROM idempo.create_scope('thirty', retention => '1 hour', remember => '30 days');
SELECT outcome FROM idempo.claim('thirty', 't-1', complete_on_commit => true);
UPDATE idempo.operations
   SET completed_at = '2027-01-01 11:00+00', expires_at = '2027-01-01 12:00+00', sweep_at = '2027-01-31 12:00+00'
 WHERE scope = 'thirty';
SELECT remember FROM idempo.alter_scope('thirty', remember => '1 mon');
SELECT sweep_at AT TIME ZONE 'UTC' AS forgotten_at FROM idempo.operations WHERE scope = 'thirty';
SELECT set_config('idempo.clock_offset', (timestamptz '2027-02-01 06:00+00' - now())::text, false) IS NOT NULL AS set;
SELECT outcome FROM idempo.claim('thirty', 't-1');
RESET idempo.clock_offset;
