-- Duplicates queueing on one key (wait => true): every client claims the key of the current 100 ms;
-- the first acquires and holds it for 5 ms of business work, the others wait for its commit and
-- then replay its result.  Per-client counts and the waiters' latency show whether one starves.
BEGIN;
WITH c AS (
    SELECT outcome FROM idempo.claim('hot', 'q-' || (extract(epoch FROM clock_timestamp()) * 10)::bigint,
                                     params => '{"sku": "A-7", "qty": 1}', complete_on_commit => true))
INSERT INTO shipments (order_ref, sku, qty)
SELECT 'q', 'A-7', 1 FROM c, pg_sleep(0.005) WHERE outcome = 'acquired';
END;
