# pg_upgrade of a cluster that preloads idempo: while pg_upgrade has its servers up (binary
# upgrade mode), no idempo launcher or sweeper may run and change data; afterwards every row is
# there, the extension's objects are all present and work, and the worker sweeps again.
# The old cluster is the same major as the new one, or the installation named by
# IDEMPO_OLD_INSTALL (e.g. /usr/lib/postgresql/15, with idempo installed for it): test/run runs
# this test both ways, the second from the previous supported major (15 -> 17, 17 -> 18), where
# the old database also holds test/upgrade/fill.sql (every status, reviews, conflicts, events).
use strict;
use warnings;
use File::Find;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# One line per idempo table and sequence: a digest of its whole content (test/dump/digest.sql;
# test/run passes the folder of the test sources in IDEMPO_TEST_SRC).
my $src = $ENV{IDEMPO_TEST_SRC} or die "IDEMPO_TEST_SRC must name the test/ folder (test/run sets it)";
my $digest = slurp_file("$src/dump/digest.sql");

# The extension's members and every function's full definition and privileges (OID-free; a
# NULL ACL is written out as the default it means: pg_upgrade may store an explicit ACL that
# equals the default as NULL).  The implicit types -- a table's or view's row type, every array
# type -- are left out: from PostgreSQL 16 on they are recorded as members too, so an upgrade
# from 15 adds them, as a fresh install on the new major has them.
my $objects = q{
SELECT pg_describe_object(d.classid, d.objid, d.objsubid)
       || CASE WHEN d.classid = 'pg_proc'::regclass
               THEN ' ' || md5(pg_get_functiondef(d.objid)) || ' '
                    || (SELECT string_agg(a::text, ',' ORDER BY a::text)
                        FROM unnest(coalesce(p.proacl, acldefault('f', p.proowner))) a)
               ELSE '' END
FROM pg_depend d JOIN pg_extension e ON d.refobjid = e.oid
LEFT JOIN pg_proc p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
LEFT JOIN pg_type t ON d.classid = 'pg_type'::regclass AND t.oid = d.objid
WHERE d.refclassid = 'pg_extension'::regclass AND e.extname = 'idempo' AND d.deptype = 'e'
  AND NOT coalesce(t.typcategory = 'A'
                   OR (SELECT c.relkind <> 'c' FROM pg_class c WHERE c.oid = t.typrelid), false)
ORDER BY 1};

my $old_install = $ENV{IDEMPO_OLD_INSTALL};
my $old = PostgreSQL::Test::Cluster->new('old', $old_install ? (install_path => $old_install) : ());
$old->init;
note('old cluster: PostgreSQL ' . $old->pg_version);
$old->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
max_worker_processes = 16
idempo.sweep_interval = '100ms'
log_min_messages = debug1
});
$old->start;
# the markers this test looks for do appear when the worker starts normally
$old->poll_query_until('postgres', q{SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempo launcher'})
  or die 'no launcher';
ok($old->log_contains(qr/registering background worker "idempo launcher"/)
	  && $old->log_contains(qr/idempo launcher started/),
   'a normal start registers and starts the idempo launcher (and logs it)');

# the worker is off while the data is made, so that due work stays due
$old->append_conf('postgresql.conf', 'idempo.worker_enabled = off');
$old->reload;
$old->safe_psql('postgres', 'CREATE DATABASE app');
$old->safe_psql('app', q{
SET client_min_messages = warning;
CREATE EXTENSION idempo;
SELECT idempo.create_scope('up', retention => '1 hour', lease => '1 minute', audit => true, store_params => true);
SELECT idempo.create_scope('up.private', hash_keys => true);
SELECT idempo.claim('up', 'k' || i, jsonb_build_object('i', i), run_id => 'r' || i) FROM generate_series(1, 20) i;
SELECT idempo.complete('up', 'k' || i, 1, jsonb_build_object('done', i), 'T-' || i) FROM generate_series(1, 10) i;
SELECT idempo.fail('up', 'k' || i, 1, 'e' || i) FROM generate_series(11, 13) i;
SELECT idempo.claim('up', 'k1', '{"i": 99}');
SELECT idempo.request_review('up', 'k14', 'by hand');
SELECT idempo.claim('up', 'stale', intent_at => now() - interval '2 days');
SELECT idempo.claim('up.private', 'alice@example.com', complete_on_commit => true);
-- due for the sweep: first seen two hours ago, past its retention; a sweeper would move it
SET idempo.clock_offset = '-2h';
SELECT idempo.claim('up', 'due', '{"i": 0}');
});
$old->safe_psql('postgres', 'CREATE DATABASE filled');
$old->safe_psql('filled', 'CREATE EXTENSION idempo');
$old->safe_psql('filled', slurp_file("$src/upgrade/fill.sql"));
my $filled_before = $old->safe_psql('filled', $digest);
is($old->safe_psql('app', q{SELECT status || ' ' || (sweep_at < now()) FROM idempo.operations WHERE key = 'due'}),
   'in_progress true', 'an operation is due for the sweep before the upgrade');
my $digest_before = $old->safe_psql('app', $digest);
my $objects_before = $old->safe_psql('app', $objects);
my $version = $old->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'idempo'});

