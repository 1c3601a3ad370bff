-- The orders database: the workflow's own data and idempo.
CREATE EXTENSION idempo;
CREATE TABLE orders (id bigint PRIMARY KEY, sku text NOT NULL, qty int NOT NULL);
CREATE TABLE stock (sku text PRIMARY KEY, available int NOT NULL, reserved int NOT NULL DEFAULT 0);
INSERT INTO stock SELECT 'SKU-' || i, 1000000, 0 FROM generate_series(1, 20) i;

-- One shipment per approved order; the warehouse honours our key (mode a).
SELECT name FROM idempo.create_scope('warehouse.outbound', retention => '1 hour', lease => '2 seconds',
       verify_settle => '3 seconds', store_params => true, audit => true, owner => 'team-logistics');
-- The same for the old warehouse API without keys, looked up through a lagging replica (mode b).
-- Its settle window must be longer than the replica can lag (3 s apply delay, reconnects).
SELECT name FROM idempo.create_scope('warehouse.outbound.legacy', retention => '1 hour', lease => '2 seconds',
       verify_settle => '10 seconds', store_params => true, audit => true, owner => 'team-logistics');
-- Webhooks whose sender puts its delivery time in the payload (left out of the fingerprint), for
-- the old warehouse API; keys are remembered for a year after their results expire (7 days).
SELECT name FROM idempo.create_scope('warehouse.outbound.hooks', retention => '7 days', lease => '2 seconds',
       verify_settle => '10 seconds', store_params => true, audit => true, owner => 'team-logistics',
       remember => '1 year', fingerprint_ignore => '{delivered_at}');
-- A local effect, claimed and written in one transaction (complete_on_commit).
SELECT name FROM idempo.create_scope('stock.reserve', retention => '1 hour', lease => '1 minute', owner => 'team-stock');
-- Short retention, to show the worker moving forgotten work to review.
SELECT name FROM idempo.create_scope('warehouse.returns', retention => '3 seconds', lease => '1 second',
       verify_settle => '1 second', owner => 'team-returns');
-- The scope an old copy of a flow still uses; it has been retired.
SELECT name FROM idempo.create_scope('warehouse.outbound.v1', owner => 'team-logistics (retired 2026-10)');
SELECT name FROM idempo.disable_scope('warehouse.outbound.v1');
