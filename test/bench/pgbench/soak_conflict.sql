-- soak: the same keys as soak_replay with other parameters: a conflict (recorded by the sweeper).
\set r random(1, 100)
SELECT (idempo.claim('soak', 'p' || :r || '-' || (extract(epoch FROM now())::bigint / 5),
                     params => '{"sku": "A-7", "qty": 2}', complete_on_commit => true)).outcome;
