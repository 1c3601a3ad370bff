-- Scope administration: create, alter, disable, enable, and every refusal with its SQLSTATE.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

-- err(statement): runs it, returns 'SQLSTATE: message / HINT: hint' (or 'ok'); its effects roll back.

SELECT name, retention, lease, on_lease_expiry, verify_settle, max_attempts, require_fingerprint,
       hash_keys, store_params, audit, allowed_role, owner, environment, description, enabled
FROM idempo.create_scope('billing.charge');

SELECT name, retention, lease, on_lease_expiry, verify_settle, max_attempts, owner, environment
FROM idempo.create_scope('warehouse.outbound', retention => '7 days', lease => '2 minutes',
                         verify_settle => '30 seconds', max_attempts => 5, owner => 'team-logistics',
                         environment => 'prod', description => 'one shipment per approved order');

-- Refusals, each with its SQLSTATE and hint; none of them changes anything.
SELECT regress.err($$SELECT idempo.create_scope('billing.charge')$$);
SELECT regress.err($$SELECT idempo.create_scope(NULL)$$);
SELECT regress.err($$SELECT idempo.create_scope('')$$);
SELECT regress.err($$SELECT idempo.create_scope(repeat('x', 129))$$);
SELECT regress.err($$SELECT idempo.create_scope('s', retention => '0')$$);
SELECT regress.err($$SELECT idempo.create_scope('s', retention => '-1 hour')$$);
SELECT regress.err($$SELECT idempo.create_scope('s', retention => NULL)$$);
SELECT regress.err($$SELECT idempo.create_scope('s', lease => '0')$$);
SELECT regress.err($$SELECT idempo.create_scope('s', verify_settle => '-5 seconds')$$);
SELECT regress.err($$SELECT idempo.create_scope('s', retention => '1 hour', lease => '2 hours')$$);
SELECT regress.err($$SELECT idempo.create_scope('s', retention => '1 minute', verify_settle => '1 minute')$$);
SELECT regress.err($$SELECT idempo.create_scope('s', on_lease_expiry => 'sometimes')$$);
SELECT regress.err($$SELECT idempo.create_scope('s', max_attempts => 0)$$);
SELECT regress.err($$SELECT idempo.create_scope('s', allowed_role => 'no_such_role')$$);
SELECT regress.err($$SELECT idempo.alter_scope('nope', lease => '1 minute')$$);
SELECT regress.err($$SELECT idempo.alter_scope('billing.charge', lease => '48 hours')$$);
SELECT regress.err($$SELECT idempo.disable_scope('nope')$$);
SELECT regress.err($$SELECT idempo.enable_scope(NULL)$$);
SELECT count(*) AS scopes FROM idempo.scopes;

-- alter_scope: NULL leaves a setting alone; 0 / '' clear nullable ones.
SELECT name, retention, lease, max_attempts, owner, description
FROM idempo.alter_scope('warehouse.outbound', lease => '3 minutes', owner => 'team-shipping');
SELECT name, retention, lease, max_attempts, owner, description
FROM idempo.alter_scope('warehouse.outbound', max_attempts => 0, description => '');

-- disable / enable
SELECT name, enabled FROM idempo.disable_scope('warehouse.outbound');
SELECT regress.err($$SELECT idempo.claim('warehouse.outbound', 'order-1')$$);
SELECT name, enabled FROM idempo.enable_scope('warehouse.outbound');
SELECT outcome FROM idempo.claim('warehouse.outbound', 'order-1');

-- An unknown scope names create_scope in its hint.
SELECT regress.err($$SELECT idempo.claim('warehouse.inbound', 'order-1')$$);

-- hash_keys cannot change once a scope has operations (stored keys would stop matching).
SELECT regress.err($$SELECT idempo.alter_scope('warehouse.outbound', hash_keys => true)$$);
SELECT name, hash_keys FROM idempo.alter_scope('billing.charge', hash_keys => true);

-- A committed change is seen by the next claim of this session (cache invalidation).
SELECT name FROM idempo.create_scope('cache.test');
SELECT outcome FROM idempo.claim('cache.test', 'k1');
SELECT enabled FROM idempo.disable_scope('cache.test');
SELECT regress.err($$SELECT idempo.claim('cache.test', 'k2')$$);
BEGIN;
SELECT enabled FROM idempo.enable_scope('cache.test');
SELECT outcome FROM idempo.claim('cache.test', 'k2');
ROLLBACK;
SELECT regress.err($$SELECT idempo.claim('cache.test', 'k2')$$);

-- retention and remember reschedule the scope's records under a lock that waits for the claims
-- in flight, and the rescheduling must then see what they wrote: READ COMMITTED only.  The
-- same value again is no change; other settings change at any isolation level.
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT regress.err($$SELECT idempo.alter_scope('cache.test', remember => '1 day')$$);
SELECT regress.err($$SELECT idempo.alter_scope('cache.test', retention => '2 days')$$);
SELECT name, retention, lease FROM idempo.alter_scope('cache.test', retention => '24 hours', lease => '1 minute');
COMMIT;
