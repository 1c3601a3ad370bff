-- Writes (as its only output) a query that digests every row of every idempo table and the value
-- of every idempo sequence, naming the columns as they are NOW.  test/upgrade/run writes it before
-- ALTER EXTENSION idempo UPDATE and runs it before and after: rows must be kept even when the
-- update adds columns (to a table, or to the row type stored in reviews.operation), so the
-- digest covers exactly the columns the old version had; a dropped column makes it fail.
\set ON_ERROR_STOP 1
SET search_path = pg_catalog;
WITH tabs AS (
    SELECT c.oid, c.relname FROM pg_class c
    JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
    JOIN pg_extension e ON d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
    WHERE e.extname = 'idempo' AND c.relkind = 'r'),
cols AS (   -- a composite column is spelled out field by field (one level)
    SELECT t.relname, a.attnum,
           CASE WHEN ty.typtype = 'c' THEN
                (SELECT string_agg(format('(t.%I).%I AS "%s.%s"', a.attname, s.attname, a.attnum, s.attnum),
                                   ', ' ORDER BY s.attnum)
                 FROM pg_attribute s WHERE s.attrelid = ty.typrelid AND s.attnum > 0 AND NOT s.attisdropped)
                ELSE format('t.%I AS "%s"', a.attname, a.attnum) END AS expr
    FROM tabs t
    JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped
    JOIN pg_type ty ON ty.oid = a.atttypid),
per_table AS (
    SELECT relname, format($q$SELECT %L || ' ' || count(*) || ' ' || coalesce(md5(string_agg(x::text, '|' ORDER BY x::text)), '-') FROM (SELECT %s FROM idempo.%I t) x$q$,
                           relname, string_agg(expr, ', ' ORDER BY attnum), relname) AS q
    FROM cols GROUP BY relname)
SELECT string_agg(q, E'\nUNION ALL ' ORDER BY relname)
       || E'\nUNION ALL SELECT ''sequence '' || sequencename || '' '' || coalesce(last_value::text, ''unused'')'
       || E'\n  FROM pg_catalog.pg_sequences WHERE schemaname = ''idempo'' AND sequencename IN ('
       || (SELECT string_agg(quote_literal(sequencename), ', ' ORDER BY sequencename)
           FROM pg_sequences WHERE schemaname = 'idempo')
       || E')\nORDER BY 1;'
FROM per_table;
