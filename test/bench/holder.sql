-- For the busy_locked path: claims h1..h:held in one transaction and keeps it open, so that
-- claims of these keys with wait => false find the key lock taken.  The runner ends the session.
SET application_name = 'idempo-bench-holder';
BEGIN;
SELECT count(*) FROM generate_series(1, :held) g,
       LATERAL idempo.claim('bench', 'h' || g, params => '{"sku": "A-7", "qty": 1}') c;
SELECT pg_sleep(600);
