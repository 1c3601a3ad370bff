# wait => false answers busy while another transaction holds the key, without waiting for it:
# the holder keeps its transaction open until the busy answer has arrived (a claim that waited
# would run into its statement_timeout instead); afterwards it answers from what the holder left.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('nowait');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempo'");
$node->start;
$node->safe_psql('postgres', q{CREATE EXTENSION idempo; SELECT idempo.create_scope('nw');});

# Both ways of writing: direct writes answer from a look at the primary key; through SQL
# (idempo.direct_writes = off) the claim runs with a lock timeout and answers when it expires.
my $dw;

sub nowait
{
	my ($key) = @_;
	return $node->safe_psql('postgres', qq{
SET idempo.direct_writes = $dw;
SET statement_timeout = '20s';
SELECT outcome || ' ' || coalesce(status::text, '-') FROM idempo.claim('nw', '$key', wait => false);
});
}

for my $mode ('on', 'off')
{
	$dw = $mode;
	for my $end ('COMMIT', 'ROLLBACK')
	{
		my $key = lc($end) . "-$dw";
		my $holder = $node->background_psql('postgres');
		$holder->query_safe("SET idempo.direct_writes = $dw");
		$holder->query_safe('BEGIN');
		$holder->query_safe(qq{SELECT idempo.claim('nw', '$key', complete_on_commit => true)});

		is(nowait($key), 'busy -', "busy while another transaction holds the new key (then $end, direct writes $dw)");
		# an existing, committed record locked by a transaction in flight: busy too
		$holder->query_safe($end);
		$holder->quit;
		is(nowait($key), $end eq 'COMMIT' ? 'replay succeeded' : 'acquired in_progress',
		   "after the holder's $end the claim answers from what it left (direct writes $dw)");
	}

	my $holder = $node->background_psql('postgres');
	$holder->query_safe("SET idempo.direct_writes = $dw");
	$holder->query_safe('BEGIN');
	$holder->query_safe(qq{SELECT idempo.complete('nw', 'rollback-$dw', 1)});
	is(nowait("rollback-$dw"), 'busy in_progress', "busy while another transaction completes the key (direct writes $dw)");
	$holder->query_safe('COMMIT');
	$holder->quit;
	is(nowait("rollback-$dw"), 'replay succeeded', "then replay (direct writes $dw)");
}

is($node->safe_psql('postgres', 'SELECT count(*) FROM idempo.check_consistency()'), '0', 'consistent');
$node->stop;
done_testing();
