-- verify, resolve, request_review (src/review.c) in PL/pgSQL, on the same tables.  They use the
-- helpers of claim.sql (managed_scope, managed_key, managed_plus, managed_write,
-- managed_open_review), which the generator places before claim's replacement.

-- a timestamp as the C code's timestamptz_to_str() prints it in messages
CREATE FUNCTION idempo.managed_ts(t timestamptz) RETURNS text
    LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp SET DateStyle = 'ISO' AS $$
    SELECT t::text
$$;

-- the record, locked; a missing one refused (review.c: read_locked)
CREATE FUNCTION idempo.managed_read_locked(s idempo.scopes, k text, verb text) RETURNS idempo.operations
    LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    o idempo.operations;
BEGIN
    SELECT * INTO o FROM idempo.operations x WHERE x.scope = s.name AND x.key = k FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'cannot % key "%" in scope "%": there is no such operation', verb, k, s.name
            USING ERRCODE = '42704', HINT = 'A finished record may have expired; idempo.lookup() shows what is stored.';
    END IF;
    RETURN o;
END
$$;

CREATE FUNCTION idempo.managed_phrase(st idempo.status) RETURNS text
    LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE st WHEN 'in_progress' THEN 'it is in progress' WHEN 'succeeded' THEN 'it has already succeeded'
                   WHEN 'failed' THEN 'it has already failed' WHEN 'retryable' THEN 'it is retryable'
                   WHEN 'unknown' THEN 'its outcome is unknown' ELSE 'it is in review' END
$$;

-- managed-differs: security: writes idempo.operations, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.verify(
    scope      text,
    key        text,
    attempt    integer,
    found      boolean,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    s idempo.scopes;
    k text;
    o idempo.operations;
    from_status idempo.status;
    t timestamptz;
    settled_at timestamptz;
    v_found boolean := $4;    -- PL/pgSQL's FOUND shadows a parameter named found
BEGIN
    LOCK TABLE idempo.operations IN ROW EXCLUSIVE MODE;   -- before the scope is read (scope_cache.c)
    s := idempo.managed_scope(verify.scope, verify.key, true, true);
    k := idempo.managed_key(s, verify.key);
    PERFORM idempo.managed_scope_current(s);
    IF verify.attempt IS NULL THEN
        RAISE EXCEPTION 'attempt must not be NULL (key "%" in scope "%")', k, s.name USING ERRCODE = '22004',
            HINT = 'Pass attempt => the attempt whose outcome you looked up: the attempt idempo.claim() returned with outcome ''unknown''.';
    END IF;
    IF v_found IS NULL THEN
        RAISE EXCEPTION 'found must not be NULL (key "%" in scope "%")', k, s.name USING ERRCODE = '22004',
            HINT = 'Pass found => true if the target system has the action, false if its lookup came back empty.';
    END IF;
    t := idempo.now();
    o := idempo.managed_read_locked(s, k, 'verify');
    from_status := o.status;
    IF o.status = 'in_progress' AND o.lease_expires_at <= t THEN       -- apply_lease_expiry()
        o.status := 'unknown';
        o.last_attempt_at := o.lease_expires_at;   -- the settle window counts from the lease's end
        o.lease_expires_at := NULL;
        o.sweep_at := idempo.managed_plus(o.first_seen_at, s.retention);
    END IF;
    -- the fence: a lookup says something about the attempt it was made for
    IF verify.attempt < o.attempt THEN
        RAISE EXCEPTION 'cannot verify key "%" in scope "%": attempt % was superseded by attempt %', k, s.name, verify.attempt, o.attempt
            USING ERRCODE = '55000', HINT = 'A newer attempt owns the operation; a late attempt must not overwrite it.';
    ELSIF verify.attempt <> o.attempt THEN
        RAISE EXCEPTION 'cannot verify key "%" in scope "%": there is no attempt %, the current one is %', k, s.name, verify.attempt, o.attempt
            USING ERRCODE = '22023', HINT = 'Pass the attempt number idempo.claim() returned.';
    END IF;
    IF o.status <> 'unknown' THEN
        IF o.status = 'in_progress' THEN
            RAISE EXCEPTION 'cannot verify key "%" in scope "%": %', k, s.name, idempo.managed_phrase(o.status)
                USING ERRCODE = '55000', DETAIL = format('An attempt holds the lease until %s.', idempo.managed_ts(o.lease_expires_at)),
                      HINT = 'Wait for the attempt''s reply or for its lease to run out.';
        END IF;
        RAISE EXCEPTION 'cannot verify key "%" in scope "%": %', k, s.name, idempo.managed_phrase(o.status)
            USING ERRCODE = '55000',
                  HINT = CASE WHEN o.status = 'in_review' THEN 'A person decides on operations in review: use idempo.resolve().'
                              ELSE 'verify() is for operations whose outcome is unknown.' END;
    END IF;
    -- the lookup is done: verify ends the verification lease whatever it found
    o.lease_expires_at := NULL;
    IF v_found THEN
        o.status := 'succeeded';
        o.completed_at := t;
        o.expires_at := idempo.managed_plus(t, s.retention);
        o.sweep_at := o.expires_at;
        o.target_ref := verify.target_ref;
        o.result := verify.result;
        o.error := NULL;
    ELSE
        settled_at := idempo.managed_plus(o.last_attempt_at, s.verify_settle);
        IF t >= settled_at THEN
            o.status := 'retryable';
            o.error := 'verified: not executed';
        ELSE
            RAISE NOTICE 'key "%" in scope "%" stays unknown: an empty lookup inside the settle window is not proof', k, s.name
                USING DETAIL = format('The settle window (verify_settle after the attempt''s lease ended) ends at %s; until then a lagging replica or a request still in flight may not show the action.',
                                      idempo.managed_ts(settled_at)),
                      HINT = 'Look it up again after the settle window.';
        END IF;
    END IF;
    PERFORM idempo.managed_write(o);
    IF s.audit THEN
        INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, outcome, action, actor)
        VALUES (t, s.name, k, o.run_id, o.attempt, from_status, o.status, NULL,
                CASE WHEN v_found THEN 'verify found' ELSE 'verify not found' END, idempo.managed_caller());
    END IF;
    RETURN o.status;
