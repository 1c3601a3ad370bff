-- Hot keys, a webhook storm: every client redelivers one of 200 events; each event id is reused for
-- 2 s (a new generation of the 200 then), so most claims answer replay, some busy, and the first of
-- each generation acquires, writes the business row and completes at commit (one-call form).
\set k random(1, 200)
BEGIN;
WITH c AS (
    SELECT outcome FROM idempo.claim('hot', 'e' || :k || '-' || (extract(epoch FROM now())::bigint / 2),
                                     params => '{"sku": "A-7", "qty": 1}', wait => false,
                                     complete_on_commit => true))
INSERT INTO shipments (order_ref, sku, qty) SELECT 'e' || :k, 'A-7', 1 FROM c WHERE outcome = 'acquired';
END;
