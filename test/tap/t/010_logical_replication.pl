# Logical replication of idempo's tables: a subscriber that has the extension and preloads the
# library writes none of the publisher's records.  Its sweeper does not sweep them (before, it
# moved them to review by itself, and the publisher's own review of the same key then stopped the
# apply worker on reviews_pkey, again and again), sweep() and every call that would write refuse,
# and what needs no write is answered from the replicated rows.  Once the subscription is dropped,
# the database is its own again and is swept.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pub = PostgreSQL::Test::Cluster->new('publisher');
$pub->init(allows_streaming => 'logical');
$pub->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.worker_enabled = off
});
$pub->start;

# The subscriber's clock is a day ahead for idempo: everything the publisher writes is overdue
# for its sweeper at once, which sweeps every 100 ms.
my $sub = PostgreSQL::Test::Cluster->new('subscriber');
$sub->init;
$sub->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
idempo.sweep_interval = '100ms'
idempo.clock_offset = '86400'
});
$sub->start;

$pub->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('s', retention => '1 hour', lease => '1 minute');
SELECT idempo.create_scope('audited', retention => '30 days', audit => true);
CREATE PUBLICATION idempo_pub
    FOR TABLE idempo.scopes, idempo.operations, idempo.reviews, idempo.conflicts, idempo.events;
});
$sub->safe_psql('postgres', 'CREATE EXTENSION idempo');
my $pub_connstr = $pub->connstr . ' dbname=postgres';
$sub->safe_psql('postgres',
	"CREATE SUBSCRIPTION idempo_sub CONNECTION '$pub_connstr' PUBLICATION idempo_pub");
$sub->wait_for_subscription_sync($pub, 'idempo_sub');

# work the publisher's callers leave: an attempt that never finished, a finished one
$pub->safe_psql('postgres', q{
SELECT idempo.claim('s', 'lost');
SELECT idempo.claim('s', 'done', '{"qty":1}', complete_on_commit => true);
SELECT idempo.claim('audited', 'a-1', complete_on_commit => true);
});
$pub->wait_for_catchup('idempo_sub');
is($sub->safe_psql('postgres', q{SELECT string_agg(key || ' ' || status, ', ' ORDER BY key) FROM idempo.operations}),
   'a-1 succeeded, done succeeded, lost in_progress', 'the subscriber has the publisher\'s operations');

# Ten rounds of the subscriber's sweeper, each after everything was overdue.
$sub->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempo.workers() WHERE kind = 'sweeper'})
  or die 'no sweeper on the subscriber';
my $wakeups = $sub->safe_psql('postgres', q{SELECT wakeups FROM idempo.workers() WHERE kind = 'sweeper'});
$sub->poll_query_until('postgres', qq{SELECT wakeups >= $wakeups + 10 FROM idempo.workers() WHERE kind = 'sweeper'})
  or die 'the subscriber\'s sweeper stopped';
is($sub->safe_psql('postgres', q{SELECT state FROM idempo.workers() WHERE kind = 'sweeper'}), 'subscriber',
   'the subscriber\'s sweeper says why it does not sweep');
is($sub->safe_psql('postgres', q{SELECT string_agg(key || ' ' || status, ', ' ORDER BY key) FROM idempo.operations}),
   'a-1 succeeded, done succeeded, lost in_progress', 'the subscriber\'s sweeper changed no replicated row');
