# ALTER EXTENSION idempo UPDATE on a logical replication subscriber of idempo's records.  The
# update from 0.2.0 moves the last_attempt_at of unknown attempts to their lease's end (where
# verify()'s settle window starts in 0.3.0).  On the subscriber those rows are the publisher's:
# the publisher's own update moves them and its UPDATE is replicated.  Updated first, the
# publisher's moved rows arrive before the subscriber's own update, which must not move them
# again (a second lease later than the publisher says).  Updated last, the publisher's move
# arrives after.  Either way the subscriber's update warns: on a migration target whose
# publisher is never updated, the rows keep the claim's time (docs/upgrading.md).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# SQL that installs idempo 0.2.0 with scope 's' (its lease LEASE) and key 'lost' claimed at AT and
# left unknown by 0.2.0's library when the lease ran out: last_attempt_at keeps the claim's time.
sub old_unknown
{
	my ($retention, $lease, $at) = @_;
	return qq{
CREATE EXTENSION idempo VERSION '0.2.0';
SELECT idempo.create_scope('s', retention => '$retention', lease => '$lease');
SELECT idempo.claim('s', 'lost');
UPDATE idempo.operations
   SET status = 'unknown', lease_expires_at = NULL,
       first_seen_at = '$at', last_attempt_at = '$at'
 WHERE scope = 's' AND key = 'lost';
};
}
my $publish = q{
CREATE PUBLICATION %s
    FOR TABLE idempo.scopes, idempo.operations, idempo.reviews, idempo.conflicts, idempo.events;
};

my $pub = PostgreSQL::Test::Cluster->new('publisher');
$pub->init(allows_streaming => 'logical');
$pub->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.worker_enabled = off
});
$pub->start;

my $sub = PostgreSQL::Test::Cluster->new('subscriber');
$sub->init;
# several subscriptions in turn (each an apply worker, and table sync workers while it starts)
$sub->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.worker_enabled = off
max_worker_processes = 16
max_logical_replication_workers = 8
});
$sub->start;

# Both at 0.2.0, an attempt that 0.2.0's library made unknown when its 5-minute lease ran out:
# it keeps the claim's time in last_attempt_at.
$pub->safe_psql('postgres', old_unknown('1 day', '5 minutes', '2026-03-01 12:00+00') . sprintf($publish, 'idempo_pub'));
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

# Why docs/upgrading.md says to update the subscriber first: a change to idempo.scopes on the
# updated publisher stops the subscriber's apply worker (0.3.0's new columns of scopes are missing
# there) until the subscriber is updated; the claim below reaches it only after its update.
my $log_offset = -s $sub->logfile;
$pub->safe_psql('postgres', q{SELECT idempo.create_scope('t', retention => '1 day')});
$sub->wait_for_log(
	qr/logical replication target relation "idempo.scopes" is missing replicated columns/, $log_offset);
pass('a scope change of the updated publisher stops a subscriber still at 0.2.0');

# Then the subscriber: its copy of the row stays as the publisher has it, and the update says
# that it left the unknown operations to the publisher (they would keep the claim's time if the
# publisher's update never arrived here).
my ($rc, $out, $err) = (undef, '', '');
$rc = $sub->psql('postgres', 'ALTER EXTENSION idempo UPDATE', stdout => \$out, stderr => \$err);
is($rc, 0, 'the subscriber is updated');
like($err,
	qr/WARNING:  the update left last_attempt_at of 1 unknown operation as the publisher sends it: database "postgres" receives idempo.operations from subscription "idempo_sub"/,
	'the subscriber\'s update says it left the unknown operations to the publisher');
like($err, qr/HINT:  Update the publisher too/, '... and what to do');
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
is($sub->safe_psql('postgres', q{SELECT string_agg(name, ',' ORDER BY name) FROM idempo.scopes}),
   's,t', 'the scope change that stopped it arrived too');

# The order docs/upgrading.md recommends, the subscriber first (a subscriber still at 0.2.0 stops
# applying at the updated publisher's first change to idempo.scopes, whose new columns it lacks):
# its update leaves the row at the claim's time, the publisher's moves it, once, here too.
$pub->safe_psql('postgres', 'CREATE DATABASE pub_b');
$pub->safe_psql('pub_b', old_unknown('1 day', '5 minutes', '2026-03-01 12:00+00') . sprintf($publish, 'pub_b'));
$sub->safe_psql('postgres', 'CREATE DATABASE sub_b');
$sub->safe_psql('sub_b', q{CREATE EXTENSION idempo VERSION '0.2.0'});
my $pub_b_connstr = $pub->connstr . ' dbname=pub_b';
$sub->safe_psql('sub_b', "CREATE SUBSCRIPTION sub_b CONNECTION '$pub_b_connstr' PUBLICATION pub_b");
$sub->wait_for_subscription_sync($pub, 'sub_b', 'sub_b');
$rc = $sub->psql('sub_b', 'ALTER EXTENSION idempo UPDATE', stdout => \$out, stderr => \$err);
like($err, qr/receives idempo.operations from subscription "sub_b"/,
	'subscriber first: its update warns');
