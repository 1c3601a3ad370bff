SET client_min_messages = warning;
-- Replaces the rows of the floor's dedup table (created if missing) with :n keys spread exactly as
-- load.sql spreads idempo's, in ascending order; then VACUUM ANALYZE.  For the scale section.
CREATE TABLE IF NOT EXISTS dedup (scope text, key text, PRIMARY KEY (scope, key));
BEGIN;
TRUNCATE dedup;
INSERT INTO dedup (scope, key)
SELECT 'bench', 'k' || (100000000000000 + i * (900000000000000 / :n)) FROM generate_series(0, :n - 1) i;
COMMIT;
VACUUM ANALYZE dedup;
