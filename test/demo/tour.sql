-- A guided tour of idempo's claim path.  Run by test/demo/run on a throwaway cluster.
\set ON_ERROR_STOP 1
\pset footer off
CREATE EXTENSION idempo;
CREATE TABLE shipments (id bigserial PRIMARY KEY, order_id text NOT NULL, sku text, qty int);

\echo
\echo '== 1. A scope: one kind of business action, with its policy'
SELECT name, retention, lease, on_lease_expiry, owner
FROM idempo.create_scope('warehouse.outbound', retention => '7 days', owner => 'team-logistics');

\echo
\echo '== 2. First delivery of "order 1001 approved": claim, business write, complete, one transaction'
BEGIN;
SELECT outcome, status, attempt FROM idempo.claim('warehouse.outbound', 'order-1001/shipment-1',
       params => '{"sku": "A-7", "qty": 2}', run_id => 'delivery-1');
INSERT INTO shipments (order_id, sku, qty) VALUES ('1001', 'A-7', 2);
SELECT idempo.complete('warehouse.outbound', 'order-1001/shipment-1',
       result => jsonb_build_object('shipment_id', currval('shipments_id_seq')),
       target_ref => 'SHP-' || currval('shipments_id_seq'));
COMMIT;

\echo
\echo '== 3. The webhook is redelivered (keys in another order, 2.0 for 2): replay, nothing shipped'
SELECT outcome, status, result, target_ref FROM idempo.claim('warehouse.outbound', 'order-1001/shipment-1',
       params => '{"qty": 2.0, "sku": "A-7"}', run_id => 'delivery-2');
SELECT order_id, count(*) AS shipments FROM shipments GROUP BY order_id;

\echo
\echo '== 4. Same order, changed quantity: conflict; the record stays as it was'
BEGIN;
SELECT outcome, status, conflict_id FROM idempo.claim('warehouse.outbound', 'order-1001/shipment-1',
       params => '{"sku": "A-7", "qty": 5}', run_id => 'delivery-3');
\echo '   (the caller rejects the request and rolls back ...)'
ROLLBACK;

\echo
\echo '== 5. ... and the conflict is still there for a person to look at'
SELECT id, scope, key, occurrences, run_id, encode(incoming_fingerprint, 'hex') AS incoming_fingerprint
FROM idempo.conflicts;

\echo
\echo '== 6. The one-call form: claim and complete on commit'
BEGIN;
SELECT outcome, status FROM idempo.claim('warehouse.outbound', 'order-1002/shipment-1',
       params => '{"sku": "B-1", "qty": 1}', complete_on_commit => true);
INSERT INTO shipments (order_id, sku, qty) VALUES ('1002', 'B-1', 1);
COMMIT;
SELECT outcome FROM idempo.claim('warehouse.outbound', 'order-1002/shipment-1', params => '{"sku": "B-1", "qty": 1}');

\echo
\echo '== 7. What the database holds'
SELECT scope, key, status, attempt, target_ref FROM idempo.operations ORDER BY key;
SELECT order_id, count(*) AS shipments FROM shipments GROUP BY order_id ORDER BY order_id;