is($sub->safe_psql('postgres', q{SELECT count(*) FROM idempo.reviews}), '0', 'and opened no review');
ok($sub->log_contains(qr/idempo sweeper: database "postgres" receives idempo's records from subscription "idempo_sub": not sweeping it/),
   'the sweeper logged why');

# The publisher sweeps; its changes arrive and apply.  The marker claim comes after the sweep.
$pub->safe_psql('postgres', q{
SET idempo.clock_offset = '86400';
SELECT * FROM idempo.sweep();
RESET idempo.clock_offset;
SELECT idempo.claim('s', 'marker', '{"m":1}', complete_on_commit => true);
});
$sub->poll_query_until('postgres', q{
SELECT EXISTS (SELECT FROM idempo.operations WHERE key = 'marker')
    OR (SELECT apply_error_count > 0 FROM pg_stat_subscription_stats WHERE subname = 'idempo_sub')
}) or die 'neither the publisher\'s changes nor an apply error arrived';
is($sub->safe_psql('postgres', q{SELECT apply_error_count FROM pg_stat_subscription_stats WHERE subname = 'idempo_sub'}),
   '0', 'the publisher\'s sweep applied on the subscriber without an error');
ok(!$sub->log_contains(qr/duplicate key value violates unique constraint/), 'no duplicate key in the apply worker');
is($sub->safe_psql('postgres', q{SELECT string_agg(key || ' ' || status, ', ' ORDER BY key) FROM idempo.operations}),
   'a-1 succeeded, lost in_review, marker succeeded', 'the subscriber shows the publisher\'s sweep');
is($sub->safe_psql('postgres', q{SELECT string_agg(key || ' ' || reason, ', ') FROM idempo.review_queue}),
   'lost retention_expired', 'and the publisher\'s review');

my ($ret, $out, $err);

# What the subscriber answers, and what it refuses (25006: run it on the publisher); these
# sessions use the real clock, not the sweeper's.
sub refusal
{
	my ($sql) = @_;
	my ($ret, $out, $err) = $sub->psql('postgres', "SET idempo.clock_offset = 0;\n\\set VERBOSITY verbose\n$sql");
	return $ret == 0 ? 'ok' : ($err =~ /ERROR:\s+(\w+): ([^\n]*)/ ? "$1: $2" : $err);
}
is($sub->safe_psql('postgres', q{SET idempo.clock_offset = 0; SELECT outcome FROM idempo.claim('s', 'marker', '{"m":1}')}), 'replay',
   'a claim that needs no write is answered from the replicated rows');
is($sub->safe_psql('postgres', q{SELECT status FROM idempo.lookup('s', 'lost')}), 'in_review', 'lookup works');
is($sub->safe_psql('postgres', q{SET idempo.clock_offset = 0;
    SELECT outcome || ' ' || (SELECT count(*) FROM idempo.events) FROM idempo.claim('audited', 'a-1')}),
   'replay 1', 'a claim in an audit scope replays, without writing an event');
like(refusal(q{SELECT * FROM idempo.sweep()}),
     qr/^25006: idempo.sweep\(\) cannot run in database "postgres": it receives idempo's records from subscription "idempo_sub"$/,
     'sweep() refuses');
($ret, $out, $err) = $sub->psql('postgres', q{SELECT idempo.claim('s', 'new-key')});
like($err, qr/DETAIL:  The claim must write: the key has no record yet\. Only the publisher writes idempo's records/,
     'a refused claim says why it would write');
like(refusal(q{SELECT idempo.claim('s', 'new-key')}),
     qr/^25006: cannot write the record of key "new-key" in scope "s": database "postgres" receives idempo's records from subscription "idempo_sub"$/,
     'a claim of a new key refuses');
like(refusal(q{SELECT idempo.claim('s', 'marker', '{"m":2}')}), qr/^25006: /,
     'a claim that would record a conflict refuses');
like(refusal(q{SELECT idempo.resolve('s', 'lost', 'failed', 'alice')}), qr/^25006: /, 'resolve refuses');
like(refusal(q{SELECT idempo.request_review('s', 'marker', 'x')}), qr/^25006: /, 'request_review refuses');
like(refusal(q{SELECT idempo.create_scope('t')}),
     qr/^25006: cannot change idempo.scopes in database "postgres": it receives the scopes from subscription "idempo_sub"$/,
     'scope changes refuse where the scopes are replicated');

# a conflict recorded on the publisher arrives; only the publisher resolves it
$pub->safe_psql('postgres', q{SELECT idempo.claim('s', 'marker', '{"m":2}')});
$pub->wait_for_catchup('idempo_sub');
like(refusal(q{SELECT idempo.resolve_conflict(id, 'dismissed', 'alice') FROM idempo.conflicts}),
     qr/^25006: cannot write the record of key "marker" in scope "s"/, 'resolve_conflict refuses');

# A scope changed on the publisher is seen by the next claim of a subscriber session that has the
# scope cached (the apply worker's changes fire no statement trigger): one session claims, waits
# for the replicated change, claims again.
my $pub_host = $pub->host;
my $pub_port = $pub->port;
($ret, $out, $err) = $sub->psql('postgres', qq{
SET idempo.clock_offset = 0;
SELECT outcome FROM idempo.claim('s', 'marker');
\\! psql -X -q -h '$pub_host' -p $pub_port -d postgres -c "SELECT name FROM idempo.disable_scope('s')" >/dev/null
DO \$\$ BEGIN
    WHILE (SELECT enabled FROM idempo.scopes WHERE name = 's') LOOP PERFORM pg_sleep(0.05); END LOOP;
END \$\$;
SELECT outcome FROM idempo.claim('s', 'marker');
});
is($out, 'replay', 'the first claim replays');
like($err, qr/scope "s" is disabled/, 'the replicated disable_scope() is seen by the same session');
$pub->safe_psql('postgres', q{SELECT idempo.enable_scope('s')});
$pub->wait_for_catchup('idempo_sub');

# Where only the records are subscribed and the scopes are the database's own, alter_scope()
# changes the scope there, but not retention or remember: those reschedule the scope's records,
# which are the publisher's (it used to rewrite the replicated rows' sweep_at locally).
$pub->safe_psql('postgres', q{
CREATE PUBLICATION idempo_records FOR TABLE idempo.operations, idempo.reviews, idempo.conflicts, idempo.events;
});
$sub->safe_psql('postgres', 'CREATE DATABASE records_only');
$sub->safe_psql('records_only', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('s', retention => '1 hour', lease => '1 minute');
SELECT idempo.create_scope('audited', retention => '30 days', audit => true);
});
$sub->safe_psql('records_only',
	"CREATE SUBSCRIPTION idempo_records_sub CONNECTION '$pub_connstr' PUBLICATION idempo_records");
