-- The one change ALTER EXTENSION idempo UPDATE (from 0.1.0 or 0.2.0 to 0.3.0) makes to rows,
-- written independently of the update script: an unknown attempt's last_attempt_at becomes the end
-- of the lease it had (the scope's, after the claim, on the UTC calendar), where verify()'s settle
-- window starts in 0.3.0.  test/upgrade/run and test/packaging/fresh.sh run it before the update
-- in a transaction they roll back, digest the rows (digest_query.sql), and want that digest after.
\o /dev/null
UPDATE idempo.operations o
   SET last_attempt_at = ((o.last_attempt_at AT TIME ZONE 'UTC') + s.lease) AT TIME ZONE 'UTC'
  FROM idempo.scopes s
 WHERE s.name = o.scope AND o.status = 'unknown';
\o
