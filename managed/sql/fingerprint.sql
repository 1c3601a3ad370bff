-- idempo.fingerprint() in PL/pgSQL: the same bytes as src/fingerprint.c and
-- src/fingerprint_rules.c (docs/fingerprints.md, docs/fingerprint-rules.md), checked by managed/run
-- against test/fingerprint/reference.py like the C edition.
--
-- The C code streams jsonb's iterator into SHA-256.  Here the canonical encoding is built in
-- document order with an explicit stack (no recursion: a document nested 5000 deep must not hit
-- max_stack_depth), its pieces collected in an array and joined once (appending to a bytea in
-- the loop would copy it every time), then hashed with pg_catalog.sha256() (PostgreSQL 11+).
-- Keys come out of jsonb_each in jsonb's order, which is the canonical one (by byte length, then
-- bytewise); the ORDER BY says so rather than relying on it.  Numbers: trim_scale() then the
-- numeric's text is numeric_normalize()'s minimal form.  Strings are hashed in the database
-- encoding, as the C code does.
--
-- An object whose values are all scalars (most requests) is encoded by one query over
-- jsonb_each instead, the same pieces in the same order: the loop costs a statement per value
-- and per object, which made it about a sixth of a claim; a recursive query over any document
-- was slower than the loop (test/bench/managed_ladder).

CREATE FUNCTION idempo.fingerprint(params jsonb) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    enc name := getdatabaseencoding();
    vals jsonb[] := ARRAY[params];      -- the stack: values still to write, top at the end
    keys text[] := ARRAY[NULL::text];   -- the object key written before each, or NULL
    top int := 1;
    pieces bytea[] := '{}';
    n int := 0;
    v jsonb;
    k text;
    s bytea;
    r record;
    nested boolean;
