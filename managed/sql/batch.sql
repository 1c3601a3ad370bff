-- claim_batch, complete_batch, fail_batch (src/claim_batch.c): many keys of one scope in one
-- call, one answer per element.  Every element is decided by idempo.claim() (complete(),
-- fail()) itself, called once per element: each keeps every guarantee of the single call, and
-- nothing of its logic is repeated here.  What the batch adds, as the C edition does:
--
-- - Order.  The elements are claimed in the order of the keys as stored (the digests in
--   hash_keys scopes), bytewise (COLLATE "C", the C edition's strcmp), then by position; the
--   answers come back in input order.  Two batches of overlapping keys take the keys' locks in
--   one order whatever their input order, so they wait for each other but never deadlock.
-- - Duplicates.  A key given again (the same stored key) names its first occurrence in
--   duplicate_of, and is decided by the same claim() as a single claim of it in the same
--   transaction (a replay, a conflict with the stored request, a refusal of an element without
--   params in a require_fingerprint scope...): no second copy of the claim's rules.  Then, if
--   that answer hands out the work ('acquired', 'unknown') that an earlier occurrence of the
--   key was already handed, it answers 'busy'.
-- - Bad input (arrays of more than one dimension or of another length than keys, more than
--   10,000 elements, NULL keys, NULL wait or complete_on_commit; blank or oversized keys, an
--   unknown scope) is refused with the C edition's SQLSTATE and message before anything is
--   claimed, so that no conflict is recorded for a batch that was never valid.
--
-- The C edition's shortcuts (one read of all the keys for the replays, the new keys inserted
-- through one open table) only make it cheaper; they give the same answers.  Its error context
-- "claim_batch, element at position N" is not given here: an element's error carries the
-- CONTEXT lines of the PL/pgSQL functions instead (catching each element's error to add it
-- would cost a subtransaction per element).

-- An array argument of a batch, checked as claim_batch.c's batch_array (p_keys_n NULL: one
-- dimension, at most 10,000 elements) or batch_same_length (one element per key, or none given)
CREATE FUNCTION idempo.managed_batch_arg(p_fn text, p_name text, p_a anyarray, p_keys_n integer)
    RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n integer := coalesce(cardinality(p_a), 0);
BEGIN
    IF p_a IS NULL THEN
        RETURN;
    END IF;
    IF p_keys_n IS NULL THEN
        IF array_ndims(p_a) > 1 THEN
            RAISE EXCEPTION '%: % has % dimensions, a batch is one-dimensional', p_fn, p_name, array_ndims(p_a)
                USING ERRCODE = '22023', HINT = 'Pass one array element per message, e.g. ARRAY[''k1'', ''k2''].';
        END IF;
        IF n > 10000 THEN
            RAISE EXCEPTION '%: % has % elements, the limit is 10000', p_fn, p_name, n
                USING ERRCODE = '54000',
                      HINT = 'Split the batch into calls of at most 10000 keys (each call is one transaction''s worth of locks).';
        END IF;
    ELSIF n <> p_keys_n THEN
        RAISE EXCEPTION '%: % has % element% and keys has %', p_fn, p_name, n,
            CASE WHEN n = 1 THEN '' ELSE 's' END, p_keys_n
            USING ERRCODE = '22023',
                  HINT = format('Pass one %s element per key, in the same order (NULL for none), or leave the argument out.', p_name);
    END IF;
END
$$;

-- The scope argument, checked before the arrays as keys.c's idempo_scope_arg: NULL, blank (the
-- whitespace of managed_scope) or too long (managed_scope raises those before it reads the scope)
CREATE FUNCTION idempo.managed_batch_scope_arg(p_scope text) RETURNS void
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_scope IS NULL OR btrim(p_scope, E' \t\n\r\f\x0b') = '' OR octet_length(p_scope) > 128 THEN
        PERFORM idempo.managed_scope(p_scope, NULL, NULL);
    END IF;
END
$$;

