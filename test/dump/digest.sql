-- One line per idempo table and sequence: a digest of its whole content.
SELECT 'scopes ' || md5(string_agg(t::text, '|' ORDER BY t::text)) FROM idempo.scopes t
UNION ALL SELECT 'operations ' || count(*) || ' ' || md5(string_agg(t::text, '|' ORDER BY t::text)) FROM idempo.operations t
UNION ALL SELECT 'conflicts ' || count(*) || ' ' || md5(string_agg(t::text, '|' ORDER BY t::text)) FROM idempo.conflicts t
UNION ALL SELECT 'reviews ' || count(*) || ' ' || md5(string_agg(t::text, '|' ORDER BY t::text)) FROM idempo.reviews t
UNION ALL SELECT 'events ' || count(*) || ' ' || md5(string_agg(t::text, '|' ORDER BY t::text)) FROM idempo.events t
UNION ALL SELECT 'sequence ' || sequencename || ' ' || coalesce(last_value::text, 'unused')
          FROM pg_sequences WHERE schemaname = 'idempo'
ORDER BY 1;
