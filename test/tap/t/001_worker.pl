# The background worker sweeps without anyone calling sweep(): leases, retention, purge;
# reloads its settings on SIGHUP; can be switched off; serves every database that has the
# extension and leaves the others alone; gets out of the way of DROP DATABASE.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('primary');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.sweep_interval = '300ms'
max_worker_processes = 16
log_error_verbosity = verbose
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('w', retention => '3 seconds', lease => '1 second', verify_settle => '1 second');
});

# a sweeper for database postgres is running and visible as such
$node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempo sweeper' AND datname = 'postgres'
}) or die 'no sweeper for database postgres';
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempo launcher'}),
   '1', 'the launcher is visible in pg_stat_activity');

# while idle, each shows what it waits for: a named wait event from PostgreSQL 17 on
# (WaitEventExtensionNew), the one event 'Extension' before
my $named = $node->safe_psql('postgres', 'SHOW server_version_num') >= 170000;
for my $w (['idempo sweeper', 'IdempoSweeperIdle'], ['idempo launcher', 'IdempoLauncherIdle']) {
  my ($type, $event) = @$w;
  $event = 'Extension' unless $named;
  ok($node->poll_query_until('postgres', qq{
SELECT count(*) > 0 FROM pg_stat_activity
WHERE backend_type = '$type' AND wait_event_type = 'Extension' AND wait_event = '$event'}),
     "the $type waits as $event");
}

# an attempt that never completes: lease over -> unknown, retention over -> review; nobody calls sweep()
$node->safe_psql('postgres', q{SELECT idempo.claim('w', 'lost-reply')});
$node->poll_query_until('postgres', q{SELECT status = 'unknown' FROM idempo.operations WHERE key = 'lost-reply'})
  or die 'lease never expired';
pass('an expired lease became unknown without a call to sweep()');
$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempo.review_queue WHERE key = 'lost-reply'})
  or die 'never moved to review';
is($node->safe_psql('postgres', q{SELECT reason || ' ' || status FROM idempo.review_queue WHERE key = 'lost-reply'}),
   'retention_expired in_review', 'unfinished work past retention is in the review queue');

# a finished record is purged after its retention
$node->safe_psql('postgres', q{SELECT idempo.claim('w', 'done', complete_on_commit => true)});
$node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM idempo.operations WHERE key = 'done'})
  or die 'never purged';
pass('a finished record past expires_at was purged');

like($node->safe_psql('postgres', q{SELECT string_agg(name || '=' || value, ',' ORDER BY name) FROM idempo.counters()
                                      WHERE name IN ('moved_to_review', 'purged', 'lease_expired')}),
     qr/lease_expired=[1-9].*moved_to_review=[1-9].*purged=[1-9]/, 'counters count what the worker did');
ok($node->log_contains(qr/idempo sweeper: scope "w": .* moved to review/), 'the worker logs what it moved, per scope');

# SIGHUP: a new interval is picked up at once
$node->append_conf('postgresql.conf', "idempo.sweep_interval = '1h'");
$node->reload;
$node->poll_query_until('postgres', q{
SELECT next_round_at - now() > interval '30 minutes' FROM idempo.workers() w
JOIN pg_database d ON d.oid = w.database_id WHERE d.datname = 'postgres'
}) or die 'the new interval was not picked up';
pass('SIGHUP changed the sweep interval');
$node->append_conf('postgresql.conf', "idempo.sweep_interval = '200ms'");
$node->reload;
$node->poll_query_until('postgres', q{
SELECT next_round_at - now() < interval '1 second' FROM idempo.workers() w
JOIN pg_database d ON d.oid = w.database_id WHERE d.datname = 'postgres'
}) or die 'the short interval was not picked up';

# worker_enabled = off: it keeps waking up but sweeps nothing
$node->append_conf('postgresql.conf', "idempo.worker_enabled = off");
$node->reload;
$node->poll_query_until('postgres', q{SELECT bool_and(state = 'disabled') FROM idempo.workers() WHERE kind = 'sweeper'})
  or die 'never disabled';
