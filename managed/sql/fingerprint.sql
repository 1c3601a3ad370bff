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
BEGIN
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