-- A NULL key is refused before anything is done, naming its position (claim_batch.c)
CREATE FUNCTION idempo.managed_batch_no_null_keys(p_fn text, p_scope text, p_keys text[]) RETURNS void
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    i integer := array_position(p_keys, NULL);
BEGIN
    IF i IS NOT NULL THEN
        RAISE EXCEPTION '%: the key at position % is NULL (scope "%")', p_fn, i, p_scope
            USING ERRCODE = '22004',
                  HINT = 'Pass the stable identity of the business action for every element, e.g. ''order-1001/shipment-1''.';
    END IF;
END
$$;

-- The batch's canonical order (claim_batch.c: batch_order): every key checked as the claim
-- checks it (the scope exists, no blank or oversized key), in input order, before anything is
-- claimed; ord: the positions by stored key (bytewise), then position; firsts[i]: the position
-- of the first occurrence of the key at position i, NULL where i is the first.  p_keys has
-- lower bound 1 and no NULL.
CREATE FUNCTION idempo.managed_batch_order(p_scope text, p_keys text[],
                                           OUT s idempo.scopes, OUT ord integer[], OUT firsts integer[])
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    n integer := cardinality(p_keys);
    stored text[] := array_fill(NULL::text, ARRAY[n]);
    prev integer;
    i integer;
BEGIN
    FOR j IN 1 .. n LOOP
        -- p_write NULL: the key's checks only; the disabled scope and allowed_role are the
        -- claim's, for the first key it claims (as the C edition checks them)
        s := idempo.managed_scope(p_scope, p_keys[j], NULL);
        stored[j] := idempo.managed_key(s, p_keys[j]);
    END LOOP;
    SELECT array_agg(u.i::integer ORDER BY u.st COLLATE "C", u.i) INTO ord
      FROM unnest(stored) WITH ORDINALITY AS u(st, i);
    firsts := array_fill(NULL::integer, ARRAY[n]);
    FOREACH i IN ARRAY ord LOOP
        IF prev IS NOT NULL AND stored[i] = stored[prev] THEN
            firsts[i] := coalesce(firsts[prev], prev);
        END IF;
        prev := i;
    END LOOP;
END
$$;

-- managed-differs: security: calls idempo.claim() and the edition's helpers, which callers need no EXECUTE right on to use the batch (the C function calls claim() directly)
CREATE FUNCTION idempo.claim_batch(
    scope              text,
    keys               text[],
    params             jsonb[]       DEFAULT NULL,
    run_id             text          DEFAULT NULL,
    intent_at          timestamptz[] DEFAULT NULL,
    wait               boolean       DEFAULT true,
    complete_on_commit boolean       DEFAULT false)
    RETURNS TABLE (
        "position"       integer,
        key              text,
        duplicate_of     integer,
        outcome          idempo.outcome,
        status           idempo.status,
        attempt          integer,
        result           jsonb,
        target_ref       text,
        error            text,
        first_seen_at    timestamptz,
        lease_expires_at timestamptz,
        conflict_id      bigint,
        review_id        bigint,
        completed_at     timestamptz)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE ROWS 100 SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    fn constant text := 'claim_batch';
    k text[] := claim_batch.keys[:];          -- the arrays with lower bound 1: position i is [i]
    p jsonb[] := claim_batch.params[:];
    t timestamptz[] := claim_batch.intent_at[:];
    n integer := coalesce(cardinality(claim_batch.keys), 0);
    o record;
    answers idempo.claim_result[];
    a idempo.claim_result;
    handed boolean[];
    f integer;
    -- whether the transaction had written before the batch: only then may it hold the record of
    -- a key the batch has not claimed yet (claim.sql: may_hold); read before anything is claimed
    wrote_before constant boolean := pg_current_xact_id_if_assigned() IS NOT NULL;
