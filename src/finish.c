/*-------------------------------------------------------------------------
 *
 * finish.c
 *	  idempo.complete() and idempo.fail(): record the outcome of an attempt.
 *
 * Both are one UPDATE fenced by attempt: it matches only while the named
 * attempt is still the operation's current one and the operation is
 * in_progress, or unknown/retryable (a late reply of the current attempt
 * still says what happened; it must not be lost, or the next attempt could
 * do the work a second time).
 * Only when nothing matched do we read the row again, to say precisely why
 * the call was refused.  The UPDATE changes no indexed column, so it can be
 * a HOT update.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "op_row.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(idempo_complete);
PG_FUNCTION_INFO_V1(idempo_fail);

typedef struct FinishArgs
{
	const IdempoScope *scope;
	char	   *key;
	int32		attempt;
	bool		on_commit;		/* this transaction acquired it with complete_on_commit */
	IdempoStatus to;
	Datum		result;			/* jsonb or 0 */
	Datum		target_ref;		/* text or 0 */
	Datum		error;			/* text or 0 */
	bool		retryable_null;	/* fail(..., retryable => NULL): refused */
	ItemPointerData tid;		/* where this transaction wrote the attempt's record, if known */
} FinishArgs;

/* Which attempt the call finishes: the one given, or the one this transaction acquired. */
static void
resolve_attempt(FunctionCallInfo fcinfo, int argno, FinishArgs *f, const char *verb)
{
	int32		mine;
	bool		on_commit;
	ItemPointerData tid;
	bool		have = idempo_txn_lookup(f->scope->name, f->key, &mine, &on_commit, &tid);

	if (PG_ARGISNULL(argno))
	{
		if (!have)
			op_row_refuse_not_acquired(verb, f->scope->name, f->key,
									   "Pass attempt => the attempt number idempo.claim() returned to the caller that did the work.");
		f->attempt = mine;
		f->on_commit = on_commit;
	}
	else
	{
		f->attempt = PG_GETARG_INT32(argno);
		f->on_commit = have && on_commit && mine == f->attempt;
	}
	if (have && mine == f->attempt)
		f->tid = tid;
	else
		ItemPointerSetInvalid(&f->tid);
}

/* The finish through direct.c, if it applies; false: nothing done. */
static bool
finish_directly(FinishArgs *f, TimestampTz completed_at, TimestampTz expires_at)
{
	OpDirectFinish d;

	if (!ItemPointerIsValid(&f->tid) || f->scope->audit)
		return false;
	d.scope = f->scope->name;
	d.key = f->key;
	d.attempt = f->attempt;
	d.on_commit = f->on_commit;
	d.to = f->to;
	d.result = f->result;
	d.target_ref = f->target_ref;
	d.error = f->error;
	d.completed_at = completed_at;
	d.expires_at = expires_at;
	if (!op_direct_finish(&d, &f->tid))
		return false;
	idempo_txn_moved(f->scope->name, f->key, &f->tid);
	return true;
}

/* Explains why the fenced UPDATE matched nothing. */
static void
refuse(const FinishArgs *f, const char *verb)
{
	OpRow		r;

	if (!op_row_read(f->scope->name, f->key, &r, OP_READ_PLAIN))
		op_row_refuse_missing(verb, f->scope->name, f->key);
	op_row_check_attempt(verb, f->scope->name, f->key, f->attempt, r.attempt);
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("cannot %s key \"%s\" in scope \"%s\": %s",
					verb, f->key, f->scope->name, idempo_status_phrase(r.status)),
			 r.status == STATUS_IN_REVIEW ?
			 errhint("A person decides on operations in review: use idempo.resolve().") :
			 op_row_remembered(&r) ?
			 errhint("The operation finished and its result has expired; every claim answers expired.") :
			 idempo_status_finished(r.status) ?
			 errhint("The operation is already finished; its result is replayed to every claim.") :
			 errhint("Claim the key first with idempo.claim().")));
}

/*
 * fail(..., retryable) of the attempt that used the scope's max_attempts:
 * the operation is retryable, as answered, but the next claim will not
 * acquire it; it puts it in review (claim.c).  Say so now, to the caller
 * that decides what to do next, rather than answer a status it does not
 * have yet.
 */
static void
notice_attempts_used(const FinishArgs *f)
{
	OpRow		r;

	/* an attempt below the limit cannot have used it (the count starts at attempt_base >= 0) */
	if (f->to != STATUS_RETRYABLE || f->scope->max_attempts <= 0 || f->attempt < f->scope->max_attempts)
		return;
	if (!op_row_read(f->scope->name, f->key, &r, OP_READ_PLAIN) ||
		r.attempt - r.attempt_base < f->scope->max_attempts)
		return;
	ereport(NOTICE,
			(errmsg_plural("key \"%s\" in scope \"%s\" has used the %d attempt its scope allows: the next claim puts it in review",
						   "key \"%s\" in scope \"%s\" has used the %d attempts its scope allows: the next claim puts it in review",
						   f->scope->max_attempts, f->key, f->scope->name, f->scope->max_attempts),
			 errdetail("fail() recorded attempt %d as retryable; max_attempts of the scope is %d.",
					   f->attempt, f->scope->max_attempts),
			 errhint("Do not retry it: the next claim answers in_review (reason attempts_exhausted), and a reviewer's resolve(..., 'not_executed') grants new attempts.")));
}

