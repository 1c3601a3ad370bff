-- Scope and key arguments (src/keys.c, src/scope_cache.c) and the calls that only read: lookup,
-- stored_key.  The C functions are SECURITY INVOKER and switch to the tables' owner inside; a
-- PL/pgSQL function can only be SECURITY DEFINER for that, so current_user inside is the owner.
-- The caller that allowed_role and the audit log name is therefore the session's role: the role
-- set with SET ROLE (the "role" setting, which only a member can set), else the session user.
-- It differs from the C edition's (the current user) only for a call made from inside another
-- SECURITY DEFINER function (docs/managed-edition.md).
--
-- The helpers (idempo.managed_*, here and in claim.sql) carry no SET search_path: only idempo's
-- owner may execute them (the install revokes every function of the schema from PUBLIC), and
-- they run inside idempo's own functions, which pin search_path.  A SET clause would save and
-- restore the setting at every call and keep PostgreSQL from inlining the SQL ones (managed_key,
-- managed_plus, managed_caller): together about an eighth of a claim (test/bench/managed).

CREATE FUNCTION idempo.managed_caller() RETURNS name
    LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_setting('role') = 'none' THEN session_user
                ELSE current_setting('role')::name END
$$;

-- The scope, by the C edition's argument checks and messages; p_write: a call that uses it
-- (claim, complete, fail, verify: a disabled scope refuses), else a read (lookup,
-- request_review); NULL: no role checked.  p_reviewers: the scope's reviewers pass the
-- allowed_role check too (default: for reads; verify passes true).
CREATE FUNCTION idempo.managed_scope(p_scope text, p_key text, p_write boolean,
                                     p_reviewers boolean DEFAULT NULL) RETURNS idempo.scopes
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    s idempo.scopes;
BEGIN
    IF p_scope IS NULL THEN
        RAISE EXCEPTION 'scope must not be NULL' USING ERRCODE = '22004',
            HINT = 'Pass the scope name, e.g. ''warehouse.outbound''.';
    END IF;
    -- blank: only C's isspace() (keys.c): space, \t \n \v \f \r; E'' strings have no \v escape
    -- (E'\v' is the letter v), so the vertical tab is written \x0b
    IF btrim(p_scope, E' \t\n\r\f\x0b') = '' THEN
        RAISE EXCEPTION '%', CASE WHEN p_scope = '' THEN 'scope must not be empty' ELSE 'scope must not be only whitespace' END
            USING ERRCODE = '22023', HINT = 'Pass the scope name, e.g. ''warehouse.outbound''.';
    END IF;
    IF octet_length(p_scope) > 128 THEN
        RAISE EXCEPTION 'scope name is % bytes long, the limit is 128', octet_length(p_scope)
            USING ERRCODE = '22023', HINT = 'No scope can have such a name; check the arguments'' order.';
    END IF;
    SELECT * INTO s FROM idempo.scopes AS sc WHERE sc.name = p_scope;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'scope "%" does not exist', p_scope USING ERRCODE = '42704',
            HINT = format('Check the name; a role that may create scopes (docs/security.md) adds it with SELECT idempo.create_scope(''%s'', retention => ''24 hours'');', p_scope);
    END IF;
    IF p_key IS NULL THEN
        RAISE EXCEPTION 'key must not be NULL (scope "%")', s.name USING ERRCODE = '22004',
            HINT = 'Pass the stable identity of the business action, e.g. ''order-1001/shipment-1''.';
    END IF;
    IF btrim(p_key, E' \t\n\r\f\x0b') = '' THEN
        RAISE EXCEPTION '%', CASE WHEN p_key = '' THEN format('key must not be empty (scope "%s")', s.name)
                                  ELSE format('key must not be only whitespace (scope "%s")', s.name) END
            USING ERRCODE = '22023', HINT = 'Pass the stable identity of the business action, e.g. ''order-1001/shipment-1''.';
    END IF;
    IF octet_length(p_key) > 1024 THEN
        RAISE EXCEPTION 'key is % bytes long, the limit is 1024 (scope "%")', octet_length(p_key), s.name
            USING ERRCODE = '22023',
                  HINT = 'Build keys from business identifiers, or pass a digest of a long one: encode(sha256(convert_to(key, ''UTF8'')), ''hex'').'
                         || CASE WHEN s.hash_keys THEN ' The limit applies to the clear key in hash_keys scopes too.' ELSE '' END;
    END IF;
    IF p_write AND NOT s.enabled THEN
        RAISE EXCEPTION 'scope "%" is disabled (key "%"); its owner is %', s.name,
            CASE WHEN s.hash_keys THEN encode(sha256(convert_to(p_key, getdatabaseencoding())), 'hex') ELSE p_key END,
            coalesce(s.owner, 'not recorded')
            USING ERRCODE = '55000',
                  HINT = format('An old copy of a flow may still be running. Ask the scope''s owner before enabling it again with idempo.enable_scope(''%s'').', s.name);
    END IF;
    -- allowed_role: for the calls that use (p_write) or read (NOT p_write) the scope's records
    IF p_write IS NOT NULL AND s.allowed_role IS NOT NULL
       AND NOT (coalesce(p_reviewers, NOT p_write) AND idempo.managed_may_review(s, idempo.managed_caller())) THEN
        IF NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = s.allowed_role) THEN
            RAISE EXCEPTION 'allowed_role "%" of scope "%" does not exist', s.allowed_role, s.name
                USING ERRCODE = '42704',
                      HINT = format('Recreate the role or change the scope with idempo.alter_scope(''%s'', allowed_role => ...).', s.name);
        END IF;
        IF NOT pg_has_role(idempo.managed_caller(), s.allowed_role, 'MEMBER') THEN
            RAISE EXCEPTION 'role "%" may not use scope "%" (key "%")', idempo.managed_caller(), s.name,
                CASE WHEN s.hash_keys THEN encode(sha256(convert_to(p_key, getdatabaseencoding())), 'hex') ELSE p_key END
                USING ERRCODE = '42501',
                      HINT = CASE WHEN s.review_role IS NOT NULL AND coalesce(p_reviewers, NOT p_write)
                                  THEN format('Only members of role "%s" and the scope''s reviewers (role "%s") may look up, verify or put in review keys in this scope.', s.allowed_role, s.review_role)
                                  ELSE format('Only members of role "%s" may claim, complete, fail, verify or look up keys in this scope.', s.allowed_role) END;
        END IF;
    END IF;
    RETURN s;
