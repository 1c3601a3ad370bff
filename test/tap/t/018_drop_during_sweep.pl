# DROP EXTENSION idempo while the sweeper is in the middle of a round.  DROP EXTENSION locks the
# extension object before it drops any member; the sweeper holds that lock (ACCESS SHARE) for its
# round, so the drop waits for the round to end, and a round that waited for a drop finds the
# extension gone and the sweeper leaves quietly.  (Without it the drop went ahead and the round
# failed on the tables dropped under it: "cache lookup failed for relation", "label of an idempo
# enum type is missing", logged as a failed sweep round; or the two deadlocked.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# a started cluster that preloads idempo and sweeps every 100 ms
sub sweeping_node
{
	my $n = PostgreSQL::Test::Cluster->new(shift);
	$n->init;
	$n->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.sweep_interval = '100ms'
});
	$n->start;
	return $n;
}

my $node = sweeping_node('drop_during_sweep');
$node->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('s', lease => '1 minute');
SELECT idempo.claim('s', 'k');
});
my $sweeper_pid = q{(SELECT pid FROM pg_stat_activity
                      WHERE backend_type = 'idempo sweeper' AND datname = 'postgres')};
$node->poll_query_until('postgres', "SELECT $sweeper_pid IS NOT NULL")
  or die 'no sweeper serves the database';

# The sweeper's next round waits for idempo.operations, which a session holds.
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN; LOCK TABLE idempo.operations IN ACCESS EXCLUSIVE MODE');
ok($node->poll_query_until('postgres', qq{
SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $sweeper_pid AND NOT granted
                  AND locktype = 'relation' AND relation = 'idempo.operations'::regclass)}),
   'a sweep round waits for idempo.operations');
my $log_offset = -s $node->logfile;

# The drop, meanwhile, waits for the round: for the extension's lock, which the sweeper holds.
my $dropper = $node->background_psql('postgres');
$dropper->query_until(qr/dropping/, q{
\echo dropping
SET idempo.allow_drop_with_records = on;
DROP EXTENSION idempo;
});
my $dropper_pid = q{(SELECT pid FROM pg_stat_activity WHERE query LIKE '%DROP EXTENSION idempo%'
                      AND pid <> pg_backend_pid())};
ok($node->poll_query_until('postgres', qq{
SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $dropper_pid AND NOT granted)}),
   'DROP EXTENSION waits');
is($node->safe_psql('postgres', qq{
SELECT locktype || ' ' || coalesce(classid::regclass::text, relation::regclass::text) || ' '
       || (locktype = 'object' AND objid = (SELECT oid FROM pg_extension WHERE extname = 'idempo'))
  FROM pg_locks WHERE pid = $dropper_pid AND NOT granted}),
   'object pg_extension true', 'for the lock of the extension itself, before it has dropped anything');
is($node->safe_psql('postgres', "SELECT $sweeper_pid = ANY (pg_blocking_pids($dropper_pid))"), 't',
   'which the sweeper holds');

# The round goes on and ends; then the drop.
$holder->query_safe('ROLLBACK');
$holder->quit;
$dropper->quit;
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM pg_extension WHERE extname = 'idempo'}),
   'the extension is dropped after the round');
ok($node->poll_query_until('postgres', "SELECT $sweeper_pid IS NULL"), 'the sweeper leaves');
my $log = slurp_file($node->logfile, $log_offset);
unlike($log, qr/sweep round in database "postgres" failed/, 'no sweep round failed');
unlike($log, qr/cache lookup failed|deadlock detected/, 'nothing failed on the dropped tables');

$node->stop;

# A round that starts while a DROP EXTENSION is under way (not yet committed) waits for the
# extension's lock; when the drop commits, the round must see the extension gone and leave,
# not go on against the dropped tables.
my $node2 = sweeping_node('round_waits_for_drop');
$node2->safe_psql('postgres', q{CREATE EXTENSION idempo});
$node2->poll_query_until('postgres', "SELECT $sweeper_pid IS NOT NULL")
  or die 'no sweeper serves the database';
my $drop = $node2->background_psql('postgres');
$drop->query_safe('BEGIN; DROP EXTENSION idempo');
my $log2_offset = -s $node2->logfile;
ok($node2->poll_query_until('postgres', qq{
SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $sweeper_pid AND NOT granted
                  AND locktype = 'object' AND classid = 'pg_extension'::regclass)}),
   'a round that started during the drop waits for the extension\'s lock');
$drop->query_safe('COMMIT');
$drop->quit;
ok($node2->poll_query_until('postgres', "SELECT $sweeper_pid IS NULL"), 'the sweeper leaves after the drop');
my $log2 = slurp_file($node2->logfile, $log2_offset);
unlike($log2, qr/sweep round in database "postgres" failed/, 'the round that waited did not fail');
unlike($log2, qr/cache lookup failed|does not exist|deadlock detected/, 'nor touched the dropped tables');
$node2->stop;
done_testing();