BEGIN
    PERFORM idempo.managed_batch_scope_arg(claim_batch.scope);
    PERFORM idempo.managed_batch_arg(fn, 'keys', k, NULL);
    PERFORM idempo.managed_batch_arg(fn, 'params', p, NULL);
    PERFORM idempo.managed_batch_arg(fn, 'intent_at', t, NULL);
    PERFORM idempo.managed_batch_arg(fn, 'params', p, n);
    PERFORM idempo.managed_batch_arg(fn, 'intent_at', t, n);
    PERFORM idempo.managed_batch_no_null_keys(fn, claim_batch.scope, k);
    IF claim_batch.wait IS NULL OR claim_batch.complete_on_commit IS NULL THEN
        RAISE EXCEPTION '%: % must not be NULL (scope "%")', fn,
            CASE WHEN claim_batch.wait IS NULL THEN 'wait' ELSE 'complete_on_commit' END, claim_batch.scope
            USING ERRCODE = '22004', HINT = 'Pass true or false, or leave the argument out for its default.';
    END IF;
    IF n = 0 THEN
        RETURN;
    END IF;

    SELECT * INTO o FROM idempo.managed_batch_order(claim_batch.scope, k);

    -- each element in the order of the stored keys.  With wait => false in a transaction that
    -- had written nothing before the batch, every element's claim is told so (the claim would
    -- take the batch's own earlier writes for the transaction's): a key another transaction is
    -- inserting then answers busy from the key's sign at once (managed_decide), as the C
    -- edition's does, instead of waiting out the claim's 10 ms lock_timeout on the insertion
    -- (and raising 40001 under REPEATABLE READ or SERIALIZABLE where the inserter commits within
    -- them).  The transaction holds no record but those of the batch's keys; a key given again
    -- is this transaction's own (its sign is this transaction's) or busy again, as its first
    -- occurrence answered.
    IF NOT claim_batch.wait AND NOT wrote_before THEN
        PERFORM set_config('idempo_managed.batch_fresh', 'on', true);
    END IF;
    -- with wait => false, which of the keys' signs other transactions of idempo's hold now: one
    -- look at pg_locks for the batch instead of one per key held (managed_decide; a sign taken
    -- since is looked up by its claim).  What a caller sets there only changes its own answers.
    IF NOT claim_batch.wait THEN
        PERFORM set_config('idempo_managed.batch_held', idempo.managed_signs_held(
            ARRAY(SELECT idempo.managed_key_sign((o.s).name, idempo.managed_key(o.s, x)) FROM unnest(k) x))::text, true);
    END IF;
    answers := array_fill(NULL::idempo.claim_result, ARRAY[n]);
    FOREACH f IN ARRAY o.ord LOOP
        answers[f] := idempo.claim(claim_batch.scope, k[f], p[f], NULL, claim_batch.run_id, t[f],
                                   claim_batch.wait, claim_batch.complete_on_commit);
    END LOOP;
    IF NOT claim_batch.wait AND NOT wrote_before THEN
        PERFORM set_config('idempo_managed.batch_fresh', '', true);
    END IF;
    IF NOT claim_batch.wait THEN
        PERFORM set_config('idempo_managed.batch_held', '', true);
    END IF;

    -- in input order (for the occurrences of one key, the order they were claimed in): the
    -- work goes to one element of a key, later ones that would be handed it answer busy
    handed := array_fill(false, ARRAY[n]);
    FOR i IN 1 .. n LOOP
        a := answers[i];
        f := coalesce(o.firsts[i], i);
        IF a.outcome IN ('acquired', 'unknown') THEN
            IF handed[f] THEN
                a.outcome := 'busy';
            END IF;
            handed[f] := true;
        END IF;
        "position" := i;
        key := k[i];
        duplicate_of := o.firsts[i];
        outcome := a.outcome;
        status := a.status;
        attempt := a.attempt;
        result := a.result;
        target_ref := a.target_ref;
        error := a.error;
        first_seen_at := a.first_seen_at;
        lease_expires_at := a.lease_expires_at;
        conflict_id := a.conflict_id;
        review_id := a.review_id;
        completed_at := a.completed_at;
        RETURN NEXT;
    END LOOP;
END
$$;

-- complete_batch and fail_batch (claim_batch.c: finish_batch): the single finish applied to each
-- element in the order of the stored keys; a key given twice is refused (the second finish of
-- one attempt could only be refused itself).  p_verb: 'complete' or 'fail'; p_extra1, p_extra2:
-- its per-element arguments after attempts (results and target_refs, or errors).
CREATE FUNCTION idempo.managed_finish_batch(p_fn text, p_scope text, p_keys text[], p_attempts integer[],
                                            p_results jsonb[], p_target_refs text[], p_errors text[],
                                            p_retryable boolean,
                                            OUT "position" integer, OUT key text, OUT status idempo.status)
    RETURNS SETOF record LANGUAGE plpgsql AS $$
