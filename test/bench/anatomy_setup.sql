-- The extra tables of test/bench/anatomy, after setup.sql: the steps from the floor's bare dedup
-- row to the record idempo's one-call form stores.
CREATE TABLE dedup_fp (scope text, key text, fingerprint bytea, PRIMARY KEY (scope, key));
-- record_copy (setup.sql) without the sweep_at index (both with the default fillfactor: LIKE does not
-- copy idempo.operations' 90, which matters to updates, not to these inserts)
CREATE TABLE record_noidx (LIKE idempo.operations INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE record_noidx ADD PRIMARY KEY (scope, key);