END
$$;

-- The form of 0.1.0 and 0.2.0, without the attempt: refused (review.c)
CREATE FUNCTION idempo.verify(
    scope      text,
    key        text,
    found      boolean,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
BEGIN
    RAISE EXCEPTION 'idempo.verify() needs the attempt its lookup was made for' USING ERRCODE = '42883',
        DETAIL = 'A lookup made while one attempt was in doubt says nothing about a later attempt, which may have done the work since.',
        HINT = 'Call idempo.verify(scope, key, attempt => <the attempt idempo.claim() returned with outcome ''unknown''>, found => ...).';
END
$$;

-- managed-differs: security: writes idempo's tables, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.resolve(
    scope      text,
    key        text,
    resolution text,
    reviewer   text  DEFAULT NULL,
    target_ref text  DEFAULT NULL,
    result     jsonb DEFAULT NULL,
    note       text  DEFAULT NULL)
    RETURNS idempo.status
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    s idempo.scopes;
    k text;
    o idempo.operations;
    from_status idempo.status;
    t timestamptz;
    decided_by text;
BEGIN
    LOCK TABLE idempo.operations IN ROW EXCLUSIVE MODE;
    s := idempo.managed_scope(resolve.scope, resolve.key, NULL);
    k := idempo.managed_key(s, resolve.key);
    PERFORM idempo.managed_scope_current(s);
    IF resolve.resolution IS NULL OR resolve.resolution NOT IN ('succeeded', 'not_executed', 'failed') THEN
        RAISE EXCEPTION 'unknown resolution % for key "%" in scope "%"', coalesce(quote_literal(resolve.resolution), 'NULL'), k, s.name
            USING ERRCODE = '22023', HINT = 'Use ''succeeded'' (it happened), ''not_executed'' (it did not) or ''failed'' (final).';
    END IF;
    PERFORM idempo.managed_check_review(s, k, idempo.managed_caller(), 'resolve');
    decided_by := idempo.managed_reviewer_name(resolve.reviewer, idempo.managed_caller());
    t := idempo.now();
    o := idempo.managed_read_locked(s, k, 'resolve');
    from_status := o.status;
    IF o.status = 'in_progress' AND o.lease_expires_at <= t THEN
        o.status := 'unknown';
        o.last_attempt_at := o.lease_expires_at;   -- the settle window counts from the lease's end
        o.lease_expires_at := NULL;
        o.sweep_at := idempo.managed_plus(o.first_seen_at, s.retention);
    END IF;
    IF o.status NOT IN ('unknown', 'in_review') THEN
        RAISE EXCEPTION 'cannot resolve key "%" in scope "%": %', k, s.name, idempo.managed_phrase(o.status)
            USING ERRCODE = '55000',
                  HINT = 'resolve() decides operations whose outcome is unknown or that are in review; put it in review first with idempo.request_review() if a person must decide.';
    END IF;
    IF resolve.resolution = 'succeeded' THEN
        o.status := 'succeeded';
        o.lease_expires_at := NULL;
        o.completed_at := t;
        o.expires_at := idempo.managed_plus(t, s.retention);
        o.sweep_at := o.expires_at;
        IF resolve.target_ref IS NOT NULL THEN
            o.target_ref := resolve.target_ref;
        END IF;
        IF resolve.result IS NOT NULL THEN
            o.result := resolve.result;
        END IF;
        o.error := NULL;
    ELSIF resolve.resolution = 'failed' THEN
        o.status := 'failed';
        o.lease_expires_at := NULL;
        o.completed_at := t;
        o.expires_at := idempo.managed_plus(t, s.retention);
        o.sweep_at := o.expires_at;
        o.error := coalesce(resolve.note, 'failed (resolved by a reviewer)');
    ELSE
        -- not executed: may run again, in a fresh retention window
        o.status := 'retryable';
        o.first_seen_at := t;
        o.lease_expires_at := NULL;
        o.completed_at := NULL;
        o.expires_at := NULL;
        o.sweep_at := idempo.managed_plus(o.first_seen_at, s.retention);
        o.attempt_base := o.attempt;
        o.error := 'not executed (resolved by a reviewer)';
    END IF;
    PERFORM idempo.managed_write(o);
    UPDATE idempo.reviews AS r SET resolved_at = t, resolved_by = decided_by,
                                   resolution = resolve.resolution, note = resolve.note
     WHERE r.scope = s.name AND r.key = k AND r.resolved_at IS NULL;
    IF s.audit THEN
        INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, outcome, action, actor)
        VALUES (t, s.name, k, NULL, o.attempt, from_status, o.status, NULL, 'resolve', idempo.managed_caller());
    END IF;
    RETURN o.status;
