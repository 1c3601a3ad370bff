# Conflicts survive the rollback of the claim's transaction without needing a free worker slot.
# max_worker_processes is sized by the rule in docs/operations.md and no more: the launcher, one sweeper per
# database with idempo (10 here), and one for the launcher's look at databases without idempo.
# Before every conflicting claim the configuration is reloaded, which makes the launcher look at
# the databases again (with the old design, a background worker per conflict, 11-12 of 40
# conflicts were lost this way: the look took the slot the recorder needed).  1,000 conflicting
# claims, each rolled back, must leave 1,000 conflict rows, and no WARNING that one was kept only
# in the claim's transaction.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $databases = 10;
my $claims = $ENV{IDEMPO_DURABLE_CLAIMS} // 1000;

my $node = PostgreSQL::Test::Cluster->new('durable');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
max_worker_processes = @{[ 1 + $databases + 1 ]}
max_parallel_workers = 0
max_logical_replication_workers = 0
});
$node->start;
for my $i (1 .. $databases)
{
	$node->safe_psql('postgres', "CREATE DATABASE db$i");
	$node->safe_psql("db$i", 'CREATE EXTENSION idempo');
}
# every database with idempo has its sweeper serving it
$node->safe_psql('db1', q{
SELECT idempo.create_scope('s', store_params => true);
SELECT idempo.claim('s', 'order-1', '{"qty":1}', complete_on_commit => true);
});
$node->poll_query_until('db1', qq{
SELECT count(*) = $databases FROM idempo.workers() WHERE kind = 'sweeper' AND state <> 'starting'
}) or die 'not every database got its sweeper';
pass("$databases sweepers serve $databases databases");

# one session: reload, then a conflicting claim in a transaction that rolls back; every 100th
# time the database's sweeper is terminated first (the next claims find none until the launcher
# has started another: they hand the row over for it)
my $script = '';
for my $n (1 .. $claims)
{
	$script .= q{SELECT count(pg_terminate_backend(pid)) >= 0 AS terminated FROM pg_stat_activity
WHERE backend_type = 'idempo sweeper' AND datname = current_database();
} if $n % 100 == 50;
	$script .= qq{SELECT pg_reload_conf();
BEGIN;
SELECT outcome FROM idempo.claim('s', 'order-1', '{"qty":1, "n":$n}');
ROLLBACK;
};
}
my ($stdout, $stderr);
$node->psql('db1', $script, stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
is(scalar(() = $stdout =~ /^conflict$/mg), $claims, "$claims claims answered conflict");
$node->poll_query_until('db1', qq{SELECT count(*) = $claims FROM idempo.conflicts WHERE key = 'order-1'});
is($node->safe_psql('db1', q{SELECT count(*) FROM idempo.conflicts WHERE key = 'order-1'}), $claims,
   "$claims conflict rows after $claims rollbacks, with the sweeper terminated 10 times");
is($node->safe_psql('db1', q{SELECT count(DISTINCT incoming_params) FROM idempo.conflicts}), $claims,
   'each with its own request');
unlike($stderr, qr/recorded in the current transaction only/, 'no conflict was kept only in a rolled-back transaction');
ok(!$node->log_contains(qr/could not record a conflict/), 'the sweeper recorded every one');

my $db1_sweeper = sub {
	$node->safe_psql('db1', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempo sweeper'
							  AND datname = 'db1'});
};

# A claim holding a lock that the sweeper's round queues behind (a cycle the deadlock detector
# cannot see): the claim takes its request back after a second and records the conflict itself;
# the sweeper records it when the claim's transaction rolls back.
$node->safe_psql('db1', q{ALTER SYSTEM SET idempo.sweep_interval = '100ms'; SELECT pg_reload_conf();});
my $holder = $node->background_psql('db1');
$holder->query_safe('BEGIN');
$holder->query_safe('LOCK TABLE idempo.operations IN EXCLUSIVE MODE');
$node->poll_query_until('db1', q{SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idempo sweeper' AND datname = 'db1' AND wait_event_type = 'Lock'})
  or die 'the sweeper did not queue behind the lock';
is($holder->query_safe(q{SELECT outcome FROM idempo.claim('s', 'order-1', '{"qty":1, "n":"cycle"}')}),
   'conflict', 'a claim whose sweeper waits for the claim\'s own lock answers');
$holder->query_safe('ROLLBACK');
$holder->quit;
ok($node->poll_query_until('db1', q{SELECT count(*) = 1 FROM idempo.conflicts WHERE incoming_params->>'n' = 'cycle'}),
   'and its conflict is recorded after its rollback');

# A claim that ends (terminated) while it waits for the sweeper: the sweeper still records it.
# (the sweeper of the round above may be between two lives: stop the one that serves now)
$node->poll_query_until('db1', q{SELECT count(*) = 1 FROM idempo.workers() WHERE kind = 'sweeper'
	AND state <> 'starting' AND database_id = (SELECT oid FROM pg_database WHERE datname = 'db1')})
  or die 'no sweeper serves db1';
my $sweeper = $db1_sweeper->();
die 'no sweeper process for db1' unless $sweeper =~ /^\d+$/;
kill 'STOP', $sweeper;
my $waiter = $node->background_psql('db1', on_error_stop => 0);
$waiter->query_until(qr/started/, q{\echo started
SELECT outcome FROM idempo.claim('s', 'order-1', '{"qty":1, "n":"terminated"}');
});
# (the wait is named from PostgreSQL 17 on: wait_events.c)
my $recorded_wait = $node->safe_psql('db1', 'SHOW server_version_num') >= 170000
  ? 'IdempoConflictRecorded' : 'Extension';
$node->poll_query_until('db1', qq{SELECT count(*) = 1 FROM pg_stat_activity
	WHERE query LIKE '%"terminated"%' AND wait_event_type = 'Extension' AND wait_event = '$recorded_wait'
	  AND backend_type = 'client backend'})
  or die 'the claim did not wait for the sweeper';
$node->safe_psql('db1', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE query LIKE '%"terminated"%' AND backend_type = 'client backend' AND pid <> pg_backend_pid()});
kill 'CONT', $sweeper;
eval { $waiter->quit };    # its psql may already have exited with the lost connection (EPIPE)
ok($node->poll_query_until('db1', q{SELECT count(*) = 1 FROM idempo.conflicts WHERE incoming_params->>'n' = 'terminated'}),
   'a claim terminated while waiting: its conflict is recorded');

my $log_offset = -s $node->logfile;
$node->stop;
# A sweeper caught in the middle of a round is terminated as PostgreSQL terminates any worker
# (its transaction rolls back, the next sweep redoes it): that FATAL line is PostgreSQL's own and
# depends on timing; any other is ours.
my @fatal = grep { /FATAL/ && !/FATAL:  terminating background worker "idempo sweeper" due to administrator command/ }
  split /\n/, substr(slurp_file($node->logfile), $log_offset);
is(join("\n", @fatal), '', 'a clean shutdown logs no FATAL line but the termination of a busy sweeper');
ok(!$node->log_contains(qr/could not record a conflict/), 'nothing failed to record');
done_testing();
