# The first seconds after a start, in databases no sweeper will serve: max_worker_processes = 4
# (the launcher and three sweepers) for six databases listed in idempo.databases, and conflicting
# claims rolled back in every one of them at once after the start, and again once the three
# sweepers serve (well before the launcher has gone 10 s without a slot for the other three).
# Every conflict is either kept after the rollback, under the id its claim returned, or its claim
# answers conflict_id NULL and warns that the conflict is recorded in the current transaction only;
# claim_batch answers as claim does.  (Before, a database counted as "a sweeper is coming" until
# the launcher had been without a slot for it for 10 s: its claims returned an id, handed the row
# over to a sweeper that never started, and said nothing.)  A sweeper on its way -- the last one
# stopped and the launcher starts the next at once -- is still trusted with a hand-over.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $databases = 6;
my @dbs = map { "db$_" } 1 .. $databases;
my $node = PostgreSQL::Test::Cluster->new('unserved_at_start');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
max_worker_processes = 4
max_parallel_workers = 0
max_logical_replication_workers = 0
});
$node->start;
for my $db (@dbs)
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, q{CREATE EXTENSION idempo;
SELECT idempo.create_scope('s');
SELECT outcome FROM idempo.claim('s', 'order-1', '{"qty":1}', complete_on_commit => true);});
}
$node->append_conf('postgresql.conf', "idempo.databases = '" . join(',', @dbs) . "'\n");
$node->restart;

# One conflicting claim (or claim_batch) rolled back: [database, what, conflict_id, stderr].
my @claims;
my $qty = 1;
my $claim_in = sub {
	my ($db, $batch) = @_;
	$qty++;
	my $call = $batch
	  ? qq{SELECT outcome, conflict_id FROM idempo.claim_batch('s', ARRAY['order-1'], ARRAY['{"qty":$qty}']::jsonb[])}
	  : qq{SELECT outcome, conflict_id FROM idempo.claim('s', 'order-1', '{"qty":$qty}')};
	my ($stdout, $stderr);
	$node->psql($db, "BEGIN;\n$call;\nROLLBACK;", stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
	my ($outcome, $id) = split /\|/, $stdout;
	is($outcome, 'conflict', ($batch ? 'claim_batch' : 'claim') . " $qty in $db answers conflict");
	push @claims, [ $db, ($batch ? 'claim_batch' : 'claim') . " $qty", $id // '', $stderr ];
};

# at once after the start, whatever the launcher has done yet
$claim_in->($_, 0) for @dbs;

# once the three slots have sweepers: the other three databases will have none
$node->poll_query_until('db1', q{SELECT count(*) = 3 FROM idempo.workers() WHERE kind = 'sweeper' AND state <> 'starting'})
  or die 'the three slots did not fill with sweepers';
note 'unserved databases the launcher has published so far: ',
  $node->safe_psql('db1', q{SELECT count(*) FROM idempo.workers() WHERE kind = 'unserved'});
for my $db (@dbs)
{
	$claim_in->($db, 0);
	$claim_in->($db, 1);
}

# the answers with an id, per database: each such conflict is there, the others warned
my %ids;
for my $c (@claims)
{
	push @{ $ids{ $c->[0] } }, $c->[2] if $c->[2] ne '';
}
for my $db (sort keys %ids)
{
	my $n = scalar @{ $ids{$db} };
	$node->poll_query_until($db, "SELECT count(*) = $n FROM idempo.conflicts WHERE id IN (" . join(',', @{ $ids{$db} }) . ')')
	  or note "not every conflict of $db is kept";
}
my $kept = 0;
my $warned = 0;
for my $c (@claims)
{
	my ($db, $what, $id, $stderr) = @$c;
	if ($id ne '')
	{
		$kept++;
		is($node->safe_psql($db, "SELECT count(*) FROM idempo.conflicts WHERE id = $id"), '1',
		   "$what in $db: conflict $id is kept after the rollback");
		unlike($stderr, qr/recorded in the current transaction only/, "$what in $db: no warning");
	}
	else
	{
		$warned++;
		like($stderr, qr/WARNING:  conflict on key "order-1" in scope "s" is recorded in the current transaction only/,
			 "$what in $db: no conflict_id, and a warning that the conflict lives in the transaction only");
	}
}
# both answers were seen: the served databases' sweepers recorded theirs, the others' claims warned
ok($kept >= 6, "$kept claims kept their conflict");
ok($warned >= 6, "$warned claims warned and returned no conflict_id");

# The other side of the rule: a sweeper on its way is trusted.  A served database's sweeper is
# terminated while the launcher is held (SIGSTOP), so that the next one is not started yet; a
# reviewer's lock on the conflict's row makes the recorder worker give up, so the claim writes the
# row itself.  The launcher starts a sweeper again at once for a database whose sweeper stopped:
# the claim hands the row over (its id, no warning), and after the rollback the next sweeper
# records it.
my $served = $node->safe_psql('db1', q{SELECT min(d.datname) FROM idempo.workers() w
	JOIN pg_database d ON d.oid = w.database_id WHERE w.kind = 'sweeper'});
my $x = $node->safe_psql($served, q{SELECT conflict_id FROM idempo.claim('s', 'order-1', '{"qty":100}')});
is($node->safe_psql($served, "SELECT occurrences FROM idempo.conflicts WHERE id = $x"), '1',
   "a committed conflict in $served: row $x");
my $reviewer = $node->background_psql($served);
$reviewer->query_safe('BEGIN');
$reviewer->query_safe("SELECT id FROM idempo.conflicts WHERE id = $x FOR UPDATE");
my $launcher = $node->safe_psql($served, q{SELECT pid FROM idempo.workers() WHERE kind = 'launcher'});
kill 'STOP', $launcher;
$node->safe_psql($served, q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	WHERE backend_type = 'idempo sweeper' AND datname = current_database()});
$node->poll_query_until($served, q{SELECT count(*) = 0 FROM idempo.workers() WHERE kind = 'sweeper'
	AND database_id = (SELECT oid FROM pg_database WHERE datname = current_database())})
  or die "the sweeper of $served did not leave";
my $claimer = $node->background_psql($served);
$claimer->query_safe('BEGIN');
$claimer->query_until(qr/started/, qq{\\echo started\nSELECT conflict_id FROM idempo.claim('s', 'order-1', '{"qty":100}');\n});
$node->poll_query_until($served, q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'client backend'
	AND wait_event_type = 'Lock' AND query LIKE '%"qty":100%' AND pid <> pg_backend_pid()})
  or die 'the claim did not wait for the reviewer';
$reviewer->query_safe('ROLLBACK');
my ($answer, $warned_here) = $claimer->query('ROLLBACK');
is($answer, $x, 'with the next sweeper on its way, the claim that wrote the row itself returns its id');
is($warned_here, 0, 'and does not warn');
kill 'CONT', $launcher;
ok($node->poll_query_until($served, "SELECT occurrences = 2 FROM idempo.conflicts WHERE id = $x"),
   'the next sweeper records it after the rollback');
$claimer->quit;
$reviewer->quit;

$node->stop;
done_testing();