static Datum
finish(FunctionCallInfo fcinfo, FinishArgs *f, int attempt_argno, const char *verb)
{
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	IdempoSpiSession session;
	TimestampTz now;
	TimestampTz completed_at = DT_NOBEGIN;
	TimestampTz expires_at = DT_NOBEGIN;
	Datum		values[10];
	char		nulls[10];
	int			from_status = -1;
	char	   *run_id = NULL;

	idempo_spi_begin(&session);
	f->scope = idempo_scope_get_for_write(scope_name);
	f->key = idempo_key_arg(fcinfo, 1, f->scope);
	idempo_scope_check_use(f->scope, f->key, session.save_userid);
	if (f->retryable_null)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("retryable must not be NULL (key \"%s\" in scope \"%s\")", f->key, f->scope->name),
				 errhint("true: the attempt had no effect and may be retried; false: a final failure, replayed to every claim.")));
	resolve_attempt(fcinfo, attempt_argno, f, verb);
	now = idempo_now();
	if (idempo_status_finished(f->to))
	{
		completed_at = now;
		expires_at = idempo_time_plus(now, &f->scope->retention);
	}

	if (finish_directly(f, completed_at, expires_at))
	{
		idempo_txn_finished(f->scope->name, f->key, f->attempt);
		notice_attempts_used(f);
		idempo_spi_end(&session);
		return idempo_status_datum(f->to);
	}

	if (f->scope->audit)
	{
		OpRow		before;

		if (op_row_read(f->scope->name, f->key, &before, OP_READ_FOR_UPDATE))
		{
			from_status = before.status;
			/* the event names the run of the attempt it finishes */
			if (before.run_id)
				run_id = TextDatumGetCString(before.run_id);
		}
	}

	memset(nulls, ' ', sizeof(nulls));
	values[0] = CStringGetTextDatum(f->scope->name);
	values[1] = CStringGetTextDatum(f->key);
	values[2] = Int32GetDatum(f->attempt);
	values[3] = CStringGetTextDatum(idempo_status_names[f->to]);
	values[4] = f->result;
	nulls[4] = f->result ? ' ' : 'n';
	values[5] = f->target_ref;
	nulls[5] = f->target_ref ? ' ' : 'n';
	values[6] = f->error;
	nulls[6] = f->error ? ' ' : 'n';
	values[7] = TimestampTzGetDatum(completed_at);
	values[8] = TimestampTzGetDatum(expires_at);
	if (!idempo_status_finished(f->to))
		nulls[7] = nulls[8] = 'n';
	values[9] = BoolGetDatum(f->on_commit);

	if (idempo_spi_execute(PLAN_OP_FINISH, values, nulls, 0) != 1)
		refuse(f, verb);
	idempo_txn_finished(f->scope->name, f->key, f->attempt);

	idempo_log_event(f->scope, f->key, run_id, f->attempt, from_status, f->to, -1, verb, now,
					 session.save_userid);
	notice_attempts_used(f);
	idempo_spi_end(&session);
	return idempo_status_datum(f->to);
}

/* idempo.complete(scope, key, attempt, result, target_ref) RETURNS idempo.status */
Datum
idempo_complete(PG_FUNCTION_ARGS)
{
	FinishArgs	f;

	memset(&f, 0, sizeof(f));
	f.to = STATUS_SUCCEEDED;
	f.result = PG_ARGISNULL(3) ? (Datum) 0 : PointerGetDatum(PG_GETARG_JSONB_P(3));
	f.target_ref = PG_ARGISNULL(4) ? (Datum) 0 : PointerGetDatum(PG_GETARG_TEXT_PP(4));
	PG_RETURN_DATUM(finish(fcinfo, &f, 2, "complete"));
}

/* idempo.fail(scope, key, attempt, error, retryable) RETURNS idempo.status */
Datum
idempo_fail(PG_FUNCTION_ARGS)
{
	FinishArgs	f;

	memset(&f, 0, sizeof(f));
	f.retryable_null = PG_ARGISNULL(4);
	f.to = (f.retryable_null || PG_GETARG_BOOL(4)) ? STATUS_RETRYABLE : STATUS_FAILED;
	f.error = PG_ARGISNULL(3) ? (Datum) 0 : PointerGetDatum(PG_GETARG_TEXT_PP(3));
	PG_RETURN_DATUM(finish(fcinfo, &f, 2, "fail"));
}
