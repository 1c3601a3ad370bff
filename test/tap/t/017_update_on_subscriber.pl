# ALTER EXTENSION idempo UPDATE on a logical replication subscriber of idempo's records.  The
# update from 0.2.0 moves the last_attempt_at of unknown attempts to their lease's end (where
# verify()'s settle window starts in 0.3.0).  On the subscriber those rows are the publisher's:
# the publisher's own update moves them and its UPDATE is replicated.  Updated first, the
# publisher's moved rows arrive before the subscriber's own update, which must not move them
# again (a second lease later than the publisher says).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pub = PostgreSQL::Test::Cluster->new('publisher');
$pub->init(allows_streaming => 'logical');
$pub->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.worker_enabled = off
});
$pub->start;

my $sub = PostgreSQL::Test::Cluster->new('subscriber');
$sub->init;
$sub->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.worker_enabled = off
});
$sub->start;

# Both at 0.2.0, an attempt that 0.2.0's library made unknown when its 5-minute lease ran out:
# it keeps the claim's time in last_attempt_at.
$pub->safe_psql('postgres', q{
CREATE EXTENSION idempo VERSION '0.2.0';
SELECT idempo.create_scope('s', retention => '1 day', lease => '5 minutes');
SELECT idempo.claim('s', 'lost');
UPDATE idempo.operations
   SET status = 'unknown', lease_expires_at = NULL,
       first_seen_at = '2026-03-01 12:00+00', last_attempt_at = '2026-03-01 12:00+00'
 WHERE scope = 's' AND key = 'lost';
CREATE PUBLICATION idempo_pub
    FOR TABLE idempo.scopes, idempo.operations, idempo.reviews, idempo.conflicts, idempo.events;
});
$sub->safe_psql('postgres', q{CREATE EXTENSION idempo VERSION '0.2.0'});
my $pub_connstr = $pub->connstr . ' dbname=postgres';
$sub->safe_psql('postgres',
	"CREATE SUBSCRIPTION idempo_sub CONNECTION '$pub_connstr' PUBLICATION idempo_pub");
$sub->wait_for_subscription_sync($pub, 'idempo_sub');

my $last_attempt = q{SELECT last_attempt_at AT TIME ZONE 'UTC' FROM idempo.operations
                     WHERE scope = 's' AND key = 'lost'};
is($sub->safe_psql('postgres', $last_attempt), '2026-03-01 12:00:00',
   'the subscriber has the publisher\'s unknown attempt, at the claim\'s time');

# The publisher is updated first: its row moves to the lease's end, and the move is replicated.
$pub->safe_psql('postgres', 'ALTER EXTENSION idempo UPDATE');
is($pub->safe_psql('postgres', $last_attempt), '2026-03-01 12:05:00',
   'the publisher\'s update moves last_attempt_at to the end of the 5-minute lease');
$pub->wait_for_catchup('idempo_sub');
is($sub->safe_psql('postgres', $last_attempt), '2026-03-01 12:05:00',
   'the move is replicated to the subscriber');

# Then the subscriber: its copy of the row stays as the publisher has it.
$sub->safe_psql('postgres', 'ALTER EXTENSION idempo UPDATE');
is($sub->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'idempo'}),
   $pub->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'idempo'}),
   'the subscriber is updated to the publisher\'s version');
is($sub->safe_psql('postgres', $last_attempt), '2026-03-01 12:05:00',
   'the subscriber\'s update does not move the publisher\'s row a second time');

# Replication goes on after both updates.
$pub->safe_psql('postgres', q{SELECT idempo.claim('s', 'after-update')});
$pub->wait_for_catchup('idempo_sub');
is($sub->safe_psql('postgres', q{SELECT status FROM idempo.operations WHERE key = 'after-update'}),
   'in_progress', 'records claimed on the updated publisher reach the updated subscriber');

# A database that is not subscribed (the publisher) is moved by its own update: shown above.
# One that stops being subscribed is its own again: dropping the subscription and updating
# from 0.2.0 anew moves its rows (the same database, the extension created afresh).
$sub->safe_psql('postgres', q{
DROP SUBSCRIPTION idempo_sub;
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo;
CREATE EXTENSION idempo VERSION '0.2.0';
SELECT idempo.create_scope('s', retention => '1 day', lease => '5 minutes');
SELECT idempo.claim('s', 'lost');
UPDATE idempo.operations
   SET status = 'unknown', lease_expires_at = NULL,
       first_seen_at = '2026-03-01 12:00+00', last_attempt_at = '2026-03-01 12:00+00'
 WHERE scope = 's' AND key = 'lost';
ALTER EXTENSION idempo UPDATE;
});
is($sub->safe_psql('postgres', $last_attempt), '2026-03-01 12:05:00',
   'once unsubscribed, the database\'s own update moves its rows');

done_testing();
