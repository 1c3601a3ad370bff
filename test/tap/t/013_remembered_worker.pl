# The background worker shrinks finished records to remembered keys (scope option remember)
# instead of purging them, counts and logs it, and a claim then answers 'expired'; records of a
# scope without remember are purged as before.  The records are made "two hours ago" with
# idempo.clock_offset, so nothing waits on time: a reload wakes the sweeper.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('remembered');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.sweep_interval = '1h'
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('keep', retention => '1 hour', remember => '30 days');
SELECT idempo.create_scope('drop', retention => '1 hour');
});
$node->poll_query_until('postgres', q{
SELECT rounds >= 1 AND state = 'idle' FROM idempo.workers() WHERE kind = 'sweeper'
}) or die 'the sweeper never went idle';

$node->safe_psql('postgres', q{
SET idempo.clock_offset = '-2h';
SELECT count(idempo.claim(s, 'k' || i, params => jsonb_build_object('i', i), complete_on_commit => true))
FROM unnest(ARRAY['keep', 'drop']) s, generate_series(1, 5) i;
});

$node->safe_psql('postgres', q{SELECT pg_reload_conf()});
$node->poll_query_until('postgres', q{
SELECT count(*) FILTER (WHERE scope = 'drop') = 0
   AND count(*) FILTER (WHERE scope = 'keep' AND sweep_at > expires_at) = 5
FROM idempo.operations
}) or die 'the sweeper did not shrink and purge';
pass('the worker shrank the records of the remembering scope and purged the others');
is($node->safe_psql('postgres', q{
SELECT count(*) FROM idempo.operations
WHERE scope = 'keep' AND sweep_at = expires_at + interval '30 days' AND params IS NULL}), '5',
   'remembered for 30 days after the results expired, without their params');
is($node->safe_psql('postgres', q{
SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM idempo.counters()
WHERE name IN ('purged', 'remembered')}), 'purged=5,remembered=5', 'the counters say 5 purged, 5 remembered');
ok($node->log_contains(qr/idempo sweeper: scope "keep": .* 5 remembered/), 'the worker logs the shrinks, per scope');
is($node->safe_psql('postgres', q{SELECT outcome FROM idempo.claim('keep', 'k1', '{"i":1}')}), 'expired',
   'a claim of a remembered key answers expired');
is($node->safe_psql('postgres', q{SELECT outcome FROM idempo.claim('drop', 'k1', '{"i":1}')}), 'acquired',
   'a claim of a purged key acquires it again');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.check_consistency()}), '0', 'consistent');

$node->stop;
ok(!$node->log_contains(qr/terminated by signal/), 'no process crashed');
done_testing();
