/*-------------------------------------------------------------------------
 *
 * expiry.c
 *	  What time has done to an operation: the rules shared by claim (at read
 *	  time) and sweep (in the background), so that both always agree.
 *
 * In the order the spec applies them:
 *	 1. a finished record past expires_at counts as absent (sweep: purge),
 *		unless its scope remembers keys: then it is shrunk to a remembered
 *		key, which counts as absent only once expires_at + remember passed;
 *	 2. unfinished work whose first_seen_at + retention has passed goes to
 *		review, whatever its lease;
 *	 3. an in_progress attempt whose lease ran out becomes unknown, or in
 *		'retry' scopes may be acquired again.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "op_row.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

/* When unfinished work of this record goes to review. */
TimestampTz
op_review_at(const OpRow *r, const IdempoScope *s)
{
	return idempo_time_plus(r->first_seen_at, &s->retention);
}

/*
 * Whether a finished record is a remembered key: shrunk, its result gone.
 * Nothing but the shrink moves a finished record's sweep_at past its
 * expires_at (complete, fail, verify and resolve set it to expires_at at
 * most), so the two times tell it, with no column of its own: objects of
 * 0.1.0 and 0.2.0, which cannot configure remember, never have one.
 */
bool
op_row_remembered(const OpRow *r)
{
	return idempo_status_finished(r->status) &&
		!TIMESTAMP_IS_NOBEGIN(r->sweep_at) && !TIMESTAMP_IS_NOBEGIN(r->expires_at) &&
		r->sweep_at > r->expires_at;
}

/*
 * Shrinks a finished record past expires_at to a remembered key: the key,
 * fingerprint, status, attempt, times and target_ref stay; the result,
 * params, error text and run id go.  It is forgotten (purged) at
 * expires_at + remember.  The sweep's SWEEP_SHRINK_REST does the same.
 */
void
op_row_shrink(OpRow *r, const IdempoScope *s)
{
	Assert(idempo_status_finished(r->status) && s->remembers);
	r->result = NULL;
	r->params = NULL;
	r->error = (Datum) 0;
	r->run_id = (Datum) 0;
	r->sweep_at = idempo_time_plus(r->expires_at, &s->remember);
}

/*
 * What is due on the record at "now".  *next_due is set to the earliest
 * time something will be due (DT_NOBEGIN: never, the record is in review).
 */
OpExpiry
op_expiry(const OpRow *r, const IdempoScope *s, TimestampTz now, TimestampTz *next_due)
{
	TimestampTz review_at = op_review_at(r, s);

	*next_due = DT_NOBEGIN;
	if (idempo_status_finished(r->status))
	{
		TimestampTz forget_at;

		if (op_row_remembered(r))
		{
			/* forgotten when the time it was remembered for has passed */
			*next_due = r->sweep_at;
			return r->sweep_at <= now ? EXPIRY_ABSENT : EXPIRY_NONE;
		}
		*next_due = r->expires_at;
		if (r->expires_at > now)
			return EXPIRY_NONE;
		if (!s->remembers)
			return EXPIRY_ABSENT;
		forget_at = idempo_time_plus(r->expires_at, &s->remember);
		if (forget_at <= now)
			return EXPIRY_ABSENT;
		*next_due = forget_at;
		return EXPIRY_REMEMBER;
	}
	if (!idempo_status_unfinished(r->status))
		return EXPIRY_NONE;

	*next_due = review_at;
	if (review_at <= now)
		return EXPIRY_REVIEW;
	if (r->status == STATUS_IN_PROGRESS)
	{
		*next_due = Min(r->lease_expires_at, review_at);
		if (r->lease_expires_at <= now)
			return s->retry_on_lease_expiry ? EXPIRY_LEASE_RETRY : EXPIRY_LEASE_UNKNOWN;
	}
	return EXPIRY_NONE;
}

/*
 * An in_progress attempt whose lease ran out, made unknown.  last_attempt_at
 * becomes the lease's end, the last moment the attempt could act: the worker
 * may send its request at any time under its lease, so verify()'s settle
 * window (review.c) counts from there.  Counted from the claim, an empty
 * lookup right after a long lease ran out would free the key while the
 * request sent late under it is still in flight, and the next attempt would
 * do the action again.  It must be kept here: the verification lease a
 * claim takes next overwrites lease_expires_at.  The sweep's
 * SWEEP_SET_REST (op_row.h) does the same.
 */
void
op_row_make_unknown(OpRow *r, const IdempoScope *s)
{
	r->status = STATUS_UNKNOWN;
	r->last_attempt_at = r->lease_expires_at;
	r->lease_expires_at = DT_NOBEGIN;
	r->sweep_at = op_review_at(r, s);
}

/* Why a retention_expired review was opened (the sweep's statement writes the same text). */
char *
op_retention_detail(const OpRow *r)
{
	/* the time as the SQL statement's format() shows it: in the session's DateStyle */
	char	   *first_seen = DatumGetCString(DirectFunctionCall1(timestamptz_out,
																 TimestampTzGetDatum(r->first_seen_at)));

	return psprintf("still %s at attempt %d when the scope's retention ran out (first seen %s)",
					idempo_status_names[r->status], r->attempt, first_seen);
}
