# A backlog larger than idempo.sweep_batch drains at once: a round that handled a full batch
# is followed by another right away, not after idempo.sweep_interval.  The interval is an
# hour, so the difference needs no timing: one batch per interval would leave rows for hours.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('backlog');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.sweep_interval = '1h'
idempo.sweep_batch = 10
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('b', retention => '1 hour');
});

# the sweeper has made its first round (on an empty table) and now waits for an hour
$node->poll_query_until('postgres', q{
SELECT rounds >= 1 AND state = 'idle' AND next_round_at > now() + interval '30 minutes'
FROM idempo.workers() WHERE kind = 'sweeper'
}) or die 'the sweeper never went idle';
my $rounds = $node->safe_psql('postgres', q{SELECT rounds FROM idempo.workers() WHERE kind = 'sweeper'});

# 35 finished records, made "two hours ago": expired an hour ago, three and a half batches
$node->safe_psql('postgres', q{
SET idempo.clock_offset = '-2h';
SELECT count(idempo.claim('b', 'k' || i, complete_on_commit => true)) FROM generate_series(1, 35) i;
});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.operations WHERE expires_at < now()}), '35',
   '35 expired records, more than three batches');

# a reload wakes the sweeper (its latch is set) for one round; the full rounds must follow
$node->safe_psql('postgres', q{SELECT pg_reload_conf()});
$node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM idempo.operations})
  or die 'the backlog did not drain after one wake-up';
pass('the whole backlog was purged after one wake-up');
cmp_ok($node->safe_psql('postgres', q{SELECT rounds FROM idempo.workers() WHERE kind = 'sweeper'}), '>=', $rounds + 4,
       'in at least four rounds of at most 10 rows');
is($node->safe_psql('postgres', q{SELECT value FROM idempo.counters() WHERE name = 'purged'}), '35',
   'the counters say 35 purged');

$node->stop;
ok(!$node->log_contains(qr/terminated by signal/), 'no process crashed');
done_testing();
