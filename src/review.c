/*-------------------------------------------------------------------------
 *
 * review.c
 *	  Resolving doubt: verify() after looking the action up in the target
 *	  system, and the review loop (request_review, resolve).
 *
 * "I did not hear success" must never become "it did not happen":
 *	- verify(found => false) makes an unknown operation retryable only once
 *	  the scope's verify_settle has passed since the attempt's lease ran out,
 *	  the last moment it could act (an empty lookup may be a lagging replica
 *	  or a request sent late under the lease and still in flight);
 *	- in_review operations change only through resolve(), by a named person.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "miscadmin.h"
#include "op_row.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(idempo_verify);
PG_FUNCTION_INFO_V1(idempo_verify_attempt);
PG_FUNCTION_INFO_V1(idempo_verify_without_attempt);
PG_FUNCTION_INFO_V1(idempo_resolve);
PG_FUNCTION_INFO_V1(idempo_request_review);

/* Reads and locks the record; refuses a missing one. */
static void
read_locked(const IdempoScope *scope, const char *key, OpRow *r, const char *verb)
{
	if (!op_row_read(scope->name, key, r, OP_READ_FOR_UPDATE))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("cannot %s key \"%s\" in scope \"%s\": there is no such operation",
						verb, key, scope->name),
				 errhint("A finished record may have expired; idempo.lookup() shows what is stored.")));
}

/* An in_progress record whose lease ran out is unknown for verify and resolve. */
static void
apply_lease_expiry(OpRow *r, const IdempoScope *s, TimestampTz now)
{
	if (r->status == STATUS_IN_PROGRESS && r->lease_expires_at <= now)
		op_row_make_unknown(r, s);
}

static void
set_finished(OpRow *r, const IdempoScope *s, IdempoStatus to, TimestampTz now)
{
	r->status = to;
	r->lease_expires_at = DT_NOBEGIN;
	r->completed_at = now;
	r->expires_at = idempo_time_plus(now, &s->retention);
	r->sweep_at = r->expires_at;
}

static Datum
text_arg(FunctionCallInfo fcinfo, int argno)
{
	return PG_ARGISNULL(argno) ? (Datum) 0 : PointerGetDatum(PG_GETARG_TEXT_PP(argno));
}

static Jsonb *
jsonb_arg(FunctionCallInfo fcinfo, int argno)
{
	return PG_ARGISNULL(argno) ? NULL : PG_GETARG_JSONB_P(argno);
}

/*
 * verify()'s work.  The arguments: scope 0, key 1, then the attempt (or -1
 * for the 0.1/0.2 form without it), found, target_ref and result.
 */
