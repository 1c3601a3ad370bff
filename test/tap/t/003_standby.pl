# A streaming standby runs no idempo worker; after promotion the worker sweeps there.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.sweep_interval = '200ms'
});
$primary->start;
$primary->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('s', retention => '2 seconds', lease => '1 second', verify_settle => '1 second');
});
$primary->backup('base');    # pg_basebackup

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

# the primary's worker takes the work that arrives; stop it so the standby inherits some
$primary->safe_psql('postgres', q{ALTER SYSTEM SET idempo.worker_enabled = off; SELECT pg_reload_conf();});
$primary->poll_query_until('postgres', q{SELECT bool_and(state = 'disabled') FROM idempo.workers() WHERE kind = 'sweeper'})
  or die 'primary worker not disabled';
$primary->safe_psql('postgres', q{SELECT idempo.claim('s', 'unfinished')});
$primary->safe_psql('postgres', q{
SELECT idempo.create_scope('done', retention => '1 day', lease => '1 hour', audit => true);
SELECT idempo.claim('done', 'shipped', '{"qty":1}');
SELECT idempo.complete('done', 'shipped', 1, '{"shipment":7}', 'SHP-7');
SELECT idempo.claim('done', 'running', '{"qty":1}');
});
$primary->wait_for_catchup($standby);

# A hot standby answers what needs no write and refuses, with idempo's own error, what must write.
is($standby->safe_psql('postgres', q{SELECT status || ' ' || target_ref FROM idempo.lookup('done', 'shipped')}),
   'succeeded SHP-7', 'lookup works on the standby');
is($standby->safe_psql('postgres', q{SELECT outcome || ' ' || result::text || ' ' || target_ref
                                      FROM idempo.claim('done', 'shipped', '{"qty":1}')}),
   'replay {"shipment": 7} SHP-7', 'a replay is answered on the standby');
is($standby->safe_psql('postgres', q{SELECT outcome FROM idempo.claim('done', 'running', '{"qty":1}', wait => false)}),
   'busy', 'busy is answered on the standby');
my ($rc, $out, $err) = $standby->psql('postgres', q{\set VERBOSITY verbose
SELECT idempo.claim('done', 'new-order', '{"qty":1}')});
like($err, qr/25006: cannot claim key "new-order" in scope "done" in a read-only transaction.*DETAIL:  The claim must write: the key has no record yet.*HINT:  This server is a standby: claim on the primary/s,
     'a new key is refused on the standby with 25006, the reason and a hint');
($rc, $out, $err) = $standby->psql('postgres', q{SELECT idempo.claim('done', 'shipped', '{"qty":2}')});
like($err, qr/cannot claim key "shipped" in scope "done" in a read-only transaction/,
     'a conflict, which must be recorded, is refused on the standby');
($rc, $out, $err) = $standby->psql('postgres', q{SELECT * FROM idempo.sweep()});
like($err, qr/ERROR:  idempo.sweep\(\) cannot run in a read-only transaction\nDETAIL:  This server is a standby.*HINT:  Run idempo.sweep\(\) on the primary/s,
     'sweep() on the standby says why it cannot run (not FOR UPDATE with its SQL)');
$standby->safe_psql('postgres', q{DO $$BEGIN IF NOT pg_is_in_recovery() THEN PERFORM idempo.sweep(); END IF; END$$});
pass('the form of the hint skips the standby');

is($standby->safe_psql('postgres', q{SELECT pg_is_in_recovery()}), 't', 'the standby is in recovery');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idempo.operations WHERE key = 'unfinished'}), '1',
   'the standby has the operation');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'idempo%'}), '0',
   'no idempo worker runs on the standby');
like($standby->psql('postgres', q{SELECT * FROM idempo.workers()}, on_error_stop => 0) // '', qr/^\d*$/,
     'idempo.workers() can be called on the standby');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM idempo.workers()}), '0', 'and lists nobody');

$primary->stop;
$standby->promote;
$standby->poll_query_until('postgres', q{SELECT NOT pg_is_in_recovery()}) or die 'not promoted';
$standby->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempo sweeper'})
  or die 'no worker after promotion';
pass('after promotion the worker runs');
$standby->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempo.review_queue WHERE key = 'unfinished'})
  or die 'not swept after promotion';
pass('after promotion the worker sweeps');
$standby->stop;
done_testing();