$node->safe_psql('postgres', q{SELECT idempo.claim('w', 'while-disabled', complete_on_commit => true)});
my $wakeups = $node->safe_psql('postgres', q{SELECT wakeups FROM idempo.workers() WHERE kind = 'sweeper'});
my $rounds = $node->safe_psql('postgres', q{SELECT rounds FROM idempo.workers() WHERE kind = 'sweeper'});
# twenty wake-ups of 200 ms take longer than the 3 s retention of the record
$node->poll_query_until('postgres', qq{
SELECT wakeups >= $wakeups + 20 FROM idempo.workers() WHERE kind = 'sweeper'
}) or die 'the disabled worker stopped waking up';
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.operations WHERE key = 'while-disabled'}), '1',
   'worker_enabled = off: an expired record stays');
is($node->safe_psql('postgres', q{SELECT rounds FROM idempo.workers() WHERE kind = 'sweeper'}), $rounds,
   'worker_enabled = off: no sweep rounds');
$node->append_conf('postgresql.conf', "idempo.worker_enabled = on");
$node->reload;
$node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM idempo.operations WHERE key = 'while-disabled'})
  or die 'not swept after enabling again';
pass('worker_enabled = on: sweeping resumes');

# two databases are both served; a database without the extension is left alone
$node->safe_psql('postgres', 'CREATE DATABASE second');
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->safe_psql('second', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('w2', retention => '2 seconds', lease => '1 second', verify_settle => '1 second');
SELECT idempo.claim('w2', 'k', complete_on_commit => true);
});
$node->poll_query_until('second', q{SELECT count(*) = 0 FROM idempo.operations}) or die 'database second not swept';
pass('a second database with the extension is swept');
my $launcher_rounds = $node->safe_psql('postgres', q{SELECT rounds FROM idempo.workers() WHERE kind = 'launcher'});
$node->poll_query_until('postgres', qq{
SELECT rounds >= $launcher_rounds + 2 FROM idempo.workers() WHERE kind = 'launcher'
}) or die 'the launcher stopped';
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity WHERE datname = 'plain'}), '0',
   'a database without the extension has no sweeper connected');
is($node->safe_psql('plain', q{SELECT count(*) FROM pg_extension WHERE extname = 'idempo'}), '0',
   'and nothing was installed there');

# A sweeper that served its database and was terminated is started again at once, not after
# the minute the launcher waits before it looks again at a database that had no idempo
# (EXTENSION_RECHECK_MS): a new one is there well within half of that.
my $second_sweeper = $node->safe_psql('postgres', q{
SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempo sweeper' AND datname = 'second'});
$node->safe_psql('postgres', qq{SELECT pg_terminate_backend($second_sweeper)});
{
  local $PostgreSQL::Test::Utils::timeout_default = 30;
  ok($node->poll_query_until('postgres', qq{
SELECT count(*) = 1 FROM pg_stat_activity
WHERE backend_type = 'idempo sweeper' AND datname = 'second' AND pid <> $second_sweeper}),
     'a terminated sweeper of a served database is replaced at once');
}

# CREATE EXTENSION wakes the launcher: a sweeper comes at once
$node->safe_psql('plain', 'CREATE EXTENSION idempo');
$node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempo sweeper' AND datname = 'plain'
}) or die 'no sweeper after CREATE EXTENSION';
pass('CREATE EXTENSION starts a sweeper');

# DROP EXTENSION: the sweeper leaves; re-creating it brings one back
$node->safe_psql('plain', 'DROP EXTENSION idempo');
$node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM pg_stat_activity WHERE datname = 'plain'})
  or die 'the sweeper stayed after DROP EXTENSION';
pass('DROP EXTENSION: the sweeper leaves');
$node->safe_psql('plain', q{CREATE EXTENSION idempo;
  SELECT idempo.create_scope('w3', retention => '2 seconds', lease => '1 second', verify_settle => '1 second');
  SELECT idempo.claim('w3', 'k', complete_on_commit => true);});
$node->poll_query_until('plain', q{SELECT count(*) = 0 FROM idempo.operations}) or die 'not swept after re-create';
pass('re-created extension is swept again');

# DROP DATABASE is not blocked by the sweeper connected to it
$node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'idempo sweeper' AND datname = 'second'
}) or die 'no sweeper in second';
$node->safe_psql('postgres', 'DROP DATABASE second');
pass('DROP DATABASE of a swept database succeeds');
$node->safe_psql('postgres', 'CREATE DATABASE copy TEMPLATE plain');
pass('CREATE DATABASE ... TEMPLATE of a swept database succeeds');