END
$$;

-- Scopes are read as committed now in the C edition, also in a REPEATABLE READ or SERIALIZABLE
-- transaction (as catalogs are); PL/pgSQL reads them with the transaction's snapshot.  So a
-- call that writes records there locks the scope row FOR SHARE, which raises 40001 if a change
-- committed since the snapshot was taken: the transaction is retried rather than a record
-- written under rules that no longer hold (a key stored in clear in a scope that now hashes
-- keys would never be found again).  READ COMMITTED reads the latest already.  SKIP LOCKED: a
-- change still in flight (alter_scope, disable_scope in a transaction that has not ended) holds
-- the row, and then the snapshot's row is the one committed now, which the C edition would read
-- too; waiting for it made wait => false wait, and deadlocked with an alter_scope that holds the
-- row while it waits for this transaction's lock on idempo.operations
-- (test/isolation/specs/scope_change_in_flight_rr.spec).
CREATE FUNCTION idempo.managed_scope_current(s idempo.scopes) RETURNS void
    LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       AND NOT current_setting('transaction_read_only')::boolean THEN
        PERFORM FROM idempo.scopes sc WHERE sc.name = s.name FOR SHARE SKIP LOCKED;
    END IF;
END
$$;

-- The key as stored: the clear key, or its SHA-256 digest (hex) in hash_keys scopes.
CREATE FUNCTION idempo.managed_key(s idempo.scopes, p_key text) RETURNS text
    LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN s.hash_keys THEN encode(sha256(convert_to(p_key, getdatabaseencoding())), 'hex') ELSE p_key END
$$;

-- managed-differs: security: reads idempo.scopes, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.stored_key(scope text, key text) RETURNS text
    LANGUAGE plpgsql STABLE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- p_write NULL: neither a use nor a read of the records (the C function checks no role)
    RETURN idempo.managed_key(idempo.managed_scope(stored_key.scope, stored_key.key, NULL), stored_key.key);
END
$$;

-- managed-differs: security: reads idempo.operations, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.lookup(scope text, key text) RETURNS idempo.operations
    LANGUAGE plpgsql STABLE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempo.scopes := idempo.managed_scope(lookup.scope, lookup.key, false);
    o idempo.operations;
BEGIN
    SELECT * INTO o FROM idempo.operations AS x
     WHERE x.scope = s.name AND x.key = idempo.managed_key(s, lookup.key);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    RETURN o;
END
$$;

-- Who may review a scope (src/review_rights.c, the rule written once for the C edition): the
-- members of review_role, else of allowed_role, else anyone; idempo's owner always.  A role
-- named but missing: nobody but the owner.
CREATE FUNCTION idempo.managed_may_review(s idempo.scopes, who name) RETURNS boolean
    LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN coalesce(s.review_role, s.allowed_role) IS NULL THEN true
                WHEN pg_has_role(who, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'idempo.operations'::regclass), 'MEMBER') THEN true
                WHEN NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = coalesce(s.review_role, s.allowed_role)) THEN false
                ELSE pg_has_role(who, coalesce(s.review_role, s.allowed_role), 'MEMBER') END
$$;

