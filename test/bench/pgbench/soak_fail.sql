-- soak: a failing call: one of 50 keys reused for 10 s, each attempt fails (retryable).
\set r random(1, 50)
SELECT soak_fail('f' || :r || '-' || (extract(epoch FROM now())::bigint / 10));