END
$$;

-- managed-differs: security: writes idempo's tables, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.request_review(scope text, key text, note text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_variable
DECLARE
    s idempo.scopes;
    k text;
    o idempo.operations;
    from_status idempo.status;
    t timestamptz;
    review bigint;
BEGIN
    LOCK TABLE idempo.operations IN ROW EXCLUSIVE MODE;
    -- the application (allowed_role) hands a record to a person; so may a reviewer
    s := idempo.managed_scope(request_review.scope, request_review.key, false);
    k := idempo.managed_key(s, request_review.key);
    PERFORM idempo.managed_scope_current(s);
    t := idempo.now();
    o := idempo.managed_read_locked(s, k, 'review');
    from_status := o.status;
    -- its result is gone (or goes at the next sweep): resolved, it would replay an expired result
    IF o.status IN ('succeeded', 'failed')
       AND (o.sweep_at > o.expires_at
            OR (o.expires_at <= t AND s.remember > '0'::interval AND idempo.managed_plus(o.expires_at, s.remember) > t)) THEN
        RAISE EXCEPTION 'cannot review key "%" in scope "%": % and its result has expired', k, s.name, idempo.managed_phrase(o.status)
            USING ERRCODE = '55000',
                  DETAIL = 'The key is remembered: claims answer ''expired'' and never run its action again.',
                  HINT = 'To let the action run again under this key, release it with idempo.release().';
    END IF;
    review := idempo.managed_open_review(s.name, k, 'manual', request_review.note, t);
    IF o.status <> 'in_review' THEN
        -- in review nothing expires: a person decides (completed_at stays as history)
        o.status := 'in_review';
        o.lease_expires_at := NULL;
        o.expires_at := NULL;
        o.sweep_at := NULL;
        PERFORM idempo.managed_write(o);
        IF s.audit THEN
            INSERT INTO idempo.events (at, scope, key, run_id, attempt, from_status, to_status, outcome, action, actor)
            VALUES (t, s.name, k, NULL, o.attempt, from_status, o.status, NULL, 'request_review', idempo.managed_caller());
        END IF;
    END IF;
    RETURN review;
END
$$;
