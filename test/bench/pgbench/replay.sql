-- Replay path: claim a key that already succeeded, same params (fixture r1..r:fixture).
\set r random(1, :fixture)
SELECT (c).outcome, (c).result, (c).target_ref
FROM (SELECT idempo.claim('bench', 'r' || :r, params => '{"sku": "A-7", "qty": 1}') AS c OFFSET 0) s;
