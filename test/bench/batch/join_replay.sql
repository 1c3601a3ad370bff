-- baseline: the same 1,000 keys joined against the table, reading what a replay returns
\set r random(0, 98999)
SELECT count(*), count(o.result) FROM unnest(array(SELECT 'r-' || g FROM generate_series(:r + 1, :r + 1000) g)) k
JOIN idempo.operations o ON o.scope = 'bench.replay' AND o.key = k;