BEGIN
    IF jsonb_typeof(params) = 'object' THEN
        SELECT sha256('\x4f'::bytea || int4send(count(*)::int) || coalesce(string_agg(
                   '\x53'::bytea || int4send(octet_length(convert_to(e.key, enc))) || convert_to(e.key, enc)
                   || CASE jsonb_typeof(e.value)
                          WHEN 'string' THEN '\x53'::bytea || int4send(octet_length(convert_to(e.value #>> '{}', enc)))
                                             || convert_to(e.value #>> '{}', enc)
                          WHEN 'number' THEN '\x4e'::bytea || int4send(octet_length(convert_to(trim_scale(e.value::numeric)::text, enc)))
                                             || convert_to(trim_scale(e.value::numeric)::text, enc)
                          WHEN 'boolean' THEN CASE WHEN e.value::boolean THEN '\x74'::bytea ELSE '\x66'::bytea END
                          WHEN 'null' THEN '\x6e'::bytea END,
                   ''::bytea ORDER BY octet_length(e.key), e.key COLLATE "C"), ''::bytea)),
               bool_or(jsonb_typeof(e.value) IN ('object', 'array'))
          INTO s, nested
          FROM jsonb_each(params) AS e;
        IF nested IS NOT TRUE THEN      -- NULL: {}
            RETURN s;
        END IF;
    END IF;
    WHILE top > 0 LOOP
        v := vals[top];
        k := keys[top];
        top := top - 1;
        IF k IS NOT NULL THEN
            s := convert_to(k, enc);
            n := n + 1;
            pieces[n] := '\x53'::bytea || int4send(octet_length(s)) || s;      -- S
        END IF;
        CASE jsonb_typeof(v)
            WHEN 'object' THEN
                n := n + 1;
                pieces[n] := '\x4f'::bytea || int4send((SELECT count(*)::int FROM jsonb_object_keys(v)));  -- O
                -- pushed last first, so that the first pops first
                FOR r IN SELECT e.key, e.value FROM jsonb_each(v) AS e
                         ORDER BY octet_length(e.key) DESC, e.key COLLATE "C" DESC LOOP
                    top := top + 1;
                    vals[top] := r.value;
                    keys[top] := r.key;
                END LOOP;
            WHEN 'array' THEN
                n := n + 1;
                pieces[n] := '\x41'::bytea || int4send(jsonb_array_length(v));   -- A
                FOR r IN SELECT e.value FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, i)
                         ORDER BY e.i DESC LOOP
                    top := top + 1;
                    vals[top] := r.value;
                    keys[top] := NULL;
                END LOOP;
            WHEN 'string' THEN
                s := convert_to(v #>> '{}', enc);
                n := n + 1;
                pieces[n] := '\x53'::bytea || int4send(octet_length(s)) || s;
            WHEN 'number' THEN
                s := convert_to(trim_scale(v::numeric)::text, enc);
                n := n + 1;
                pieces[n] := '\x4e'::bytea || int4send(octet_length(s)) || s;   -- N
            WHEN 'boolean' THEN
                n := n + 1;
                pieces[n] := CASE WHEN v::boolean THEN '\x74'::bytea ELSE '\x66'::bytea END;  -- t, f
            ELSE
                n := n + 1;
                pieces[n] := '\x6e'::bytea;                                      -- n
        END CASE;
    END LOOP;
    RETURN sha256((SELECT string_agg(p, ''::bytea ORDER BY i) FROM unnest(pieces) WITH ORDINALITY AS u(p, i)));
END
$$;

-- The document without the named fields, then fingerprinted: each path's segments must run
-- through objects from the top (arrays are not entered), and #- removes the field it ends on.
-- The checks and messages are src/fingerprint_rules.c's.
CREATE FUNCTION idempo.fingerprint(params jsonb, ignore text[]) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    p text;
    segs text[];
    i int := 0;
    through_objects boolean;
BEGIN
    IF params IS NULL THEN
        RETURN NULL;
    END IF;
    IF ignore IS NULL THEN
        RETURN idempo.fingerprint(params);
    END IF;
    IF array_ndims(ignore) > 1 THEN
        RAISE EXCEPTION 'fingerprint ignore paths must be a one-dimensional array'
            USING ERRCODE = '22023', HINT = 'Pass e.g. ARRAY[''delivered_at'', ''meta.trace_id''].';
    END IF;
    IF cardinality(ignore) > 256 THEN
        RAISE EXCEPTION '% fingerprint ignore paths given, the limit is 256', cardinality(ignore)
            USING ERRCODE = '22023',
                  HINT = 'Name the few volatile fields (delivery times, attempt counters, trace ids); leave the object that holds many of them out as one path.';
    END IF;
    FOREACH p IN ARRAY ignore LOOP
        i := i + 1;
        IF p IS NULL THEN
            RAISE EXCEPTION 'fingerprint ignore path % is NULL', i
                USING ERRCODE = '22023', HINT = 'Remove the NULL element.';
        ELSIF p = '' THEN
            RAISE EXCEPTION 'fingerprint ignore path % is empty', i
                USING ERRCODE = '22023', HINT = 'A path names a field, e.g. ''delivered_at'' or ''meta.trace_id''.';
        ELSIF octet_length(p) > 1024 THEN
            RAISE EXCEPTION 'fingerprint ignore path % is % bytes long, the limit is 1024', i, octet_length(p)
                USING ERRCODE = '22023', HINT = 'Use a shorter path.';
        ELSIF starts_with(p, '.') OR right(p, 1) = '.' OR strpos(p, '..') > 0 THEN
            RAISE EXCEPTION 'fingerprint ignore path % ("%") has an empty segment', i, p
                USING ERRCODE = '22023', HINT = 'Separate object keys with single dots, without a dot at either end.';
        END IF;
    END LOOP;
    IF jsonb_typeof(params) <> 'object' THEN
        RETURN idempo.fingerprint(params);
    END IF;
    FOREACH p IN ARRAY ignore LOOP
        segs := string_to_array(p, '.');
        through_objects := true;
        FOR d IN 1 .. cardinality(segs) - 1 LOOP
            IF jsonb_typeof(params #> segs[1:d]) IS DISTINCT FROM 'object' THEN
                through_objects := false;
                EXIT;
            END IF;
        END LOOP;
        IF through_objects THEN
            params := params #- segs;
        END IF;
    END LOOP;
    RETURN idempo.fingerprint(params);
END
$$;

-- fingerprint_include (src/fingerprint_include.c): a list of paths parsed into steps, as a jsonb
-- array of step arrays (an object key as a string, [*] as null), with the C code's checks and
-- messages (byte positions counted in bytes, as the C code counts them); NULL for no list.
-- p_scope names the scope in the messages (NULL: idempo.fingerprint(params, ignore, include)).
CREATE FUNCTION idempo.managed_include_steps(paths text[], p_scope text) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    grammar constant text := 'A path is object keys separated by dots, each optionally followed by [*] for every element of an array, e.g. ''order'', ''customer.id'', ''items[*].sku''; a backslash takes the next character literally (''a\.b'' is the key "a.b").';
    what text := CASE WHEN p_scope IS NULL THEN 'fingerprint include path %s %s'
                      ELSE format('fingerprint_include of scope "%s": path %%s %%s', replace(p_scope, '%', '%%')) END;
    out jsonb := '[]';
    steps jsonb;
    p text;
    c text[];
    n int;
    i int;
    b int;
    k text;
    idx int := 0;
BEGIN
    IF paths IS NULL THEN
        RETURN NULL;
    END IF;
    IF array_ndims(paths) > 1 THEN
        RAISE EXCEPTION '%', CASE WHEN p_scope IS NULL THEN 'fingerprint include paths must be a one-dimensional array'
                                  ELSE format('fingerprint_include of scope "%s" must be a one-dimensional array', p_scope) END
            USING ERRCODE = '22023', HINT = 'Pass e.g. ARRAY[''order'', ''items[*].sku''].';
    END IF;
    IF coalesce(cardinality(paths), 0) = 0 THEN
        RETURN NULL;
    END IF;
    IF cardinality(paths) > 256 THEN
        RAISE EXCEPTION '%', CASE WHEN p_scope IS NULL THEN format('%s fingerprint include paths given, the limit is 256', cardinality(paths))
                                  ELSE format('fingerprint_include of scope "%s" has %s paths, the limit is 256', p_scope, cardinality(paths)) END
            USING ERRCODE = '22023', HINT = 'Name the fields that identify the request; a path that ends on an object counts all of it.';
    END IF;
    FOREACH p IN ARRAY paths LOOP
        idx := idx + 1;
        IF p IS NULL THEN
            RAISE EXCEPTION '%', format(what, idx, 'is NULL') USING ERRCODE = '22023', HINT = 'Remove the NULL element.';
        ELSIF p = '' THEN
            RAISE EXCEPTION '%', format(what, idx, 'is empty') USING ERRCODE = '22023', HINT = grammar;
        ELSIF octet_length(p) > 1024 THEN
            RAISE EXCEPTION '%', format(what, idx, format('is %s bytes long, the limit is 1024', octet_length(p)))
                USING ERRCODE = '22023', HINT = 'Use a shorter path.';
        END IF;
        c := regexp_split_to_array(p, '');
        n := cardinality(c);
        i := 1;
        b := 0;         -- bytes before c[i]
        steps := '[]';
        LOOP
            k := '';
            WHILE i <= n AND c[i] NOT IN ('.', '[') LOOP
                IF c[i] = '\' THEN
                    i := i + 1;
                    b := b + 1;
                    IF i > n THEN
                        RAISE EXCEPTION '%', format(what, idx, format('("%s") ends in a lone backslash', p))
                            USING ERRCODE = '22023', HINT = grammar;
                    END IF;
                END IF;
                k := k || c[i];
                b := b + octet_length(c[i]);
                i := i + 1;
            END LOOP;
            IF k = '' THEN
                RAISE EXCEPTION '%', format(what, idx, format('("%s") has an empty key at byte %s', p, b + 1))
                    USING ERRCODE = '22023', HINT = grammar;
            END IF;
            steps := steps || jsonb_build_array(k);
            WHILE i <= n AND c[i] = '[' LOOP
                IF i + 2 > n OR c[i + 1] <> '*' OR c[i + 2] <> ']' THEN
                    RAISE EXCEPTION '%', format(what, idx, format('("%s") has ''['' at byte %s that does not start [*]', p, b + 1))
                        USING ERRCODE = '22023', HINT = grammar;
                END IF;
                steps := steps || '[null]'::jsonb;
                i := i + 3;
                b := b + 3;
            END LOOP;
            EXIT WHEN i > n;
            IF c[i] <> '.' THEN
                RAISE EXCEPTION '%', format(what, idx, format('("%s") has no dot after [*] at byte %s', p, b + 1))
                    USING ERRCODE = '22023', HINT = grammar;
            END IF;
            i := i + 1;
            b := b + 1;
            IF i > n THEN
                RAISE EXCEPTION '%', format(what, idx, format('("%s") ends in a dot', p))
                    USING ERRCODE = '22023', HINT = grammar;
            END IF;
        END LOOP;
        out := out || jsonb_build_array(steps);
    END LOOP;
    RETURN out;
END
$$;

-- The projection of v onto the remaining steps of the paths that reach it (rests: a jsonb array
-- of step arrays); NULL: nothing found.  The rules of src/fingerprint_include.c: a path that ends
-- here keeps v whole; an object keeps the members where something is found (none: nothing); an
-- array under [*] keeps every element, {} where nothing is found; anything else finds nothing.
-- Recursive: a path's depth is bounded by its 1024 bytes.
CREATE FUNCTION idempo.managed_project(v jsonb, rests jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    out jsonb;
    sub jsonb;
    k text;
    p jsonb;
BEGIN
    IF EXISTS (SELECT FROM jsonb_array_elements(rests) AS r WHERE r = '[]'::jsonb) THEN
        RETURN v;
    END IF;
    IF jsonb_typeof(v) = 'object' THEN
        out := '{}';
        FOR k, sub IN SELECT r ->> 0, jsonb_agg(r - 0) FROM jsonb_array_elements(rests) AS r
                      WHERE jsonb_typeof(r -> 0) = 'string' GROUP BY 1 LOOP
            IF v ? k THEN
                p := idempo.managed_project(v -> k, sub);
                IF p IS NOT NULL THEN
                    out := out || jsonb_build_object(k, p);
                END IF;
            END IF;
        END LOOP;
        RETURN CASE WHEN out = '{}'::jsonb THEN NULL ELSE out END;
    ELSIF jsonb_typeof(v) = 'array' THEN
        sub := (SELECT jsonb_agg(r - 0) FROM jsonb_array_elements(rests) AS r WHERE jsonb_typeof(r -> 0) = 'null');
        IF sub IS NULL THEN
            RETURN NULL;
        END IF;
        RETURN coalesce((SELECT jsonb_agg(coalesce(idempo.managed_project(e.value, sub), '{}'::jsonb) ORDER BY e.i)
                         FROM jsonb_array_elements(v) WITH ORDINALITY AS e(value, i)), '[]'::jsonb);
    END IF;
    RETURN NULL;
END
$$;

-- The document as fingerprint_include leaves it (steps: managed_include_steps()): itself without
-- a rule or when its top is not an object, {} where nothing is found
CREATE FUNCTION idempo.managed_only(params jsonb, steps jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF params IS NULL OR steps IS NULL OR jsonb_typeof(params) <> 'object' THEN
        RETURN params;
    END IF;
    RETURN coalesce(idempo.managed_project(params, steps), '{}'::jsonb);
END
$$;

-- The fingerprint of params projected onto include, without ignore (the ignore list checked
-- first, as the C code compiles it first).
-- managed-differs: security: calls the edition's helpers, on which PUBLIC has no EXECUTE right (the C function needs none)
CREATE FUNCTION idempo.fingerprint(params jsonb, ignore text[], include text[]) RETURNS bytea
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF params IS NULL THEN
        RETURN NULL;
    END IF;
    IF ignore IS NOT NULL THEN
        PERFORM idempo.fingerprint('{}'::jsonb, ignore);
    END IF;
    RETURN idempo.fingerprint(idempo.managed_only(params, idempo.managed_include_steps(include, NULL)), ignore);
END
$$;
