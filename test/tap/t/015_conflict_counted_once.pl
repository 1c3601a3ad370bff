# A sweeper that is terminated right after committing a conflict row must not make the conflict
# count twice (idempo.counters() counts each conflict once).  The nearest a sweeper can come to
# exiting between its commit and marking the request done: its commit waits for a synchronous
# standby that does not exist (the row is committed locally), and it is terminated there.
# PostgreSQL ends only the wait; the sweeper marks the request done before it handles the
# termination, so neither the waiting claim nor the next sweeper writes the row again.  (Were the
# request still TAKEN when the sweeper exits, the claim would take it back and count a second
# occurrence.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('once');
$node->init(allows_streaming => 1);    # max_wal_senders > 0: commits wait for synchronous standbys
# Every commit waits for a standby that never comes, but the test's sessions commit locally; the
# sweeper records conflicts with synchronous_commit = on, and does nothing else (no sweep).
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
synchronous_standby_names = 'nobody'
idempo.worker_enabled = off
});
$node->start;
my $local = 'SET synchronous_commit = local;';
$node->safe_psql('postgres', "$local CREATE EXTENSION idempo");
$node->safe_psql('postgres', qq{$local SELECT idempo.create_scope('s');
SELECT outcome FROM idempo.claim('s', 'order-1', '{"qty":1}', complete_on_commit => true);});
my $sweeper_pid = q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempo sweeper' AND datname = 'postgres'};
$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM ($sweeper_pid) s") or die 'no sweeper';

my $claim = $node->background_psql('postgres', on_error_stop => 0);
$claim->query_safe($local);
$claim->query_until(qr/started/, q{\echo started
BEGIN;
SELECT 'answer', outcome, conflict_id FROM idempo.claim('s', 'order-1', '{"qty":2}');
});
ok($node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity
	WHERE backend_type = 'idempo sweeper' AND datname = 'postgres' AND wait_event = 'SyncRep'}),
   'the sweeper committed the conflict row and waits for the synchronous standby')
  or diag($node->safe_psql('postgres', q{SELECT backend_type, datname, wait_event_type, wait_event, state, query
	FROM pg_stat_activity}));
my $old = $node->safe_psql('postgres', $sweeper_pid);
$node->safe_psql('postgres', "SELECT pg_terminate_backend($old)");

my $answer = $claim->query_safe(q{SELECT 'collected'});
like($answer, qr/answer\|conflict\|1/, 'the claim answers conflict with the row\'s id');
$claim->query_safe('ROLLBACK');
$claim->quit;

# the next sweeper takes over the database; nothing is recorded again
$node->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = ''; SELECT pg_reload_conf();});
ok($node->poll_query_until('postgres', qq{SELECT count(*) = 1 FROM ($sweeper_pid) s WHERE s.pid <> $old}),
   'a new sweeper serves the database');
# one more conflict through the new sweeper: the queue is empty behind it
is($node->safe_psql('postgres', qq{$local SELECT outcome FROM idempo.claim('s', 'order-1', '{"qty":3}')}), 'conflict',
   'a later conflict is recorded by the new sweeper');
is($node->safe_psql('postgres', q{SELECT string_agg(id || ':' || occurrences, ',' ORDER BY id) FROM idempo.conflicts}),
   '1:1,2:1', 'the terminated sweeper\'s conflict counts once');
ok($node->log_contains(qr/canceling the wait for synchronous replication and terminating connection/),
   'the sweeper was terminated in its commit\'s wait');
$node->stop;
done_testing();
