-- a batch of 1,000 new keys, the one-transaction form
SELECT count(*) FROM idempo.claim_batch('bench.batch',
    array(SELECT 'b-' || s || '-' || g FROM generate_series(1, 1000) g, (SELECT nextval('txn_seq') s) x),
    complete_on_commit => true) WHERE outcome = 'acquired';
