-- Busy path, committed holder: claim (wait => false) a key whose in_progress attempt holds a live
-- lease (fixture l1..l:fixture).
\set r random(1, :fixture)
SELECT (idempo.claim('bench', 'l' || :r, params => '{"sku": "A-7", "qty": 1}', wait => false)).outcome;
