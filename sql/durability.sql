-- Scopes with durability 'replicated': a transaction that acquired one of their keys commits only
-- if the commit waits for a synchronous standby.  This server has none configured (the positive
-- side, with a real synchronous standby, is test/tap/t/012_durability.pl).
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;
\set VERBOSITY default
\set SHOW_CONTEXT never

SELECT name, durability FROM idempo.create_scope('ship', durability => 'replicated');
SELECT name, durability FROM idempo.create_scope('note');
-- bad values are refused, and NULL is not 'local'
SELECT idempo.create_scope('bad', durability => 'sync');
SELECT idempo.create_scope('bad', durability => NULL);
SELECT idempo.alter_scope('note', durability => 'remote');
SELECT count(*) AS bad_scopes FROM idempo.scopes WHERE name = 'bad';

-- An acquisition refuses to commit, naming scope and key; nothing of it stays.
BEGIN;
SELECT outcome FROM idempo.claim('ship', 'order-1', '{"qty": 1}');
COMMIT;
SELECT count(*) AS records FROM idempo.operations WHERE key = 'order-1';
-- in autocommit too
SELECT outcome FROM idempo.claim('ship', 'order-1', '{"qty": 1}');
SELECT count(*) AS records FROM idempo.operations WHERE key = 'order-1';
-- the one-call form is an acquisition too
SELECT outcome FROM idempo.claim('ship', 'order-1b', complete_on_commit => true);
-- the detail says why: synchronous_commit below 'on' is seen even when set after the claim
BEGIN;
SELECT outcome FROM idempo.claim('ship', 'order-2');
SET LOCAL synchronous_commit = local;
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT outcome FROM idempo.claim('ship', 'order-2');
COMMIT;

-- SET CONSTRAINTS ALL IMMEDIATE does not bring the check forward: it is made at the commit, with
-- the commit's settings (synchronous_commit set after it is seen), however often it is run and
-- also when the statements come in one query string
BEGIN;
SELECT outcome FROM idempo.claim('ship', 'order-2c');
SET CONSTRAINTS ALL IMMEDIATE;
SET LOCAL synchronous_commit = local;
COMMIT;
BEGIN;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT outcome FROM idempo.claim('ship', 'order-2d');
SELECT outcome FROM idempo.claim('note', 'note-2d');
SET CONSTRAINTS ALL IMMEDIATE;
SET CONSTRAINTS ALL DEFERRED;
SET LOCAL synchronous_commit = off;
COMMIT;
BEGIN;
SELECT outcome FROM idempo.claim('ship', 'order-2e');
SET CONSTRAINTS ALL IMMEDIATE \; SET CONSTRAINTS ALL IMMEDIATE \; SET LOCAL synchronous_commit = local \; COMMIT;
SELECT count(*) AS records FROM idempo.operations WHERE key IN ('order-2c', 'order-2d', 'note-2d', 'order-2e');

-- An acquisition undone by a rolled-back savepoint does not count; a released one does.
BEGIN;
SAVEPOINT a;
SELECT outcome FROM idempo.claim('ship', 'order-3');
ROLLBACK TO a;
SELECT outcome FROM idempo.claim('note', 'note-1');
COMMIT;
BEGIN;
SAVEPOINT a;
SAVEPOINT b;
SELECT outcome FROM idempo.claim('ship', 'order-4');
RELEASE b;
RELEASE a;
COMMIT;
-- two levels: the outer acquisition survives the rollback of an inner one
BEGIN;
SELECT outcome FROM idempo.claim('ship', 'order-5');
SAVEPOINT a;
SELECT outcome FROM idempo.claim('ship', 'order-6');
ROLLBACK TO a;
COMMIT;
-- a rolled-back transaction is not refused, and the next one starts clean
BEGIN;
SELECT outcome FROM idempo.claim('ship', 'order-7');
ROLLBACK;
SELECT outcome FROM idempo.claim('note', 'note-2');
SELECT count(*) AS records FROM idempo.operations WHERE scope = 'ship';

-- Only acquisitions count: answers that commit no new decision are not refused.  A key finished
-- while the scope was 'local' replays, and a conflict is answered (and recorded) as before.
SELECT durability FROM idempo.alter_scope('ship', durability => 'local');
SELECT outcome FROM idempo.claim('ship', 'order-8', '{"qty": 1}');
SELECT idempo.complete('ship', 'order-8', 1, '{"shipment": 8}', 'SHP-8');
SELECT durability FROM idempo.alter_scope('ship', durability => 'replicated');
SELECT outcome, target_ref FROM idempo.claim('ship', 'order-8', '{"qty": 1}');
SELECT outcome FROM idempo.claim('ship', 'order-8', '{"qty": 2}');
SELECT count(*) AS conflicts FROM idempo.conflicts WHERE key = 'order-8';

-- A scope switched to 'local' commits acquisitions without a standby.
SELECT durability FROM idempo.alter_scope('ship', durability => 'local');
SELECT outcome FROM idempo.claim('ship', 'order-9');
SELECT key, status FROM idempo.operations WHERE scope = 'ship' ORDER BY key;