is($sub->safe_psql('sub_b', $last_attempt), '2026-03-01 12:00:00',
	'subscriber first: its update leaves the row at the claim\'s time');
$pub->safe_psql('pub_b', 'ALTER EXTENSION idempo UPDATE');
$pub->wait_for_catchup('sub_b');
is($sub->safe_psql('sub_b', $last_attempt), '2026-03-01 12:05:00',
	'subscriber first: the publisher\'s update moves it, once');
$sub->safe_psql('sub_b', 'DROP SUBSCRIPTION sub_b');

# A migration target: subscribed to a publisher that is never updated (it is retired).  Its update
# leaves the rows to a publisher's update that never comes; once the subscription is dropped they
# still hold the claim's time, and the statement of docs/upgrading.md ("Logical replication")
# moves them.
$pub->safe_psql('postgres', 'CREATE DATABASE old_primary');
$pub->safe_psql('old_primary', old_unknown('1 year', '1 month', '2026-01-31 12:00+00') . sprintf($publish, 'old_pub'));
$sub->safe_psql('postgres', 'CREATE DATABASE target');
$sub->safe_psql('target', q{CREATE EXTENSION idempo VERSION '0.2.0'});
my $old_connstr = $pub->connstr . ' dbname=old_primary';
$sub->safe_psql('target',
	"CREATE SUBSCRIPTION target_sub CONNECTION '$old_connstr' PUBLICATION old_pub");
$sub->wait_for_subscription_sync($pub, 'target_sub', 'target');
$rc = $sub->psql('target', 'ALTER EXTENSION idempo UPDATE', stdout => \$out, stderr => \$err);
like($err, qr/receives idempo.operations from subscription "target_sub"/,
	'a migration target updated while subscribed is warned');
$sub->safe_psql('target', 'DROP SUBSCRIPTION target_sub');
is($sub->safe_psql('target', $last_attempt), '2026-01-31 12:00:00',
	'its rows keep the claim\'s time: the publisher never moved them');
# docs/upgrading.md's statement, as written there
$sub->safe_psql('target', q{
UPDATE idempo.operations AS o
   SET last_attempt_at = GREATEST(
         ((o.last_attempt_at AT TIME ZONE 'UTC') + s.lease) AT TIME ZONE 'UTC',
         ((o.last_attempt_at AT TIME ZONE 'UTC') + (s.lease - make_interval(months => m.n))
          + make_interval(days => 30 * m.n)) AT TIME ZONE 'UTC')
  FROM idempo.scopes AS s,
       LATERAL (SELECT (12 * extract(year FROM s.lease) + extract(month FROM s.lease))::int AS n) AS m
 WHERE s.name = o.scope AND o.status = 'unknown';
});
is($sub->safe_psql('target', $last_attempt), '2026-03-02 12:00:00',
	'the documented statement moves them to the lease\'s end as 0.2.0 counted it (30-day month)');

# A database that receives only idempo.scopes writes its own records (src/replication.c): its
# update moves them, and says nothing.
$pub->safe_psql('old_primary', 'CREATE PUBLICATION scopes_only FOR TABLE idempo.scopes');
$sub->safe_psql('postgres', 'CREATE DATABASE own_records');
$sub->safe_psql('own_records', q{CREATE EXTENSION idempo VERSION '0.2.0'});
$sub->safe_psql('own_records',
	"CREATE SUBSCRIPTION scopes_sub CONNECTION '$old_connstr' PUBLICATION scopes_only");
$sub->wait_for_subscription_sync($pub, 'scopes_sub', 'own_records');
$sub->safe_psql('own_records', q{
SELECT idempo.claim('s', 'lost');
UPDATE idempo.operations
   SET status = 'unknown', lease_expires_at = NULL,
       first_seen_at = '2026-01-31 12:00+00', last_attempt_at = '2026-01-31 12:00+00'
 WHERE scope = 's' AND key = 'lost';
});
$rc = $sub->psql('own_records', 'ALTER EXTENSION idempo UPDATE', stdout => \$out, stderr => \$err);
is($err, '', 'a database that receives only the scopes is updated without a warning');
is($sub->safe_psql('own_records', $last_attempt), '2026-03-02 12:00:00',
	'and its own unknown operation is moved to the lease\'s end');
$sub->safe_psql('own_records', 'DROP SUBSCRIPTION scopes_sub');

# A database that is not subscribed (the publisher) is moved by its own update: shown above.
# One that stops being subscribed is its own again: dropping the subscription and updating
# from 0.2.0 anew moves its rows (the same database, the extension created afresh).
$sub->safe_psql('postgres', q{
DROP SUBSCRIPTION idempo_sub;
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo;
} . old_unknown('1 day', '5 minutes', '2026-03-01 12:00+00') . q{
ALTER EXTENSION idempo UPDATE;
});
is($sub->safe_psql('postgres', $last_attempt), '2026-03-01 12:05:00',
   'once unsubscribed, the database\'s own update moves its rows');

done_testing();
