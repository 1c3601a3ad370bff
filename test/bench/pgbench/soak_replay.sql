-- soak: a redelivery: one of 100 keys reused for 5 s (the first claim acquires, the rest replay).
\set r random(1, 100)
SELECT (idempo.claim('soak', 'p' || :r || '-' || (extract(epoch FROM now())::bigint / 5),
                     params => '{"sku": "A-7", "qty": 1}', complete_on_commit => true)).outcome;
