-- soak: a new key, one-call form (claim completes at commit).
\set k random(100000000000000, 999999999999999)
\set q random(1, 1000)
SELECT (idempo.claim('soak', 'n' || :k, params => jsonb_build_object('sku', 'A-7', 'qty', :q::int),
                     complete_on_commit => true)).outcome;