static Datum
verify(FunctionCallInfo fcinfo, int attempt_argno)
{
	int			found_argno = attempt_argno < 0 ? 2 : attempt_argno + 1;
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	IdempoSpiSession session;
	const IdempoScope *s;
	char	   *key;
	bool		found;
	OpRow		r;
	IdempoStatus from;
	TimestampTz now;

	idempo_spi_begin(&session);
	s = idempo_scope_get_for_write(scope_name);
	key = idempo_key_arg(fcinfo, 1, s);
	idempo_scope_check_verify(s, key, session.save_userid);
	if (attempt_argno >= 0 && PG_ARGISNULL(attempt_argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("attempt must not be NULL (key \"%s\" in scope \"%s\")", key, s->name),
				 errhint("Pass attempt => the attempt whose outcome you looked up: the attempt idempo.claim() returned with outcome 'unknown'.")));
	if (PG_ARGISNULL(found_argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("found must not be NULL (key \"%s\" in scope \"%s\")", key, s->name),
				 errhint("Pass found => true if the target system has the action, false if its lookup came back empty.")));
	found = PG_GETARG_BOOL(found_argno);
	now = idempo_now();
	read_locked(s, key, &r, "verify");
	from = r.status;
	apply_lease_expiry(&r, s, now);

	/*
	 * The fence: a lookup says something about the attempt it was made for.
	 * An empty lookup made while attempt N was in doubt says nothing about
	 * attempt N+1, which may have done the work since.
	 */
	if (attempt_argno >= 0)
		op_row_check_attempt("verify", s->name, key, PG_GETARG_INT32(attempt_argno), r.attempt);

	if (r.status != STATUS_UNKNOWN)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot verify key \"%s\" in scope \"%s\": %s",
						key, s->name, idempo_status_phrase(r.status)),
				 r.status == STATUS_IN_PROGRESS ?
				 errdetail("An attempt holds the lease until %s.", timestamptz_to_str(r.lease_expires_at)) : 0,
				 r.status == STATUS_IN_PROGRESS ?
				 errhint("Wait for the attempt's reply or for its lease to run out.") :
				 r.status == STATUS_IN_REVIEW ?
				 errhint("A person decides on operations in review: use idempo.resolve().") :
				 errhint("verify() is for operations whose outcome is unknown.")));

	/*
	 * The lookup is done: verify ends the verification lease (claim.c)
	 * whatever it found.  Still unknown, the next claim looks again.
	 */
	r.lease_expires_at = DT_NOBEGIN;
	if (found)
	{
		set_finished(&r, s, STATUS_SUCCEEDED, now);
		r.target_ref = text_arg(fcinfo, found_argno + 1);
		r.result = jsonb_arg(fcinfo, found_argno + 2);
		r.error = (Datum) 0;
	}
	else
	{
		/*
		 * An unknown attempt's last_attempt_at is the end of its lease, the
		 * last moment it could act (op_row_make_unknown()): a request sent
		 * just before then may land up to verify_settle later.
		 */
		TimestampTz settled_at = idempo_time_plus(r.last_attempt_at, &s->verify_settle);

		if (now >= settled_at)
		{
			/* nothing happened: the next claim may try again */
			r.status = STATUS_RETRYABLE;
			r.error = CStringGetTextDatum("verified: not executed");
		}
		else
			ereport(NOTICE,
					(errmsg("key \"%s\" in scope \"%s\" stays unknown: an empty lookup inside the settle window is not proof",
							key, s->name),
					 errdetail("The settle window (verify_settle after the attempt's lease ended) ends at %s; until then a lagging replica or a request still in flight may not show the action.",
							   timestamptz_to_str(settled_at)),
					 errhint("Look it up again after the settle window.")));
	}
	op_row_write(s->name, key, &r);
	/* the event names the run of the attempt whose outcome was looked up */
	idempo_log_event(s, key, r.run_id ? TextDatumGetCString(r.run_id) : NULL, r.attempt, from,
					 r.status, -1, found ? "verify found" : "verify not found", now,
					 session.save_userid);
	idempo_spi_end(&session);
	PG_RETURN_DATUM(idempo_status_datum(r.status));
}

/*
 * idempo.verify(scope, key, attempt, found, target_ref, result)
 *	 RETURNS idempo.status
 */
Datum
idempo_verify_attempt(PG_FUNCTION_ARGS)
{
	return verify(fcinfo, 2);
}

/*
 * idempo.verify(scope, key, found, target_ref, result) of versions 0.1.0
 * and 0.2.0 of the SQL objects, which have no other: unfenced, as it was.
 * ALTER EXTENSION idempo UPDATE brings the fenced form.
 */
Datum
idempo_verify(PG_FUNCTION_ARGS)
{
	return verify(fcinfo, -1);
}

/*
 * The same signature from 0.3.0 on: refused, so that code written for the
 * old form fails loudly instead of deciding about an attempt it did not
 * name.
 */
Datum
idempo_verify_without_attempt(PG_FUNCTION_ARGS)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_FUNCTION),
			 errmsg("idempo.verify() needs the attempt its lookup was made for"),
			 errdetail("A lookup made while one attempt was in doubt says nothing about a later attempt, which may have done the work since."),
			 errhint("Call idempo.verify(scope, key, attempt => <the attempt idempo.claim() returned with outcome 'unknown'>, found => ...).")));
	PG_RETURN_NULL();
}

/*
 * idempo.resolve(scope, key, resolution, reviewer, target_ref, result, note)
 *	 RETURNS idempo.status
 *
 * resolution: 'succeeded' (it happened), 'not_executed' (it did not: the
 * operation becomes retryable, with a fresh retention window and a fresh
 * allowance of max_attempts) or 'failed' (final).
 */