my $new = PostgreSQL::Test::Cluster->new('new');
note('new cluster: PostgreSQL ' . $new->pg_version);
# initdb turns data checksums on by default from 18 on; pg_upgrade needs the old cluster's setting
$new->init(($new->pg_version >= 18 && $old->pg_version < 18) ? (extra => ['--no-data-checksums']) : ());
$new->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
max_worker_processes = 16
idempo.sweep_interval = '100ms'
idempo.worker_enabled = off
});

# Debian's PostgreSQL 15.20 and 17.12 store an attribute option "pg_attver" on every column of
# every table; a server that does not know that option (Debian's 18.6) refuses it when
# pg_upgrade restores the schema, so pg_upgrade fails for any table, idempo's or not.  Then the
# option is removed from the old cluster's catalogs first (it is not idempo's; docs/upgrading.md says
# so).
$new->start;
my ($probe_rc) = $new->psql('postgres', 'CREATE TEMP TABLE probe (a int); ALTER TABLE probe ALTER COLUMN a SET (pg_attver = 1)');
$new->stop;
if ($probe_rc != 0)
{
	for my $db ('template1', 'postgres', 'app', 'filled')
	{
		my $n = $old->safe_psql($db, q{
SET allow_system_table_mods = on;
WITH u AS (
  UPDATE pg_catalog.pg_attribute
  SET attoptions = nullif(array(SELECT o FROM unnest(attoptions) o WHERE o NOT LIKE 'pg_attver=%'), '{}')
  WHERE attoptions::text LIKE '%pg_attver=%' RETURNING 1)
SELECT count(*) FROM u});
		note("PostgreSQL " . $new->pg_version . " does not know attribute option pg_attver: removed from $n columns of database $db");
	}
}
$old->stop;

# pg_upgrade, with the worker switched ON in both of its servers: if a launcher or sweeper ran
# there, it would sweep the due operation at once (and log that it started)
my $old_bindir = $old->config_data('--bindir');
my $bindir = $new->config_data('--bindir');
my $opts = '-c idempo.worker_enabled=on -c idempo.sweep_interval=100ms -c log_min_messages=debug1';
$new->command_ok(
	[
		'pg_upgrade', '--no-sync', '--retain',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $old_bindir, '-B', $bindir,
		'-s', $new->host, '-p', $old->port, '-P', $new->port,
		'-o', $opts, '-O', $opts
	],
	'pg_upgrade from a cluster that preloads idempo (PostgreSQL ' . $old->pg_version . ' to ' . $new->pg_version . ')');

my @server_logs;
find(sub { push @server_logs, $File::Find::name if $_ eq 'pg_upgrade_server.log' },
	$new->data_dir . '/pg_upgrade_output.d');
my $server_log = join('', map { slurp_file($_) } @server_logs);
like($server_log, qr/database system is ready to accept connections/,
	 'the servers pg_upgrade ran logged to pg_upgrade_server.log');
unlike($server_log, qr/registering background worker "idempo/,
	   'no idempo background worker registered while pg_upgrade ran');
unlike($server_log, qr/idempo launcher started|idempo sweeper|starting background worker process "idempo/,
	   'no idempo launcher or sweeper started while pg_upgrade ran');

$new->start;
is($new->safe_psql('app', $digest), $digest_before, 'every row of every idempo table and sequence is kept');
is($new->safe_psql('filled', $digest), $filled_before, 'every row of the filled database (every status, reviews, conflicts, events) is kept');
is($new->safe_psql('app', q{SELECT status FROM idempo.operations WHERE key = 'due'}), 'in_progress',
   'the due operation was not swept during the upgrade');
is($new->safe_psql('filled', q{SELECT (idempo.claim('dump', 'k3', '{"i": 3}')).outcome}), 'replay',
   'a claim of a key completed before the upgrade replays');
is($new->safe_psql('app', $objects), $objects_before, 'the extension has the same objects and functions');
is($new->safe_psql('app', q{SELECT extversion FROM pg_extension WHERE extname = 'idempo'}), $version,
   "extension version $version kept");
is($new->safe_psql('app', q{SELECT count(*) FROM idempo.check_consistency()}), '0', 'tables consistent');

# it works: claim, complete, replay, a recorded conflict, the counters
is($new->safe_psql('app', q{
SELECT concat_ws(' ',
  (idempo.claim('up', 'after', '{"a": 1}')).outcome,
  idempo.complete('up', 'after', 1, '{"r": 1}', 'T-after'),
  (idempo.claim('up', 'after', '{"a": 1}')).outcome,
  (idempo.claim('up', 'k2', '{"i": 2}')).outcome,
  (idempo.claim('up', 'k2', '{"i": 3}')).conflict_id IS NOT NULL,
  (SELECT value FROM idempo.counters() WHERE name = 'claims_acquired'))}),
   'acquired succeeded replay replay t 1', 'after the upgrade: claim, complete, replay, conflict, counters');

# and the worker sweeps again once it is switched on
$new->append_conf('postgresql.conf', 'idempo.worker_enabled = on');
$new->reload;
$new->poll_query_until('app', q{SELECT count(*) = 1 FROM idempo.review_queue WHERE key = 'due'})
  or die 'the worker did not sweep after the upgrade';
pass('after the upgrade the worker sweeps: the due operation is in review');
ok($new->log_contains(qr/idempo launcher started/), 'the launcher started with the upgraded cluster');

$new->stop;
done_testing();
