# Scopes with durability 'replicated' against a real synchronous standby: an acquisition commits
# when the commit waits for the standby, and is refused as soon as it would not (the settings the
# commit itself uses, published by the checkpointer after a reload).  A claim that committed
# survives the primary's kill -9 and the standby's promotion: the retry replays, nothing runs twice.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
});
$primary->start;
$primary->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('ship', durability => 'replicated');
SELECT idempo.create_scope('note');
});
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby1');    # its application_name
$standby->init_from_backup($primary, 'base', has_streaming => 1);
# once promoted it has no standby of its own: it must not wait for one
$standby->append_conf('postgresql.conf', "synchronous_standby_names = ''");
$standby->start;
$primary->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = 'standby1'; SELECT pg_reload_conf();});
$primary->poll_query_until('postgres',
	q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby1'})
  or die 'the standby did not become synchronous';

# claim KEY in SCOPE in its own transaction: the outcome, or the error's first line
sub claim
{
	my ($scope, $key, $settings) = @_;
	my ($ret, $out, $err) = $primary->psql('postgres', qq{
BEGIN;
$settings
SELECT outcome FROM idempo.claim('$scope', '$key');
COMMIT;
});
	return $err =~ /ERROR:\s+(.*)/ ? "ERROR: $1" : $out;
}

# 1. With a synchronous standby, an acquisition commits, and with remote_apply the standby shows it
#    as soon as the commit returns.
is(claim('ship', 'order-1', "SET LOCAL synchronous_commit = remote_apply;"), 'acquired',
   'a replicated scope commits its acquisition with a synchronous standby');
is($standby->safe_psql('postgres', q{SELECT status FROM idempo.lookup('ship', 'order-1')}), 'in_progress',
   'the standby has the record when the commit returns (remote_apply)');
is(claim('ship', 'order-2', "SET LOCAL synchronous_commit = remote_write;"), 'acquired',
   'remote_write waits for the standby too');

# 2. A commit that would not wait is refused even with the standby there.
like(claim('ship', 'order-3', "SELECT 1; SET LOCAL synchronous_commit = local;"),
	 qr/^ERROR: cannot commit the claim of key "order-3" in scope "ship": the commit would not wait for a synchronous standby/,
	 'synchronous_commit = local set after the claim is refused at commit');
is($primary->safe_psql('postgres', q{SELECT count(*) FROM idempo.operations WHERE key = 'order-3'}), '0',
   'and the refused claim left nothing');

# 3. The standby no longer synchronous (synchronous_standby_names emptied, reloaded): refused as soon
#    as the checkpointer publishes it, which is what the commit itself would go by.  Until then the
#    commit still waits for the standby, so either answer is right; wait for the refusal.
$primary->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = ''; SELECT pg_reload_conf();});
my $answer;
for my $try (1 .. 600)
{
	$answer = claim('ship', "order-async-$try", '');
	last if $answer =~ /^ERROR/;
	usleep(100_000);
}
like($answer, qr/^ERROR: cannot commit the claim of key "order-async-\d+" in scope "ship"/,
	 'with no synchronous standby the acquisition is refused');
my ($ret, $out, $err) = $primary->psql('postgres', q{SELECT idempo.claim('ship', 'order-detail')});
like($err, qr/DETAIL:\s+Scope "ship" has durability 'replicated', and no synchronous standby is configured/,
	 'the detail says why');
is(claim('note', 'note-1', ''), 'acquired', 'a local scope commits as before');

# 4. Synchronous again: a committed acquisition survives the primary's crash and a promotion.
$primary->safe_psql('postgres', q{ALTER SYSTEM SET synchronous_standby_names = 'standby1'; SELECT pg_reload_conf();});
$primary->poll_query_until('postgres',
	q{SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby1'})
  or die 'the standby did not become synchronous again';
for my $try (1 .. 600)
{
	$answer = claim('ship', 'order-9', '');
	last if $answer eq 'acquired';
	usleep(100_000);
}
is($answer, 'acquired', 'synchronous again: the acquisition commits');
$primary->kill9;    # kill -9 of the postmaster
$standby->promote;
is($standby->safe_psql('postgres', q{SELECT outcome || ' ' || status FROM idempo.claim('ship', 'order-9')}),
   'busy in_progress',
   'after failover the committed claim is there: a retry is busy (lease held), not acquired again');

$standby->stop;
done_testing();
