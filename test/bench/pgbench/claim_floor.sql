-- Claim latency of the floor (scale section): the bare dedup insert alone, autocommit, the same keys
-- as claim.sql, so that the growth with stored rows of a primary key like idempo's can be compared.
\set k random(100000000000000, 999999999999999)
INSERT INTO dedup (scope, key) VALUES ('bench', 'k' || :k) ON CONFLICT DO NOTHING;
