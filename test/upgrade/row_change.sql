-- The one change ALTER EXTENSION idempo UPDATE makes to rows (from 0.1.0 or 0.2.0: 0.3.0 and later
-- change none; the condition on extversion below),
-- written independently of the update script: an unknown attempt's last_attempt_at becomes the end
-- of the lease it had (the scope's, after the claim: the later of its end on the UTC calendar and
-- its end as 0.2.0 measured it), where verify()'s settle window starts in 0.3.0.  test/upgrade/run and test/packaging/fresh.sh run it before the update
-- in a transaction they roll back, digest the rows (digest_query.sql), and want that digest after.
\o /dev/null
UPDATE idempo.operations o
   SET last_attempt_at = GREATEST(
         -- the lease on the UTC calendar, as 0.3.0 counts it
         ((o.last_attempt_at AT TIME ZONE 'UTC') + s.lease) AT TIME ZONE 'UTC',
         -- the lease as 0.1.0/0.2.0 counted it: a month 30 days, a year 12 of them
         -- (in seconds: a day of the session's time zone need not be 24 hours)
         o.last_attempt_at
           + make_interval(secs => 86400 * (30 * (12 * extract(year FROM s.lease) + extract(month FROM s.lease))
                                            + extract(day FROM s.lease))
                                   + extract(epoch FROM s.lease - date_trunc('day', s.lease))))
  FROM idempo.scopes s
 WHERE s.name = o.scope AND o.status = 'unknown'
   AND (SELECT extversion FROM pg_extension WHERE extname = 'idempo') IN ('0.1.0', '0.2.0');
\o
