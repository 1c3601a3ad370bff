# The sweeper meets an error (not a lock) while it records a conflict a claim handed it: the
# error goes to the log whole, as do_autovacuum reports its errors (SQLSTATE, detail, hint, and the
# context naming the key and scope: in a hash_keys scope the digest, never the clear key), its
# transaction is rolled back, the claim writes the row itself, and the same sweeper goes on
# recording the next conflict.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $secret = 'customer:dora.secret@example.com';

my $node = PostgreSQL::Test::Cluster->new('recorder_error');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idempo'
max_worker_processes = 8
log_error_verbosity = verbose
});
$node->start;
$node->safe_psql('postgres', qq{
CREATE EXTENSION idempo;
SELECT idempo.create_scope('pii', hash_keys => true, store_params => true);
SELECT idempo.claim('pii', '$secret', '{"n": 1}', complete_on_commit => true);
});
$node->poll_query_until('postgres', q{
SELECT count(*) = 1 FROM idempo.workers() WHERE kind = 'sweeper' AND state <> 'starting'})
  or die 'no sweeper serves the database';
my $sweeper = $node->safe_psql('postgres', q{
SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempo sweeper'});
my $digest = $node->safe_psql('postgres', qq{SELECT idempo.stored_key('pii', '$secret')});

# the sweeper's insert of the conflict row fails; the claim's own does not
$node->safe_psql('postgres', q{
CREATE FUNCTION public.refuse_the_sweeper() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('application_name') = 'idempo sweeper' THEN
    RAISE EXCEPTION 'the test refuses the sweeper''s row'
      USING ERRCODE = 'P0001', DETAIL = 'a detail of the test', HINT = 'a hint of the test';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_the_sweeper BEFORE INSERT ON idempo.conflicts
  FOR EACH ROW EXECUTE FUNCTION public.refuse_the_sweeper();
});
my $offset = -s $node->logfile;
is($node->safe_psql('postgres', qq{SELECT outcome FROM idempo.claim('pii', '$secret', '{"n": 2}')}),
   'conflict', 'the claim answers conflict');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.conflicts}), '1',
   'the claim wrote the conflict row itself');
my $log = slurp_file($node->logfile, $offset);
like($log, qr/ERROR:  P0001: the test refuses the sweeper's row\n(?:.*\n)*?.*DETAIL:  a detail of the test\n(?:.*\n)*?.*HINT:  a hint of the test\n(?:.*\n)*?.*CONTEXT:  (?:.*\n\t)*idempo could not record a conflict on key "$digest" in scope "pii"/,
     'the error is logged whole: SQLSTATE, detail, hint, and the context naming the digest');
# (the test's own statements are logged with their literals: log_statement = all)
is(scalar(grep { /\Q$secret\E/ && !/ LOG:  00000: statement: / } split /\n/, $log), 0,
   'the clear key is in no other line of the log');

# the sweeper survived, rolled back cleanly, and records the next conflict
$node->safe_psql('postgres', q{DROP TRIGGER refuse_the_sweeper ON idempo.conflicts});
$offset = -s $node->logfile;
$node->safe_psql('postgres', qq{BEGIN; SELECT idempo.claim('pii', '$secret', '{"n": 3}'); ROLLBACK;});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.conflicts}), '2',
   'the next conflict, rolled back in the claim, is recorded');
is($node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity WHERE backend_type = 'idempo sweeper'}),
   $sweeper, 'by the same sweeper');
$log = slurp_file($node->logfile, $offset);
unlike($log, qr/could not record a conflict|WARNING/, 'with nothing logged');

$node->stop;
done_testing();