DECLARE
    k text[] := p_keys[:];
    at integer[] := p_attempts[:];
    r jsonb[] := p_results[:];
    tr text[] := p_target_refs[:];
    e text[] := p_errors[:];
    n integer := coalesce(cardinality(p_keys), 0);
    o record;
    statuses idempo.status[];
    f integer;
BEGIN
    PERFORM idempo.managed_batch_scope_arg(p_scope);
    PERFORM idempo.managed_batch_arg(p_fn, 'keys', k, NULL);
    PERFORM idempo.managed_batch_arg(p_fn, 'attempts', at, NULL);
    IF p_fn = 'complete_batch' THEN
        PERFORM idempo.managed_batch_arg(p_fn, 'results', r, NULL);
        PERFORM idempo.managed_batch_arg(p_fn, 'target_refs', tr, NULL);
        PERFORM idempo.managed_batch_arg(p_fn, 'attempts', at, n);
        PERFORM idempo.managed_batch_arg(p_fn, 'results', r, n);
        PERFORM idempo.managed_batch_arg(p_fn, 'target_refs', tr, n);
    ELSE
        PERFORM idempo.managed_batch_arg(p_fn, 'errors', e, NULL);
        PERFORM idempo.managed_batch_arg(p_fn, 'attempts', at, n);
        PERFORM idempo.managed_batch_arg(p_fn, 'errors', e, n);
    END IF;
    PERFORM idempo.managed_batch_no_null_keys(p_fn, p_scope, k);
    IF n = 0 THEN
        RETURN;
    END IF;

    SELECT * INTO o FROM idempo.managed_batch_order(p_scope, k);
    FOREACH f IN ARRAY o.ord LOOP
        IF o.firsts[f] IS NOT NULL THEN
            RAISE EXCEPTION '%: the key at position % is the key at position % again (scope "%")',
                p_fn, f, o.firsts[f], p_scope
                USING ERRCODE = '22023',
                      HINT = 'Finish each attempt once: leave out the elements claim_batch answered with duplicate_of.';
        END IF;
    END LOOP;

    statuses := array_fill(NULL::idempo.status, ARRAY[n]);
    FOREACH f IN ARRAY o.ord LOOP
        IF p_fn = 'complete_batch' THEN
            statuses[f] := idempo.complete(p_scope, k[f], at[f], r[f], tr[f]);
        ELSE
            statuses[f] := idempo.fail(p_scope, k[f], at[f], e[f], p_retryable);
        END IF;
    END LOOP;
    FOR i IN 1 .. n LOOP
        "position" := i;
        key := k[i];
        status := statuses[i];
        RETURN NEXT;
    END LOOP;
END
$$;

-- managed-differs: security: calls idempo.complete() and the edition's helpers, which callers need no EXECUTE right on to use the batch (the C function calls complete() directly)
CREATE FUNCTION idempo.complete_batch(
    scope       text,
    keys        text[],
    attempts    integer[] DEFAULT NULL,
    results     jsonb[]   DEFAULT NULL,
    target_refs text[]    DEFAULT NULL)
    RETURNS TABLE ("position" integer, key text, status idempo.status)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE ROWS 100 SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- one line: an element's error quotes this statement in its CONTEXT (managed/nocontext.py)
    RETURN QUERY SELECT * FROM idempo.managed_finish_batch('complete_batch', scope, keys, attempts, results, target_refs, NULL, NULL);
END
$$;

-- managed-differs: security: calls idempo.fail() and the edition's helpers, which callers need no EXECUTE right on to use the batch (the C function calls fail() directly)
CREATE FUNCTION idempo.fail_batch(
    scope     text,
    keys      text[],
    attempts  integer[] DEFAULT NULL,
    errors    text[]    DEFAULT NULL,
    retryable boolean   DEFAULT true)
    RETURNS TABLE ("position" integer, key text, status idempo.status)
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE ROWS 100 SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RETURN QUERY SELECT * FROM idempo.managed_finish_batch('fail_batch', scope, keys, attempts, NULL, NULL, errors, retryable);
END
$$;
