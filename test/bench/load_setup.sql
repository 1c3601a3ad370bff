-- Scopes of test/bench/load, in database "bench" (after setup.sql): the hot-key scope, and one
-- scope per option whose cost the feature section measures (each otherwise like 'bench').
SELECT idempo.create_scope('hot', retention => '7 days', lease => '1 hour') \gset
SELECT idempo.create_scope('f_plain', retention => '7 days') \gset
SELECT idempo.create_scope('f_audit', retention => '7 days', audit => true) \gset
SELECT idempo.create_scope('f_store_params', retention => '7 days', store_params => true) \gset
SELECT idempo.create_scope('f_hash_keys', retention => '7 days', hash_keys => true) \gset
SELECT idempo.create_scope('f_require_fingerprint', retention => '7 days', require_fingerprint => true) \gset
SELECT idempo.create_scope('f_remember', retention => '7 days', remember => '1 year') \gset
SELECT idempo.create_scope('f_fingerprint_ignore', retention => '7 days', fingerprint_ignore => '{delivered_at}') \gset
