-- soak: a worker that claims and never finishes: the 2 s lease runs out, the sweeper makes it unknown.
\set k random(100000000000000, 999999999999999)
SELECT (idempo.claim('soak_lease', 'a' || :k, params => '{"sku": "C-3", "qty": 1}')).outcome;
