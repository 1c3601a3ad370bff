/*-------------------------------------------------------------------------
 *
 * review_rights.c
 *	  Who may review a scope's records, and whom a decision names.
 *
 * A scope's reviewers are the members of its review_role; without one, the
 * members of its allowed_role (the application's people decide on its
 * records); without either, every role with the reviewer's grants.  idempo's
 * owner (a member of the role that owns its tables, so every superuser) may
 * review every scope: it can read and write the tables anyway.  This is the
 * one place the rule is written: resolve() and request_review() call it
 * here, the PL/pgSQL functions resolve_conflict() and release() through
 * idempo.check_reviewer(), the functions a reviewer reads through
 * (review_queue_page() and the others, SECURITY DEFINER) through
 * idempo.caller_may_review(), and the views (review_queue, conflict_queue,
 * reviewable_operations, ...) through idempo.may_review().  Roles are
 * looked up by name at each use, as allowed_role is (scope_cache.c).
 *
 * A decision records the role that made it.  The reviewer argument of
 * resolve(), resolve_conflict() and release() may be left out (the caller
 * is recorded); a name given must be the caller's own, or a role the caller
 * is a member of (it could SET ROLE to it and decide as that role anyway).
 * Only idempo's owner may record another name (to import decisions made
 * elsewhere): it could write the column directly.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(idempo_may_review);
PG_FUNCTION_INFO_V1(idempo_may_review_settings);
PG_FUNCTION_INFO_V1(idempo_check_reviewer);
PG_FUNCTION_INFO_V1(idempo_caller_may_review);

/* The role of name, or InvalidOid: no such role. */
static Oid
role_named(const char *name)
{
	return name ? get_role_oid(name, true) : InvalidOid;
}

/* The role whose members review the scope: review_role, else allowed_role; NULL: anyone. */
static const char *
reviewers_role_name(const IdempoScope *scope)
{
	return scope->review_role_name ? scope->review_role_name : scope->allowed_role_name;
}

static bool
is_idempo_owner(Oid user)
{
	return is_member_of_role(user, idempo_catalog()->owner);
}

/*
 * The rule, from the scope's two settings: name is the reviewers' role
 * (reviewers_role_name()).  It reads no table, only the catalogs, so that a
 * view can filter with it where the query runs on another node (Citus sends
 * it to the workers with each shard's query).
 */
static bool
may_review_as(const char *name, Oid user)
{
	Oid			role;

	if (name == NULL || is_idempo_owner(user))
		return true;
	role = role_named(name);
	return OidIsValid(role) && is_member_of_role(user, role);
}

/* May user review the scope's records?  A role named but missing: no (but the owner may). */
bool
idempo_scope_may_review(const IdempoScope *scope, Oid user)
{
	return may_review_as(reviewers_role_name(scope), user);
}

/*
 * Refuses a caller who may not review the scope; what: the verb, for the
 * message; key: the key it names, or NULL for none.
 */
void
idempo_scope_check_review(const IdempoScope *scope, const char *key, Oid user, const char *what)
{
	const char *name = reviewers_role_name(scope);

	if (idempo_scope_may_review(scope, user))
		return;
	if (!OidIsValid(role_named(name)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("%s \"%s\" of scope \"%s\" does not exist",
						scope->review_role_name ? "review_role" : "allowed_role", name, scope->name),
				 errhint("Recreate the role or change the scope with idempo.alter_scope('%s', %s => ...).",
						 scope->name, scope->review_role_name ? "review_role" : "allowed_role")));
	/* key NULL: not to be named (a conflict's key, to someone who may not see it) */
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 key ? errmsg("role \"%s\" may not %s key \"%s\" in scope \"%s\"",
						  GetUserNameFromId(user, false), what, key, scope->name) :
			 errmsg("role \"%s\" may not %s in scope \"%s\"",
					GetUserNameFromId(user, false), what, scope->name),
			 scope->review_role_name ?
			 errhint("Only members of role \"%s\" (the scope's review_role) decide on its records.", name) :
			 errhint("Only members of role \"%s\" (the scope's allowed_role) decide on its records; idempo.alter_scope('%s', review_role => ...) names a role of reviewers instead.",
					 name, scope->name)));
}

/*
 * The name a decision records: the caller's, when reviewer is NULL; else
 * reviewer, if the caller may name it (see the file header).
 */
