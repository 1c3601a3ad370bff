-- idempo's one-call form without params (no fingerprint): test/bench/anatomy.
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
BEGIN;
SELECT (idempo.claim('bench', 'k' || :k, complete_on_commit => true)).outcome;
INSERT INTO shipments (order_ref, sku, qty) VALUES ('k' || :k, 'A-7', :q);
END;
