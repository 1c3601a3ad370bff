# wait => false never waits for a transaction that starts inserting the key after the claim
# looked at it: the claim's own insert then runs into that transaction, and the claim's lock
# timeout turns the wait into 'busy'.  A BEFORE INSERT trigger holds the claim between its look
# and its insert until the other transaction has inserted the key (the trigger polls an advisory
# lock in a loop: not a lock wait, so the claim's lock timeout does not end it).  A claim that
# waited would run into its statement_timeout and give no answer.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('nowait_window');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idempo'");
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('nw');
CREATE FUNCTION public.hold_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('test.hold', true) = 'on' THEN
        WHILE NOT pg_try_advisory_xact_lock_shared(8080) LOOP
            PERFORM pg_sleep(0.01);
        END LOOP;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER hold BEFORE INSERT ON idempo.operations
    FOR EACH ROW EXECUTE FUNCTION public.hold_insert();
});

my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(8080)');

# the claim looks (nobody holds the key) and is held in its insert's trigger
my $claimer = $node->background_psql('postgres');
$claimer->query_safe(q{SET test.hold = 'on'});
$claimer->query_safe(q{SET statement_timeout = '20s'});
$claimer->query_until(qr/started/, qq{\\echo started
SELECT 'answer: ' || outcome FROM idempo.claim('nw', 'k', wait => false);
\\echo done
});
$node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE '%answer: %' AND wait_event = 'PgSleep'
}) or die 'the claim never reached its insert';

# meanwhile another transaction inserts the key, and stays open
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN');
is($holder->query_safe(q{SELECT outcome FROM idempo.claim('nw', 'k')}), 'acquired',
   'another transaction acquires the key while the claim is between its look and its insert');

# the claim goes on: its insert meets the uncommitted key
$gate->query_safe('SELECT pg_advisory_unlock(8080)');
my $out = $claimer->query_until(qr/done/, '');
like($out, qr/answer: busy/, 'wait => false answers busy instead of waiting for the inserter');

$holder->query_safe('COMMIT');
$holder->quit;
$claimer->quit;
$gate->quit;
is($node->safe_psql('postgres', q{SELECT status FROM idempo.operations WHERE key = 'k'}), 'in_progress',
   "the holder's claim is the one recorded");
$node->safe_psql('postgres', q{DROP TRIGGER hold ON idempo.operations});
is($node->safe_psql('postgres', 'SELECT count(*) FROM idempo.check_consistency()'), '0', 'consistent');
$node->stop;
done_testing();
