-- Busy path, uncommitted holder: claim (wait => false) a key claimed by another session's open
-- transaction (../holder.sql holds h1..h:held).
\set r random(1, :held)
SELECT (idempo.claim('bench', 'h' || :r, params => '{"sku": "A-7", "qty": 1}', wait => false)).outcome;
