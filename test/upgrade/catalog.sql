-- A description of everything the extension idempo consists of, one sorted line per fact, free of
-- OIDs: two databases with equal output have the same objects.  test/upgrade/run compares a
-- database updated with ALTER EXTENSION idempo UPDATE against a fresh install of the default
-- version.  Bodies of functions and views appear as md5 (the line names the object).
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
SET search_path = pg_catalog;
WITH ext AS (SELECT oid, extnamespace FROM pg_extension WHERE extname = 'idempo'),
members AS (
    SELECT d.classid, d.objid, d.objsubid FROM pg_depend d, ext
    WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'),
rels AS (   -- member relations and the indexes/toast of member tables
    SELECT c.* FROM pg_class c
    WHERE c.oid IN (SELECT objid FROM members WHERE classid = 'pg_class'::regclass)
       OR c.oid IN (SELECT i.indexrelid FROM pg_index i
                    WHERE i.indrelid IN (SELECT objid FROM members WHERE classid = 'pg_class'::regclass))),
procs AS (
    SELECT p.* FROM pg_proc p WHERE p.oid IN (SELECT objid FROM members WHERE classid = 'pg_proc'::regclass)),
types AS (
    SELECT t.* FROM pg_type t WHERE t.oid IN (SELECT objid FROM members WHERE classid = 'pg_type'::regclass)),
lines(line) AS (
    -- the extension itself
    SELECT format('extension version=%s relocatable=%s schema=%s', e.extversion, e.extrelocatable,
                  e.extnamespace::regnamespace)
    FROM pg_extension e WHERE e.extname = 'idempo'
    -- every member, by its description
    UNION ALL
    SELECT 'member ' || pg_describe_object(classid, objid, objsubid) FROM members
    -- pg_dump of rows: extconfig / extcondition
    UNION ALL
    SELECT format('config_dump %s condition=%L', cfg.rel::regclass, cfg.cond)
    FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS cfg(rel, cond)
    WHERE e.extname = 'idempo'
    -- schema
    UNION ALL
    SELECT format('schema %s owner=%s acl=%s', n.nspname, n.nspowner::regrole, n.nspacl)
    FROM pg_namespace n, ext WHERE n.oid = ext.extnamespace
    -- relations: kind, persistence, options, row security, owner, grants
    UNION ALL
    SELECT format('relation %s kind=%s persistence=%s options=%s rls=%s/%s replident=%s owner=%s acl=%s',
                  r.oid::regclass, r.relkind, r.relpersistence, r.reloptions, r.relrowsecurity,
                  r.relforcerowsecurity, r.relreplident, r.relowner::regrole, r.relacl)
    FROM rels r
    -- columns, in order (dropped columns skipped), with type, nullability, default, collation, grants
    UNION ALL
    SELECT format('column %s #%s %s type=%s notnull=%s default=%s identity=%s generated=%s collation=%s storage=%s acl=%s',
                  a.attrelid::regclass,
                  lpad((row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum))::text, 3, '0'), a.attname,
                  format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  pg_get_expr(ad.adbin, ad.adrelid), a.attidentity, a.attgenerated,
                  CASE WHEN a.attcollation <> 0 THEN a.attcollation::regcollation::text END,
                  a.attstorage, a.attacl)
    FROM pg_attribute a JOIN rels r ON r.oid = a.attrelid
    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
    WHERE a.attnum > 0 AND NOT a.attisdropped
    -- indexes with their definitions
    UNION ALL
    SELECT format('index %s on %s: %s valid=%s clustered=%s replident=%s', i.indexrelid::regclass,
                  i.indrelid::regclass, pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisclustered,
                  i.indisreplident)
    FROM pg_index i JOIN rels r ON r.oid = i.indrelid
    -- constraints
    UNION ALL
    SELECT format('constraint %s on %s: %s deferrable=%s deferred=%s validated=%s',
                  co.conname, co.conrelid::regclass, pg_get_constraintdef(co.oid), co.condeferrable,
                  co.condeferred, co.convalidated)
    FROM pg_constraint co JOIN rels r ON r.oid = co.conrelid
    -- triggers
    UNION ALL
    SELECT format('trigger %s enabled=%s: %s', t.tgname, t.tgenabled, pg_get_triggerdef(t.oid))
    FROM pg_trigger t JOIN rels r ON r.oid = t.tgrelid WHERE NOT t.tgisinternal
    -- event triggers: event, tags, enabled, function, owner
    UNION ALL
    SELECT format('event trigger %s on %s tags=%s enabled=%s function=%s owner=%s', et.evtname, et.evtevent,
                  et.evttags, et.evtenabled, et.evtfoid::regprocedure, et.evtowner::regrole)
    FROM pg_event_trigger et
    WHERE et.oid IN (SELECT objid FROM members WHERE classid = 'pg_event_trigger'::regclass)
    -- rules other than views' own, and row security policies
    UNION ALL
    SELECT format('rule %s on %s: md5 %s', ru.rulename, ru.ev_class::regclass, md5(pg_get_ruledef(ru.oid)))
    FROM pg_rewrite ru JOIN rels r ON r.oid = ru.ev_class WHERE ru.rulename <> '_RETURN'
    UNION ALL
    SELECT format('policy %s on %s: %s %s to %s using %s check %s', po.polname, po.polrelid::regclass,
                  po.polcmd, po.polpermissive, po.polroles::regrole[], pg_get_expr(po.polqual, po.polrelid),
                  pg_get_expr(po.polwithcheck, po.polrelid))
    FROM pg_policy po JOIN rels r ON r.oid = po.polrelid
    -- views
    UNION ALL
    SELECT format('view %s definition md5 %s', r.oid::regclass, md5(pg_get_viewdef(r.oid)))
    FROM rels r WHERE r.relkind IN ('v', 'm')
    -- sequences: parameters and ownership
    UNION ALL
    SELECT format('sequence %s type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s owned_by=%s',
                  s.seqrelid::regclass, s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin,
                  s.seqmax, s.seqcache, s.seqcycle,
                  (SELECT d.refobjid::regclass || '.' || a.attname FROM pg_depend d
                   JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                   WHERE d.classid = 'pg_class'::regclass AND d.objid = s.seqrelid
                     AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')))
    FROM pg_sequence s JOIN rels r ON r.oid = s.seqrelid
    -- functions: signature, result, arguments with defaults, kind, volatility, parallel safety,
    -- strictness, security, settings, cost/rows, language, owner, grants, and the whole definition
    UNION ALL
    SELECT format('function %s returns %s args(%s) kind=%s volatility=%s parallel=%s strict=%s '
                  'security_definer=%s leakproof=%s config=%s cost=%s rows=%s language=%s owner=%s acl=%s '
                  'definition md5 %s',
                  p.oid::regprocedure, pg_get_function_result(p.oid), pg_get_function_arguments(p.oid),
                  p.prokind, p.provolatile, p.proparallel, p.proisstrict, p.prosecdef, p.proleakproof,
                  p.proconfig, p.procost, p.prorows, l.lanname, p.proowner::regrole, p.proacl,
                  md5(CASE WHEN p.prokind IN ('a', 'w') THEN p.prosrc ELSE pg_get_functiondef(p.oid) END))
    FROM procs p JOIN pg_language l ON l.oid = p.prolang
    -- C functions: the symbol and library
    UNION ALL
    SELECT format('function %s symbol=%s library=%s', p.oid::regprocedure, p.prosrc, p.probin)
    FROM procs p WHERE p.probin IS NOT NULL
    -- types: kind, owner, grants; enum labels in order; composite attributes come from "column"
    UNION ALL
    SELECT format('type %s kind=%s owner=%s acl=%s', t.oid::regtype, t.typtype, t.typowner::regrole, t.typacl)
    FROM types t
    UNION ALL
    SELECT format('enum %s label #%s %s', t.oid::regtype,
                  lpad((row_number() OVER (PARTITION BY t.oid ORDER BY en.enumsortorder))::text, 3, '0'), en.enumlabel)
    FROM types t JOIN pg_enum en ON en.enumtypid = t.oid
    UNION ALL
    SELECT format('column %s #%s %s type=%s collation=%s', t.oid::regtype,
                  lpad((row_number() OVER (PARTITION BY t.oid ORDER BY a.attnum))::text, 3, '0'), a.attname,
                  format_type(a.atttypid, a.atttypmod),
                  CASE WHEN a.attcollation <> 0 THEN a.attcollation::regcollation::text END)
    FROM types t JOIN pg_attribute a ON a.attrelid = t.typrelid
    WHERE t.typtype = 'c' AND a.attnum > 0 AND NOT a.attisdropped
      AND t.typrelid NOT IN (SELECT oid FROM rels)
    UNION ALL
    SELECT format('domain %s base=%s notnull=%s default=%s', t.oid::regtype, format_type(t.typbasetype, t.typtypmod),
                  t.typnotnull, t.typdefault)
    FROM types t WHERE t.typtype = 'd'
    -- comments on members and their columns
    UNION ALL
    SELECT format('comment on %s: %s', pg_describe_object(de.classoid, de.objoid, de.objsubid),
                  replace(de.description, E'\n', ' '))
    FROM pg_description de
    WHERE (de.classoid, de.objoid) IN (SELECT classid, objid FROM members)
       OR (de.classoid = 'pg_class'::regclass AND de.objoid IN (SELECT oid FROM rels))
    -- default privileges in the schema
    UNION ALL
    SELECT format('default_acl role=%s kind=%s acl=%s', da.defaclrole::regrole, da.defaclobjtype, da.defaclacl)
    FROM pg_default_acl da, ext WHERE da.defaclnamespace = ext.extnamespace
    -- objects in the schema that are not members (they would survive DROP EXTENSION)
    UNION ALL
    SELECT 'not a member: ' || pg_describe_object('pg_class'::regclass, c.oid, 0)
    FROM pg_class c, ext
    WHERE c.relnamespace = ext.extnamespace AND c.relkind NOT IN ('i', 'I')
      AND c.oid NOT IN (SELECT oid FROM rels)
      AND NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                      AND d.deptype IN ('a', 'i'))
    UNION ALL
    SELECT 'not a member: ' || pg_describe_object('pg_proc'::regclass, p.oid, 0)
    FROM pg_proc p, ext WHERE p.pronamespace = ext.extnamespace AND p.oid NOT IN (SELECT oid FROM procs)
)
SELECT line FROM lines ORDER BY line COLLATE "C";