Datum
idempo_resolve(PG_FUNCTION_ARGS)
{
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	IdempoSpiSession session;
	const IdempoScope *s;
	char	   *key;
	char	   *resolution;
	char	   *reviewer;
	OpRow		r;
	IdempoStatus from;
	TimestampTz now;

	resolution = PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2));
	reviewer = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));

	idempo_spi_begin(&session);
	s = idempo_scope_get_for_write(scope_name);
	key = idempo_key_arg(fcinfo, 1, s);
	if (resolution == NULL ||
		(strcmp(resolution, "succeeded") != 0 && strcmp(resolution, "not_executed") != 0 &&
		 strcmp(resolution, "failed") != 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unknown resolution %s for key \"%s\" in scope \"%s\"",
						resolution ? quote_literal_cstr(resolution) : "NULL", key, s->name),
				 errhint("Use 'succeeded' (it happened), 'not_executed' (it did not) or 'failed' (final).")));
	idempo_scope_check_review(s, key, session.save_userid, "resolve");
	reviewer = idempo_reviewer_name(reviewer, session.save_userid);

	now = idempo_now();
	read_locked(s, key, &r, "resolve");
	from = r.status;
	apply_lease_expiry(&r, s, now);
	if (r.status != STATUS_UNKNOWN && r.status != STATUS_IN_REVIEW)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot resolve key \"%s\" in scope \"%s\": %s",
						key, s->name, idempo_status_phrase(r.status)),
				 errhint("resolve() decides operations whose outcome is unknown or that are in review; put it in review first with idempo.request_review() if a person must decide.")));

	if (strcmp(resolution, "succeeded") == 0)
	{
		set_finished(&r, s, STATUS_SUCCEEDED, now);
		if (!PG_ARGISNULL(4))
			r.target_ref = text_arg(fcinfo, 4);
		if (!PG_ARGISNULL(5))
			r.result = jsonb_arg(fcinfo, 5);
		r.error = (Datum) 0;
	}
	else if (strcmp(resolution, "failed") == 0)
	{
		set_finished(&r, s, STATUS_FAILED, now);
		r.error = PG_ARGISNULL(6) ? CStringGetTextDatum("failed (resolved by a reviewer)") :
			text_arg(fcinfo, 6);
	}
	else
	{
		/* not executed: may run again, in a fresh retention window */
		r.status = STATUS_RETRYABLE;
		r.first_seen_at = now;
		r.lease_expires_at = DT_NOBEGIN;
		r.completed_at = DT_NOBEGIN;
		r.expires_at = DT_NOBEGIN;
		r.sweep_at = op_review_at(&r, s);
		r.attempt_base = r.attempt;
		r.error = CStringGetTextDatum("not executed (resolved by a reviewer)");
	}
	op_row_write(s->name, key, &r);
	idempo_close_review(s->name, key, reviewer, resolution, PG_ARGISNULL(6) ? NULL :
						text_to_cstring(PG_GETARG_TEXT_PP(6)), now);
	idempo_log_event(s, key, NULL, r.attempt, from, r.status, -1, "resolve", now,
					 session.save_userid);
	idempo_spi_end(&session);
	PG_RETURN_DATUM(idempo_status_datum(r.status));
}

/*
 * idempo.request_review(scope, key, note) RETURNS bigint: puts an operation
 * in review by hand; returns the review's id (the open one, if there is one).
 */
Datum
idempo_request_review(PG_FUNCTION_ARGS)
{
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	IdempoSpiSession session;
	const IdempoScope *s;
	char	   *key;
	OpRow		r;
	IdempoStatus from;
	TimestampTz now;
	TimestampTz next_due;
	int64		review_id;

	idempo_spi_begin(&session);
	s = idempo_scope_get_for_write(scope_name);
	key = idempo_key_arg(fcinfo, 1, s);
	/* the application (allowed_role) hands a record to a person; so may a reviewer */
	idempo_scope_check_read(s, key, session.save_userid);
	now = idempo_now();
	read_locked(s, key, &r, "review");
	from = r.status;
	/*
	 * Its result is gone (or goes at the next sweep: a claim answers expired
	 * already): resolved, it would replay a NULL or an expired result.
	 */
	if (op_row_remembered(&r) || op_expiry(&r, s, now, &next_due) == EXPIRY_REMEMBER)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot review key \"%s\" in scope \"%s\": %s and its result has expired",
						key, s->name, idempo_status_phrase(r.status)),
				 errdetail("The key is remembered: claims answer 'expired' and never run its action again."),
				 errhint("To let the action run again under this key, release it with idempo.release().")));
	review_id = idempo_open_review(s->name, key, "manual",
								   PG_ARGISNULL(2) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(2)),
								   now);
	if (r.status != STATUS_IN_REVIEW)
	{
		/* in review nothing expires: a person decides (completed_at stays as history) */
		r.status = STATUS_IN_REVIEW;
		r.lease_expires_at = DT_NOBEGIN;
		r.expires_at = DT_NOBEGIN;
		r.sweep_at = DT_NOBEGIN;
		op_row_write(s->name, key, &r);
		idempo_log_event(s, key, NULL, r.attempt, from, r.status, -1, "request_review", now,
						 session.save_userid);
	}
	idempo_spi_end(&session);
	PG_RETURN_INT64(review_id);
}
