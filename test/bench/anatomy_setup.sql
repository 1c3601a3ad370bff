-- The extra tables of test/bench/anatomy, after setup.sql: the steps from the floor's bare dedup
-- row to the record idempo's one-call form stores.
CREATE TABLE dedup_fp (scope text, key text, fingerprint bytea, PRIMARY KEY (scope, key));
-- record_copy (setup.sql) without the sweep_at index; both with idempo.operations' fillfactor (90),
-- which LIKE does not copy: inserts fill a page up to it, so it decides how often the table grows
CREATE TABLE record_noidx (LIKE idempo.operations INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    WITH (fillfactor = 90);
ALTER TABLE record_copy SET (fillfactor = 90);
ALTER TABLE record_noidx ADD PRIMARY KEY (scope, key);