char *
idempo_reviewer_name(const char *reviewer, Oid user)
{
	char	   *caller = GetUserNameFromId(user, false);
	Oid			role;

	if (reviewer == NULL)
		return caller;
	if (reviewer[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("reviewer must not be empty"),
				 errhint("Leave reviewer out: the decision is recorded as made by the calling role.")));
	if (strcmp(reviewer, caller) == 0)
		return caller;
	role = role_named(reviewer);
	if ((OidIsValid(role) && is_member_of_role(user, role)) || is_idempo_owner(user))
		return pstrdup(reviewer);
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("role \"%s\" may not record a decision as \"%s\"", caller, reviewer),
			 errdetail("idempo records the role that decides: a reviewer named must be the caller's role or a role it is a member of."),
			 errhint("Leave reviewer out: the decision is recorded as made by role \"%s\".", caller)));
	return NULL;				/* not reached */
}

/*
 * idempo.may_review(scope text) RETURNS boolean: may the current role
 * review the scope's records?  false for a scope that does not exist.  The
 * filter of the views a reviewer reads: it never raises an error, so one
 * scope with a missing role cannot empty a queue for everyone.
 */
Datum
idempo_may_review(PG_FUNCTION_ARGS)
{
	Oid			user = GetUserId();
	char	   *scope_name;
	IdempoSpiSession session;
	const IdempoScope *scope;
	bool		result;

	if (PG_ARGISNULL(0))
		PG_RETURN_BOOL(false);
	scope_name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (scope_name[0] == '\0' || strlen(scope_name) > IDEMPO_MAX_SCOPE_BYTES)
		PG_RETURN_BOOL(false);
	idempo_spi_begin(&session);
	scope = idempo_scope_find(scope_name);
	result = scope != NULL && idempo_scope_may_review(scope, user);
	idempo_spi_end(&session);
	PG_RETURN_BOOL(result);
}

/* The reviewers' role of a scope from its two settings (arguments 0 and 1), as reviewers_role_name(). */
static const char *
reviewers_role_arg(FunctionCallInfo fcinfo)
{
	if (!PG_ARGISNULL(0))
		return NameStr(*PG_GETARG_NAME(0));
	if (!PG_ARGISNULL(1))
		return NameStr(*PG_GETARG_NAME(1));
	return NULL;
}

/*
 * idempo.may_review(review_role name, allowed_role name) RETURNS boolean: the
 * same answer from a scope's two settings, reading no table (see
 * may_review_as()): the filter of the views a reviewer reads, which join
 * idempo.scopes.  Columns, not the row: on Citus the row would be a shard's.
 */
Datum
idempo_may_review_settings(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(may_review_as(reviewers_role_arg(fcinfo), GetUserId()));
}

/*
 * idempo.check_reviewer(scope text, key text, reviewer text, what text)
 *	 RETURNS text
 *
 * For the PL/pgSQL decisions (resolve_conflict, release), which run as
 * idempo's owner: refuses a caller who may not review the scope, and
 * returns the name to record.  key is the stored key (the digest in a
 * hash_keys scope), for the message only; NULL: the message names none.
 * The caller is the role in effect outside SECURITY DEFINER functions (SET
 * ROLE's, else the session's): inside one, the current role is the owner.
 * Only idempo's owner may execute it.
 */
Datum
idempo_check_reviewer(PG_FUNCTION_ARGS)
{
	Oid			user = GetOuterUserId();
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	IdempoSpiSession session;
	const IdempoScope *scope;
	char	   *key;
	char	   *reviewer;
	char	   *what;

	key = PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
	reviewer = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	what = PG_ARGISNULL(3) ? "decide on" : text_to_cstring(PG_GETARG_TEXT_PP(3));
	idempo_spi_begin(&session);
	scope = idempo_scope_get(scope_name);
	idempo_scope_check_review(scope, key, user, what);
	reviewer = idempo_reviewer_name(reviewer, user);
	idempo_spi_end(&session);
	PG_RETURN_TEXT_P(cstring_to_text(reviewer));
}

/*
 * idempo.caller_may_review(review_role name, allowed_role name) RETURNS
 * boolean: idempo.may_review(name, name) for the caller of the SECURITY
 * DEFINER functions a reviewer reads through (review_queue_page(), ...):
 * inside one, the current role is idempo's owner, who may review every scope,
 * so the answer is for the role outside it (SET ROLE's, else the session's),
 * as idempo.check_reviewer() decides.  Only idempo's owner may execute it.
 */
Datum
idempo_caller_may_review(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(may_review_as(reviewers_role_arg(fcinfo), GetOuterUserId()));
}