$sub->wait_for_subscription_sync($pub, 'idempo_records_sub', 'records_only');
my $schedule = q{SELECT string_agg(key || ' ' || coalesce(sweep_at::text, '-'), ', ' ORDER BY key) FROM idempo.operations};
my $before = $sub->safe_psql('records_only', $schedule);
sub records_only_refusal
{
	my ($sql) = @_;
	my ($ret, $out, $err) = $sub->psql('records_only', "\\set VERBOSITY verbose\n$sql");
	return $ret == 0 ? 'ok' : ($err =~ /ERROR:\s+(\w+): ([^\n]*)/ ? "$1: $2" : $err);
}
like(records_only_refusal(q{SELECT idempo.alter_scope('s', retention => '30 minutes 1 second')}),
     qr/^25006: cannot reschedule the records of scope "s": database "records_only" receives idempo's records from subscription "idempo_records_sub"$/,
     'alter_scope changing retention refuses where only the records are subscribed');
like(records_only_refusal(q{SELECT idempo.alter_scope('audited', remember => '1 day')}), qr/^25006: cannot reschedule the records of scope "audited"/,
     'and so does changing remember');
is(records_only_refusal(q{SELECT idempo.alter_scope('s', retention => '1 hour', lease => '2 minutes', description => 'local')}), 'ok',
   'other settings, and retention given unchanged, change the local scope');
is($sub->safe_psql('records_only', $schedule), $before, 'no replicated record was rescheduled');
$sub->safe_psql('records_only', 'DROP SUBSCRIPTION idempo_records_sub');
$pub->safe_psql('postgres', 'DROP PUBLICATION idempo_records');
$sub->safe_psql('postgres', 'DROP DATABASE records_only');

# The subscription goes away (the subscriber becomes a database of its own): it is swept again.
$sub->safe_psql('postgres', 'DROP SUBSCRIPTION idempo_sub');
$sub->poll_query_until('postgres', q{SELECT state <> 'subscriber' FROM idempo.workers() WHERE kind = 'sweeper'})
  or die 'the sweeper still thinks it serves a subscriber';
$sub->safe_psql('postgres', q{SET idempo.clock_offset = 0; SELECT idempo.claim('s', 'own')});
$sub->poll_query_until('postgres', q{SELECT count(*) = 1 FROM idempo.review_queue WHERE key = 'own'})
  or die 'not swept after DROP SUBSCRIPTION';
pass('after DROP SUBSCRIPTION the subscriber\'s own work is swept');
ok($sub->log_contains(qr/idempo sweeper: database "postgres" no longer receives idempo's records from a subscription: sweeping it/),
   'the sweeper logged that it sweeps again');
is($sub->safe_psql('postgres', 'SELECT count(*) FROM idempo.check_consistency()'), '0', 'the subscriber is consistent');

$sub->stop;
$pub->stop;
ok(!$sub->log_contains(qr/terminated by signal/) && !$pub->log_contains(qr/terminated by signal/),
   'no process crashed');
done_testing();