# an error in a round is logged and survived (a round of database "plain" may already have
# failed, racing its DROP EXTENSION: count from here)
my $errors = $node->safe_psql('postgres', q{SELECT value FROM idempo.counters() WHERE name = 'worker_errors'});
$node->safe_psql('postgres', q{ALTER TABLE idempo.reviews RENAME TO reviews_away});
$node->safe_psql('postgres', q{SELECT idempo.claim('w', 'during-error')});
$node->poll_query_until('postgres', qq{SELECT value > $errors FROM idempo.counters() WHERE name = 'worker_errors'})
  or die 'no error counted';
$node->safe_psql('postgres', q{ALTER TABLE idempo.reviews_away RENAME TO reviews});
$node->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempo.reviews WHERE key = 'during-error'})
  or die 'the worker did not survive the failing rounds';
ok($node->log_contains(qr/idempo sweeper: a sweep round in database "postgres" failed/), 'the failure was logged');
# the error itself is logged whole, as autovacuum logs its errors: SQLSTATE (log_error_verbosity
# = verbose shows it), message and the round it happened in
ok($node->log_contains(qr/ERROR:  42P01: relation "idempo\.reviews" does not exist.*\n(?:.*\n)*?.*CONTEXT:  .*idempo sweep round in database "postgres"/),
   'the error is logged with its SQLSTATE and context');
pass('the worker carried on after failing rounds');

# A terminated launcher leaves no trace in shared memory: once its process is gone,
# idempo.workers() does not show its pid (it showed it as running until the next launcher
# registered, 5 s later, and a wake-up could set the latch of the process slot's next owner);
# then the next launcher is shown.
my $old_launcher = $node->safe_psql('postgres', q{SELECT pid FROM idempo.workers() WHERE kind = 'launcher'});
$node->safe_psql('postgres', qq{SELECT pg_terminate_backend($old_launcher)});
$node->poll_query_until('postgres', qq{SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $old_launcher})
  or die 'the launcher did not exit';
is($node->safe_psql('postgres', qq{SELECT count(*) FROM idempo.workers() WHERE pid = $old_launcher}), '0',
   'the exited launcher is not listed');
ok($node->poll_query_until('postgres', qq{SELECT count(*) = 1 FROM idempo.workers()
	WHERE kind = 'launcher' AND pid <> $old_launcher}), 'the next launcher is listed');

# The sweepers outlive their launcher: the next launcher finds them serving.  It does not start
# a sweeper of its own for their databases (which found the other one there and left at once,
# and was started again at once, hundreds of times a second, as long as the other one lived):
# it does a round per nap (idempo.sweep_interval here) and a few more, not hundreds.
my $orphan = $node->safe_psql('postgres', q{
SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempo sweeper' AND datname = 'postgres'});
isnt($orphan, '', 'a sweeper of the earlier launcher still serves');
my $rounds_before = $node->safe_psql('postgres', q{SELECT rounds FROM idempo.workers() WHERE kind = 'launcher'});
sleep 5;
my $rounds = $node->safe_psql('postgres', q{SELECT rounds FROM idempo.workers() WHERE kind = 'launcher'})
  - $rounds_before;
cmp_ok($rounds, '<', 60, "the next launcher does not restart sweepers in a loop ($rounds rounds in 5 s)");
# when it leaves, the next launcher starts one of its own
$node->safe_psql('postgres', qq{SELECT pg_terminate_backend($orphan)});
{
  local $PostgreSQL::Test::Utils::timeout_default = 30;
  ok($node->poll_query_until('postgres', qq{
SELECT count(*) = 1 FROM idempo.workers()
WHERE kind = 'sweeper' AND pid <> $orphan AND state <> 'starting'
  AND database_id = (SELECT oid FROM pg_database WHERE datname = 'postgres')}),
     'a sweeper of the next launcher serves the database when the earlier one has left');
}

is($node->safe_psql('postgres', 'SELECT count(*) FROM idempo.check_consistency()'), '0', 'consistent');
$node->stop;
ok(!$node->log_contains(qr/terminated by signal/), 'no process crashed');
done_testing();
