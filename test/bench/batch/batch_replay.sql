-- a batch of 1,000 finished keys: replays
\set r random(0, 98999)
SELECT count(*) FROM idempo.claim_batch('bench.replay',
    array(SELECT 'r-' || g FROM generate_series(:r + 1, :r + 1000) g)) WHERE outcome = 'replay';
