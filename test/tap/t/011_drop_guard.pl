# DROP EXTENSION idempo is refused while records exist also when the library is not preloaded:
# the guard is an event trigger of the extension, and firing it loads the library, whose hook also
# refuses the cascades that reach the extension (DROP EXTENSION plpgsql CASCADE).  The override
# set before the library is loaded is honoured; ALTER EXTENSION UPDATE from 0.2.0 and
# pg_dump/pg_restore bring the guard along.  (sql/drop_guard.sql has the cases in detail.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('not_preloaded');
$node->init;
$node->start;
is($node->safe_psql('postgres', 'SHOW shared_preload_libraries'), '', 'idempo is not preloaded');

my $fill = q{
SELECT idempo.create_scope('g');
SELECT idempo.claim('g', 'shipped', complete_on_commit => true);
SELECT idempo.claim('g', 'in-doubt');
};
$node->safe_psql('postgres', "CREATE EXTENSION idempo; $fill");

# each psql call is a new backend: its first statement is the DROP, so the guard loads the library
my ($ret, $out, $err) = $node->psql('postgres', 'DROP EXTENSION idempo');
isnt($ret, 0, 'DROP EXTENSION is refused in a fresh session');
like($err, qr/ERROR:  cannot drop extension idempo while it holds 2 operations/, 'with the count of records');
like($err, qr/HINT:  .*SET idempo.allow_drop_with_records = on/, 'and the override in the hint');
($ret, $out, $err) = $node->psql('postgres', 'DROP SCHEMA idempo CASCADE');
like($err, qr/cannot drop extension idempo while it holds/, 'DROP SCHEMA idempo CASCADE is refused too');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.operations}), '2', 'nothing was dropped');

# a cascade that reaches the extension: the trigger fires for every DROP, so the library (and its
# object_access_hook, which sees idempo's objects go whatever the statement) is loaded first
($ret, $out, $err) = $node->psql('postgres', 'DROP EXTENSION plpgsql CASCADE');
like($err, qr/ERROR:  cannot drop extension idempo while it holds 2 operations/,
	 'DROP EXTENSION plpgsql CASCADE is refused in a fresh session');
# a type one of idempo's objects depends on (a function the user made a member of it)
$node->safe_psql('postgres', q{
CREATE TYPE public.ticket AS (id int);
CREATE FUNCTION public.ticket_id(public.ticket) RETURNS int LANGUAGE sql AS 'SELECT $1.id';
ALTER EXTENSION idempo ADD FUNCTION public.ticket_id(public.ticket);
});
($ret, $out, $err) = $node->psql('postgres', 'DROP TYPE public.ticket CASCADE');
like($err, qr/ERROR:  cannot drop extension idempo while it holds 2 operations/,
	 'DROP TYPE of a type a member depends on is refused in a fresh session');
$node->safe_psql('postgres', q{
ALTER EXTENSION idempo DROP FUNCTION public.ticket_id(public.ticket);
DROP TYPE public.ticket CASCADE;
});
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM pg_extension WHERE extname IN ('idempo', 'plpgsql')}), '2',
   'both extensions are still there');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idempo.operations}), '2', 'and the records');

# the override, set while the library is not loaded yet (a placeholder), counts once it loads
$node->safe_psql('postgres', q{SET idempo.allow_drop_with_records = on; DROP EXTENSION idempo;});
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_extension WHERE extname = 'idempo'}), '0',
   'the override drops it');

# a database updated from 0.2.0 gets the guard
$node->safe_psql('postgres', "CREATE EXTENSION idempo VERSION '0.2.0'; $fill");
$node->safe_psql('postgres', 'ALTER EXTENSION idempo UPDATE');
($ret, $out, $err) = $node->psql('postgres', 'DROP EXTENSION idempo CASCADE');
like($err, qr/cannot drop extension idempo while it holds 2 operations/, 'after ALTER EXTENSION UPDATE from 0.2.0');

# pg_dump/pg_restore: the guard comes with the extension, once
my $dump = $node->basedir . '/idempo.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ], 'pg_restore');
is($node->safe_psql('restored', q{SELECT count(*) FROM pg_event_trigger WHERE evtname = 'idempo_drop_guard'}), '1',
   'the restored database has the guard once');
($ret, $out, $err) = $node->psql('restored', 'DROP EXTENSION idempo');
like($err, qr/cannot drop extension idempo while it holds 2 operations/, 'and it guards the restored records');

$node->stop;
done_testing();
