# Conflicts survive the rollback of the claim's transaction without needing a free worker slot.
# max_worker_processes is sized by the README's rule and no more: the launcher, one sweeper per
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

# one session: reload, then a conflicting claim in a transaction that rolls back
my $script = '';
for my $n (1 .. $claims)
{
	$script .= qq{SELECT pg_reload_conf();
BEGIN;
SELECT outcome FROM idempo.claim('s', 'order-1', '{"qty":1, "n":$n}');
ROLLBACK;
};
}
my ($stdout, $stderr);
$node->psql('db1', $script, stdout => \$stdout, stderr => \$stderr, on_error_die => 1);
is(scalar(() = $stdout =~ /^conflict$/mg), $claims, "$claims claims answered conflict");
is($node->safe_psql('db1', q{SELECT count(*) FROM idempo.conflicts WHERE key = 'order-1'}), $claims,
   "$claims conflict rows after $claims rollbacks");
is($node->safe_psql('db1', q{SELECT count(DISTINCT incoming_params) FROM idempo.conflicts}), $claims,
   'each with its own request');
unlike($stderr, qr/recorded in the current transaction only/, 'no conflict was kept only in a rolled-back transaction');
ok(!$node->log_contains(qr/could not record a conflict/), 'the sweeper recorded every one');

$node->stop;
ok(!$node->log_contains(qr/FATAL/), 'a clean shutdown logs no FATAL line');
done_testing();
