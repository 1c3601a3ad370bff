# wait => false answers busy while another transaction holds the key, without waiting for it:
# the holder keeps its transaction open until the busy answer has arrived (a claim that waited
# would run into its statement_timeout instead); afterwards it answers from what the holder left.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

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

# 'busy' means another transaction holds the key, nothing else.  Brand-new keys claimed with
# wait => false by 32 concurrent clients: every one is acquired.  (Before, any lock wait over 1 ms,
# the table's extension lock for one, answered busy: 0.75 % of new keys on the direct path,
# 1.7 % through SQL.  And a lock granted just as the claim's short lock_timeout fired left the
# cancel pending, raised after the claim's subtransaction as a raw "canceling statement due to
# lock timeout": about once in 10^5 claims at 32 clients, so this runs 64,000.)  Both paths.
# Every key is new: it is the transaction's id (a random key could repeat within a client, and
# the repeat is rightly busy: the client's own earlier attempt holds a live lease).
my $dir = PostgreSQL::Test::Utils::tempdir;
$node->safe_psql('postgres', q{
SELECT idempo.create_scope('nw_new');
CREATE TABLE nw_outcomes (outcome text NOT NULL);
});
sub pgbench
{
	my ($name, $script, $clients, $transactions, $options) = @_;
	my $file = "$dir/$name.sql";
	PostgreSQL::Test::Utils::append_to_file($file, $script);
	my ($out, $err);
	local $ENV{PGOPTIONS} = $options // '';
	my $ok = IPC::Run::run([ 'pgbench', '-n', '-c', $clients, '-j', 2, '-t', $transactions,
							 '-f', $file, '-h', $node->host, '-p', $node->port, 'postgres' ],
						   '>', \$out, '2>', \$err);
	note $err if !$ok;
	return $ok;
}
for my $path ('on', 'off')
{
	$node->safe_psql('postgres', 'TRUNCATE nw_outcomes');
	ok(pgbench("new_keys_$path", q{
WITH c AS (SELECT outcome FROM idempo.claim('nw_new', 'k-' || txid_current(), wait => false))
INSERT INTO nw_outcomes SELECT outcome::text FROM c;
}, 32, 1000, "-c idempo.direct_writes=$path"), "new keys with wait => false, direct writes $path: no errors");
	is($node->safe_psql('postgres', q{
SELECT count(*) FILTER (WHERE outcome = 'acquired') || ' acquired, '
    || count(*) FILTER (WHERE outcome = 'busy') || ' busy' FROM nw_outcomes}),
	   '32000 acquired, 0 busy', "new keys with wait => false, direct writes $path: all acquired, none busy");
}

# A user's extra unique index on (scope, key) is an arbiter of the insert, as ON CONFLICT (scope,
# key) infers it: first claims that race on it are decided, not a unique violation (the direct
# path raised 23505 when two first claims met there).  4 clients, the key changes every 2 ms.
$node->safe_psql('postgres', q{
SELECT idempo.create_scope('nw_race');
CREATE UNIQUE INDEX operations_user_scope_key ON idempo.operations (scope, key);
});
for my $path ('on', 'off')
{
	ok(pgbench("race_$path", qq{
SELECT outcome FROM idempo.claim('nw_race', '$path-' || (extract(epoch FROM clock_timestamp()) * 500)::bigint);
}, 4, 2500, "-c idempo.direct_writes=$path"), "first claims racing with a user's unique index on (scope, key), direct writes $path: no errors");
}
cmp_ok($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.operations WHERE scope = 'nw_race'}), '>', 100,
	   'the racing claims made records');
$node->safe_psql('postgres', 'DROP INDEX idempo.operations_user_scope_key');

# A REINDEX CONCURRENTLY of the primary key cancelled while it waits for an old snapshot leaves
# its copy behind: operations_pkey_ccnew, ready (it takes every insert and checks uniqueness) but
# invalid.  From PostgreSQL 19 on, ON CONFLICT (scope, key) infers such an index as an arbiter
# too, so first claims racing on it are decided on both paths (the direct path, which took only
# valid indexes, raised 23505 there); before 19 ON CONFLICT ignores it and the race raises 23505
# through SQL as well, so there is nothing to compare.
my $old_snapshot = $node->background_psql('postgres');
$old_snapshot->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
$old_snapshot->query_safe('SELECT count(*) FROM idempo.operations');
my ($out, $err);
$node->psql('postgres', q{SET statement_timeout = '3s'; REINDEX INDEX CONCURRENTLY idempo.operations_pkey},
			stdout => \$out, stderr => \$err);
like($err, qr/canceling statement due to statement timeout/, 'REINDEX CONCURRENTLY cancelled while it waits');
$old_snapshot->query_safe('COMMIT');
$old_snapshot->quit;
is($node->safe_psql('postgres', q{
SELECT indisready || ' ' || indisvalid FROM pg_index WHERE indexrelid = 'idempo.operations_pkey_ccnew'::regclass}),
   'true false', 'the cancelled REINDEX CONCURRENTLY left a ready, invalid copy of the primary key');
$node->safe_psql('postgres', q{SELECT idempo.create_scope('nw_ccnew')});
SKIP:
{
	skip 'before PostgreSQL 19 ON CONFLICT does not infer an invalid index as an arbiter', 2
	  if $node->safe_psql('postgres', 'SHOW server_version_num') < 190000;
	for my $path ('on', 'off')
	{
		ok(pgbench("ccnew_$path", qq{
SELECT outcome FROM idempo.claim('nw_ccnew', '$path-' || (extract(epoch FROM clock_timestamp()) * 500)::bigint);
}, 4, 2500, "-c idempo.direct_writes=$path"), "first claims racing with REINDEX CONCURRENTLY's invalid copy, direct writes $path: no errors");
	}
}
$node->safe_psql('postgres', 'DROP INDEX idempo.operations_pkey_ccnew');

is($node->safe_psql('postgres', 'SELECT count(*) FROM idempo.check_consistency()'), '0', 'consistent');
$node->stop;
done_testing();
