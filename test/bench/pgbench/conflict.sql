-- Conflict path: claim a key that already succeeded with different params; each conflict is
-- recorded by a short-lived background worker (slow by design).
\set r random(1, :fixture)
SELECT (idempo.claim('bench', 'r' || :r, params => '{"sku": "A-7", "qty": 2}')).conflict_id;
