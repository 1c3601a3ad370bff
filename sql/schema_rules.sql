-- Rules the schema keeps so that idempo can be distributed by key (Citus, README "Scale-out with
-- Citus"): every unique index of a per-key table (one with a "key" column) includes "key", and
-- per-key tables have no volatile column defaults besides their own id sequences.
SET client_min_messages = warning;
SET idempo.allow_drop_with_records = on;  -- the previous test leaves records
DROP EXTENSION IF EXISTS idempo CASCADE;
RESET idempo.allow_drop_with_records;
CREATE EXTENSION idempo;
RESET client_min_messages;

-- Unique indexes (primary keys and partial ones included) of the tables in a schema that have a
-- column named col but do not include it.  Expression columns count as not including it.
CREATE FUNCTION regress.unique_indexes_without(nsp name, col name)
    RETURNS TABLE (tbl regclass, idx regclass) LANGUAGE sql STABLE AS $$
    SELECT i.indrelid::regclass, i.indexrelid::regclass
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indrelid
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = col AND NOT a.attisdropped
    WHERE c.relnamespace = nsp::regnamespace AND c.relkind IN ('r', 'p') AND i.indisunique
      AND NOT a.attnum = ANY (i.indkey::int2[])
    ORDER BY c.relname, i.indexrelid::regclass::text
$$;

-- The per-key tables, and every unique index on them (what the rule is checked against).
SELECT c.oid::regclass AS per_key_table,
       (SELECT string_agg(i.indexrelid::regclass::text, ', ' ORDER BY i.indexrelid::regclass::text)
          FROM pg_index i WHERE i.indrelid = c.oid AND i.indisunique) AS unique_indexes
FROM pg_class c
WHERE c.relnamespace = 'idempo'::regnamespace AND c.relkind = 'r'
  AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'key')
ORDER BY c.relname;

-- The tables without a key column are reference data (scopes): nothing to check there.
SELECT c.oid::regclass AS reference_table
FROM pg_class c
WHERE c.relnamespace = 'idempo'::regnamespace AND c.relkind = 'r'
  AND NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'key')
ORDER BY c.relname;

-- The rule: no unique index of a per-key table leaves out "key".
SELECT * FROM regress.unique_indexes_without('idempo', 'key');

-- The check finds a violation when there is one.
CREATE TABLE regress.bad_per_key (id bigint PRIMARY KEY, key text NOT NULL, other text);
CREATE UNIQUE INDEX bad_per_key_other_idx ON regress.bad_per_key (other) WHERE key IS NOT NULL;
CREATE UNIQUE INDEX bad_per_key_ok_idx ON regress.bad_per_key (other, key);
SELECT * FROM regress.unique_indexes_without('regress', 'key');
DROP TABLE regress.bad_per_key;

-- Column defaults of per-key tables: constants, or nextval() of the table's own id sequence
-- (no now() and no other volatile function: the C code passes every timestamp as a parameter).
SELECT d.adrelid::regclass AS tbl, a.attname AS col, pg_get_expr(d.adbin, d.adrelid) AS default_expr
FROM pg_attrdef d
JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
JOIN pg_class c ON c.oid = d.adrelid
WHERE c.relnamespace = 'idempo'::regnamespace
  AND EXISTS (SELECT FROM pg_attribute k WHERE k.attrelid = c.oid AND k.attname = 'key')
ORDER BY c.relname, a.attname;
SELECT d.adrelid::regclass AS tbl, a.attname AS col, pg_get_expr(d.adbin, d.adrelid) AS bad_default
FROM pg_attrdef d
JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
JOIN pg_class c ON c.oid = d.adrelid
WHERE c.relnamespace = 'idempo'::regnamespace
  AND EXISTS (SELECT FROM pg_attribute k WHERE k.attrelid = c.oid AND k.attname = 'key')
  AND pg_get_expr(d.adbin, d.adrelid) !~ ('^([0-9]+|nextval\(''idempo\.' || c.relname || '_id_seq''::regclass\))$');
