# More databases with idempo than worker slots: max_worker_processes = 4 (the launcher and three
# sweepers) for six databases.  A database without a sweeper must not be invisible, and a conflict
# claimed there must not be lost silently.
#  - the launcher names each database it could not serve, once, not every round;
#  - idempo.workers() lists it (kind 'unserved');
#  - a conflicting claim there whose transaction rolls back, while no recorder worker can start
#    either, warns that its conflict is kept only if the transaction commits, and answers no
#    conflict_id (an id that a rollback leaves naming no row is not returned);
#  - hundreds of such conflicts hold no slot of the shared queue: a conflict in a served database
#    is still recorded and kept after its rollback (the queue used to fill up, and such a claim
#    then waited forever);
#  - once a slot is free, the launcher starts a sweeper there, and a conflict is recorded by it
#    under the id the claim returns, without a warning.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $databases = 6;
my $node = PostgreSQL::Test::Cluster->new('unserved');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
max_worker_processes = 4
max_parallel_workers = 0
max_logical_replication_workers = 0
idempo.sweep_interval = '200ms'
});
$node->start;
$node->safe_psql('postgres', "CREATE DATABASE db$_") for 1 .. $databases;
$node->safe_psql("db$_", 'CREATE EXTENSION idempo') for 1 .. $databases;

my $sweepers = q{SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempo sweeper')};
$node->poll_query_until('postgres', "$sweepers = 3") or die 'the three slots did not fill with sweepers';
my @served = split /\n/, $node->safe_psql('postgres', q{SELECT datname FROM pg_stat_activity
	WHERE backend_type = 'idempo sweeper' ORDER BY datname});
my $db = $node->safe_psql('postgres', qq{SELECT min(datname) FROM pg_database WHERE datname LIKE 'db%'
	AND datname NOT IN (SELECT datname FROM pg_stat_activity WHERE backend_type = 'idempo sweeper')});
note "served: @served; unserved: $db";

# the launcher names the database it cannot serve, and idempo.workers() lists it
my $unserved_row = qq{SELECT (SELECT count(*) FROM idempo.workers() w JOIN pg_database d ON d.oid = w.database_id
	WHERE w.kind = 'unserved' AND d.datname = '$db')};
ok($node->poll_query_until($db, "$unserved_row = 1"), "idempo.workers() lists $db as unserved");
ok($node->log_contains(qr/idempo launcher could not (?:start a sweeper for|look whether) database "$db"/),
   "the launcher's log names $db");

# a conflicting claim there, rolled back
$node->safe_psql($db, q{SELECT idempo.create_scope('s');
SELECT outcome FROM idempo.claim('s', 'order-1', '{"qty":1}', complete_on_commit => true);});
my ($stdout, $stderr);
$node->psql($db, q{BEGIN;
SELECT outcome, conflict_id FROM idempo.claim('s', 'order-1', '{"qty":2}');
ROLLBACK;}, stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
my ($outcome, $conflict_id) = split /\|/, $stdout;
is($outcome, 'conflict', 'the claim answers conflict');
like($stderr, qr/WARNING:  conflict on key "order-1" in scope "s" is recorded in the current transaction only/,
	 'and warns that the conflict is kept only if its transaction commits');
like($stderr, qr/No idempo sweeper serves database "$db"/, 'saying why');
is($conflict_id // '', '', 'and answers no conflict_id: the row lives in the rolled-back transaction only');
is($node->safe_psql($db, 'SELECT count(*) FROM idempo.conflicts'), '0', 'no row after the rollback');

# Many more of them (300 rolled-back conflicts, one subtransaction each) hold no slot of the
# shared queue (256 slots): a conflict in a served database is still recorded at once and kept
# after its rollback (the queue used to fill up, and such a claim then waited forever).
$node->safe_psql($db, q{SET client_min_messages = error;
DO $$
BEGIN
    FOR i IN 1 .. 300 LOOP
        BEGIN
            PERFORM idempo.claim('s', 'order-1', jsonb_build_object('qty', 100 + i));
            RAISE EXCEPTION 'roll back';
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
    END LOOP;
END $$;});
my $served_db = $served[0];
$node->safe_psql($served_db, q{SELECT idempo.create_scope('s2');
SELECT outcome FROM idempo.claim('s2', 'k', '{"q":1}', complete_on_commit => true);});
my ($out2, $err2);
$node->psql($served_db, q{SET statement_timeout = '30s'; BEGIN;
SELECT outcome FROM idempo.claim('s2', 'k', '{"q":2}');
ROLLBACK;}, stdout => \$out2, stderr => \$err2);
is($out2, 'conflict', "a conflicting claim in the served database $served_db is answered");
unlike($err2, qr/WARNING|ERROR/, 'without a warning or an error');
is($node->safe_psql($served_db, 'SELECT count(*) FROM idempo.conflicts'), '1',
   'and its conflict is kept after the rollback');

# several rounds later, the launcher has not repeated itself
my $rounds = $node->safe_psql($db, q{SELECT rounds FROM idempo.workers() WHERE kind = 'launcher'});
$node->safe_psql($db, 'SELECT pg_reload_conf()') for 1 .. 3;
$node->poll_query_until($db, qq{SELECT rounds >= $rounds + 3 FROM idempo.workers() WHERE kind = 'launcher'})
  or die 'the launcher did not go round';
my $log = slurp_file($node->logfile);
my $lines = () = $log =~ /idempo launcher could not (?:start a sweeper for|look whether) database "$db"/g;
ok($lines >= 1 && $lines <= 2, "the launcher said it $lines time(s), not every round (once per state change)");

# a slot frees (one served database is unlisted): the launcher serves $db, and a conflict there
# is recorded by its sweeper, under the id the claim returns, and kept after a rollback
my $listed = join(', ', $db, @served[1 .. $#served]);
$node->safe_psql($db, qq{ALTER SYSTEM SET idempo.databases = '$listed'; SELECT pg_reload_conf();});
ok($node->poll_query_until($db, "$unserved_row = 0"), "$db is no longer listed as unserved");
$node->poll_query_until($db, q{SELECT count(*) = 1 FROM idempo.workers() w
	WHERE w.kind = 'sweeper' AND w.database_id = (SELECT oid FROM pg_database WHERE datname = current_database())})
  or die "no sweeper for $db";
$node->psql($db, q{BEGIN;
SELECT conflict_id FROM idempo.claim('s', 'order-1', '{"qty":3}');
ROLLBACK;}, stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
unlike($stderr, qr/WARNING/, 'served now, the claim does not warn');
is($node->safe_psql($db, 'SELECT id FROM idempo.conflicts'), $stdout, 'and the conflict is kept under its id');
ok($node->log_contains(qr/idempo launcher (?:started a sweeper for|is looking whether) database "$db"/), 'the launcher says it serves it now');

$node->stop;
done_testing();
