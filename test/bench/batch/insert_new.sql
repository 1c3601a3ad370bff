-- baseline: the same 1,000 new keys into a bare dedup table
WITH i AS (INSERT INTO dedup (scope, key)
           SELECT 'bench.batch', k FROM unnest(array(SELECT 'b-' || s || '-' || g FROM generate_series(1, 1000) g,
                                                     (SELECT nextval('txn_seq') s) x)) k
           ON CONFLICT DO NOTHING RETURNING key)
SELECT count(*) FROM i;