-- Refuses a caller who may not review the scope (src/review_rights.c's messages); what: the verb.
CREATE FUNCTION idempo.managed_check_review(s idempo.scopes, k text, who name, what text) RETURNS void
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    role_name name := coalesce(s.review_role, s.allowed_role);
    setting text := CASE WHEN s.review_role IS NOT NULL THEN 'review_role' ELSE 'allowed_role' END;
BEGIN
    IF idempo.managed_may_review(s, who) THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles r WHERE r.rolname = role_name) THEN
        RAISE EXCEPTION '% "%" of scope "%" does not exist', setting, role_name, s.name
            USING ERRCODE = '42704',
                  HINT = format('Recreate the role or change the scope with idempo.alter_scope(''%s'', %s => ...).', s.name, setting);
    END IF;
    RAISE EXCEPTION '%', CASE WHEN k IS NULL THEN format('role "%s" may not %s in scope "%s"', who, what, s.name)
                              ELSE format('role "%s" may not %s key "%s" in scope "%s"', who, what, k, s.name) END
        USING ERRCODE = '42501',
              HINT = CASE WHEN s.review_role IS NOT NULL
                          THEN format('Only members of role "%s" (the scope''s review_role) decide on its records.', role_name)
                          ELSE format('Only members of role "%s" (the scope''s allowed_role) decide on its records; idempo.alter_scope(''%s'', review_role => ...) names a role of reviewers instead.', role_name, s.name) END;
END
$$;

-- The name a decision records (src/review_rights.c): the caller's, or a role it is a member
-- of; any name from idempo's owner.
CREATE FUNCTION idempo.managed_reviewer_name(reviewer text, who name) RETURNS text
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF reviewer IS NULL THEN
        RETURN who;
    END IF;
    IF reviewer = '' THEN
        RAISE EXCEPTION 'reviewer must not be empty' USING ERRCODE = '22023',
            HINT = 'Leave reviewer out: the decision is recorded as made by the calling role.';
    END IF;
    IF reviewer = who::text
       OR (EXISTS (SELECT FROM pg_roles r WHERE r.rolname = reviewer) AND pg_has_role(who, reviewer::name, 'MEMBER'))
       OR pg_has_role(who, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'idempo.operations'::regclass), 'MEMBER') THEN
        RETURN reviewer;
    END IF;
    RAISE EXCEPTION 'role "%" may not record a decision as "%"', who, reviewer
        USING ERRCODE = '42501',
              DETAIL = 'idempo records the role that decides: a reviewer named must be the caller''s role or a role it is a member of.',
              HINT = format('Leave reviewer out: the decision is recorded as made by role "%s".', who);
END
$$;

-- managed-differs: security: reads idempo.scopes, which callers have no privilege on (the C function switches to the owner inside)
CREATE FUNCTION idempo.may_review(scope text) RETURNS boolean
    LANGUAGE plpgsql STABLE PARALLEL UNSAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempo.scopes;
BEGIN
    SELECT * INTO s FROM idempo.scopes AS sc WHERE sc.name = may_review.scope;
    RETURN FOUND AND idempo.managed_may_review(s, idempo.managed_caller());
END
$$;

CREATE FUNCTION idempo.check_reviewer(scope text, key text, reviewer text, what text) RETURNS text
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$
DECLARE
    -- the key is for the message only (NULL: none), as in the C function
    s idempo.scopes := idempo.managed_scope(check_reviewer.scope, coalesce(check_reviewer.key, '-'), NULL);
BEGIN
    PERFORM idempo.managed_check_review(s, check_reviewer.key, idempo.managed_caller(),
                                        coalesce(check_reviewer.what, 'decide on'));
    RETURN idempo.managed_reviewer_name(check_reviewer.reviewer, idempo.managed_caller());
END
$$;

-- managed-differs: security: runs idempo.managed_may_review(), which only idempo's owner may execute (the C function reads no table)
CREATE FUNCTION idempo.may_review(review_role name, allowed_role name) RETURNS boolean
    LANGUAGE plpgsql STABLE PARALLEL RESTRICTED SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s idempo.scopes;
BEGIN
    s.review_role := may_review.review_role;
    s.allowed_role := may_review.allowed_role;
    RETURN idempo.managed_may_review(s, idempo.managed_caller());
END
$$;

-- The same for the caller of the SECURITY DEFINER functions a reviewer reads through
-- (review_queue_page(), ...): managed_caller() is the role outside them, as in the C function.
CREATE FUNCTION idempo.caller_may_review(review_role name, allowed_role name) RETURNS boolean
    LANGUAGE plpgsql STABLE PARALLEL RESTRICTED AS $$
DECLARE
    s idempo.scopes;
BEGIN
    s.review_role := caller_may_review.review_role;
    s.allowed_role := caller_may_review.allowed_role;
    RETURN idempo.managed_may_review(s, idempo.managed_caller());
END
$$;
