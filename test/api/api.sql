-- The installed API of idempo, one line per object or column, sorted: what test/api/dump.py
-- writes into the snapshot (test/api/README.md).  Everything in schema idempo, whoever made it
-- (the managed edition's objects belong to no extension); the owner is written "owner", so that
-- an install by another role reads the same.
WITH ns AS (SELECT oid FROM pg_catalog.pg_namespace WHERE nspname = 'idempo'),
acl(kind, oid, txt) AS (
  SELECT k, o, coalesce(string_agg(
           CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                WHEN a.grantee = own THEN 'owner'
                ELSE pg_catalog.pg_get_userbyid(a.grantee) END
           || '=' || a.privilege_type || CASE WHEN a.is_grantable THEN '*' ELSE '' END,
           ',' ORDER BY 1) FILTER (WHERE a.grantee <> own), 'none')
  -- no ACL is the default one (EXECUTE for PUBLIC on a function); the owner's own rights are
  -- implied: PUBLIC and other roles are the contract
  FROM (SELECT 'f' AS k, p.oid AS o, p.proowner AS own,
               coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner)) AS acl
          FROM pg_catalog.pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
        UNION ALL
        SELECT 'r', c.oid, c.relowner,
               coalesce(c.relacl, pg_catalog.acldefault(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char", c.relowner))
          FROM pg_catalog.pg_class c WHERE c.relnamespace = (SELECT oid FROM ns)) AS x
  CROSS JOIN LATERAL pg_catalog.aclexplode(x.acl) AS a
  GROUP BY k, o
),
lines(line) AS (
  -- functions and procedures: arguments with names and defaults, result, and how they run
  SELECT pg_catalog.format('%s %s(%s)%s | %s | %s | %s | %s | config %s | execute %s',
           CASE p.prokind WHEN 'p' THEN 'procedure' WHEN 'a' THEN 'aggregate' ELSE 'function' END,
           p.oid::pg_catalog.regproc::text,
           pg_catalog.pg_get_function_arguments(p.oid),
           CASE WHEN p.prokind = 'p' THEN '' ELSE ' returns ' || pg_catalog.pg_get_function_result(p.oid) END,
           CASE p.provolatile WHEN 'i' THEN 'immutable' WHEN 's' THEN 'stable' ELSE 'volatile' END,
           CASE WHEN p.prosecdef THEN 'security definer' ELSE 'security invoker' END,
           CASE WHEN p.proisstrict THEN 'strict' ELSE 'called on null input' END,
           CASE p.proparallel WHEN 's' THEN 'parallel safe' WHEN 'r' THEN 'parallel restricted' ELSE 'parallel unsafe' END,
           coalesce(pg_catalog.array_to_string(p.proconfig, ','), 'none'),
           (SELECT txt FROM acl WHERE kind = 'f' AND oid = p.oid))
  FROM pg_catalog.pg_proc p
  WHERE p.pronamespace = (SELECT oid FROM ns)
  UNION ALL
  -- tables, views, sequences, composite types: what they are and who may use them
  SELECT pg_catalog.format('%s %s%s',
           CASE c.relkind WHEN 'r' THEN 'table' WHEN 'p' THEN 'table' WHEN 'v' THEN 'view'
                          WHEN 'm' THEN 'materialized view' WHEN 'S' THEN 'sequence'
                          WHEN 'c' THEN 'type' WHEN 'f' THEN 'foreign table' END,
           c.oid::pg_catalog.regclass::text,
           CASE WHEN c.relkind = 'c' THEN ''
                ELSE ' | access ' || (SELECT txt FROM acl WHERE kind = 'r' AND oid = c.oid) END)
  FROM pg_catalog.pg_class c
  WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'c', 'f')
  UNION ALL
  -- their columns, in order, with type and NOT NULL
  SELECT pg_catalog.format('column %s.%s %s %s%s',
           c.oid::pg_catalog.regclass::text, pg_catalog.lpad(a.attnum::text, 2, '0'), a.attname,
           pg_catalog.format_type(a.atttypid, a.atttypmod),
           CASE WHEN a.attnotnull THEN ' not null' ELSE '' END)
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
  WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('r', 'p', 'v', 'm', 'c', 'f')
  UNION ALL
  -- enums and domains
  SELECT pg_catalog.format('enum %s (%s)', t.oid::pg_catalog.regtype::text,
           (SELECT pg_catalog.string_agg(pg_catalog.quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder)
              FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid))
  FROM pg_catalog.pg_type t WHERE t.typnamespace = (SELECT oid FROM ns) AND t.typtype = 'e'
  UNION ALL
  SELECT pg_catalog.format('domain %s %s', t.oid::pg_catalog.regtype::text, pg_catalog.format_type(t.typbasetype, t.typtypmod))
  FROM pg_catalog.pg_type t WHERE t.typnamespace = (SELECT oid FROM ns) AND t.typtype = 'd'
  UNION ALL
  -- settings: the library's (pg_settings) and any idempo.* placeholder a setting made
  SELECT pg_catalog.format('setting %s %s | context %s | default %s%s | min %s | max %s',
           s.name, s.vartype, s.context, coalesce(pg_catalog.quote_literal(s.boot_val), 'none'),
           coalesce(' ' || s.unit, ''), coalesce(s.min_val, 'none'), coalesce(s.max_val, 'none'))
  FROM pg_catalog.pg_settings s WHERE s.name LIKE 'idempo.%'
  UNION ALL
  SELECT pg_catalog.format('event trigger %s on %s%s', e.evtname, e.evtevent,
           CASE WHEN e.evttags IS NULL THEN '' ELSE ' ' || pg_catalog.array_to_string(e.evttags, ',') END)
  FROM pg_catalog.pg_event_trigger e
  JOIN pg_catalog.pg_proc p ON p.oid = e.evtfoid AND p.pronamespace = (SELECT oid FROM ns)
)
SELECT line FROM lines ORDER BY line COLLATE "C";
