# Crashes: kill -9 of a sweeper (the server reinitializes, the worker comes back and carries
# on) and kill -9 of the postmaster while clients claim and complete in a loop (after the
# restart every committed claim is there with its business write, no uncommitted one is,
# and the worker is back).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = PostgreSQL::Test::Cluster->new('crash');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.sweep_interval = '200ms'
restart_after_crash = on
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('c', retention => '3 seconds', lease => '1 second', verify_settle => '1 second');
SELECT idempo.create_scope('orders', retention => '1 day');
CREATE TABLE shipments (key text PRIMARY KEY, at timestamptz DEFAULT now());
});

sub sweeper_pid
{
	return $node->safe_psql('postgres',
		q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempo sweeper' AND datname = 'postgres'});
}

$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempo sweeper'})
  or die 'no sweeper';

# kill -9 of the sweeper
my $pid = sweeper_pid();
kill 'KILL', $pid;
$node->poll_query_until('postgres', qq{
SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempo sweeper' AND pid <> $pid
}) or die 'the sweeper did not come back';
pass('after kill -9 of the sweeper, a new one runs');
ok($node->log_contains(qr/idempo sweeper.*terminated by signal 9/), 'the postmaster saw the sweeper die');
$node->safe_psql('postgres', q{SELECT idempo.claim('c', 'after-kill')});
$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempo.review_queue WHERE key = 'after-kill'})
  or die 'not swept after the restart';
pass('the new sweeper carries on sweeping');

# kill -9 of the postmaster while two clients claim, write and complete in one transaction
my @clients;
my $tempdir = PostgreSQL::Test::Utils::tempdir;
for my $c (1 .. 2)
{
	my $file = "$tempdir/client$c.sql";
	open(my $fh, '>', $file) or die "cannot write $file: $!";
	print $fh qq{BEGIN;
SELECT idempo.claim('orders', 'c$c-$_', jsonb_build_object('n', $_));
INSERT INTO shipments (key) VALUES ('c$c-$_');
SELECT idempo.complete('orders', 'c$c-$_', 1, jsonb_build_object('shipment', 'c$c-$_'), 'c$c-$_');
COMMIT;
} for 1 .. 50000;
	close($fh);
	push @clients, IPC::Run::start(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-f', $file ],
		'>', '/dev/null', '2>', '/dev/null');
}
# and one transaction that claimed and never commits
my $open = $node->background_psql('postgres');
$open->query_safe(q{BEGIN});
$open->query_safe(q{SELECT idempo.claim('orders', 'never-committed')});
$open->query_safe(q{INSERT INTO shipments (key) VALUES ('never-committed')});

$node->poll_query_until('postgres', q{SELECT count(*) >= 500 FROM shipments}) or die 'the clients did not run';
my $before = $node->safe_psql('postgres', q{SELECT count(*) FROM shipments});
my $postmaster = $node->{_pid};
my @children = grep { /^\d+$/ } split /\n/, `pgrep -P $postmaster`;
$node->kill9;

# the old backends notice the postmaster's death and leave; only then can it start again
for (1 .. 600)
{
	last unless grep { kill(0, $_) } @children;
	usleep(100_000);
}
ok(!(grep { kill(0, $_) } @children), 'every process of the killed server has exited');
$_->kill_kill for @clients;
eval { $open->quit };
ok($node->start(fail_ok => 1), 'the server restarted after kill -9 of the postmaster');

my $after = $node->safe_psql('postgres', q{SELECT count(*) FROM shipments});
cmp_ok($after, '>=', $before, "commits seen before the crash are still there ($after shipments)");
is($node->safe_psql('postgres', q{
SELECT count(*) FROM shipments s
FULL JOIN (SELECT * FROM idempo.operations WHERE scope = 'orders') o ON o.key = s.key
WHERE o.key IS NULL OR s.key IS NULL OR o.status <> 'succeeded' OR o.target_ref <> s.key
}), '0', 'every committed claim has its business write and completion, and nothing else is there');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.operations WHERE key = 'never-committed'}), '0',
   'the uncommitted claim is gone');
is($node->safe_psql('postgres', q{SELECT outcome FROM idempo.claim('orders', 'c1-1', '{"n": 1}')}), 'replay',
   'a redelivery after the crash replays');

$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempo sweeper'})
  or die 'the worker did not come back';
$node->safe_psql('postgres', q{SELECT idempo.claim('c', 'after-restart')});
$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempo.review_queue WHERE key = 'after-restart'})
  or die 'not swept after the restart';
pass('the worker is back and sweeping after the restart');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempo.check_consistency()'), '0', 'consistent');
$node->stop;
done_testing();
