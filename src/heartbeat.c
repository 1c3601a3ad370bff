/*-------------------------------------------------------------------------
 *
 * heartbeat.c
 *	  idempo.heartbeat(scope, key, attempt, extend): a running attempt
 *	  extends its lease.
 *
 * A long job claimed with a short lease keeps it alive by calling this now
 * and then, instead of claiming with a lease as long as the longest run.
 * The fence is the one claim and the sweep decide with (expiry.c): the
 * record is read FOR UPDATE and extended only while the named attempt is
 * the current one, in_progress, with its lease still running at this call's
 * now and its retention not yet over.  A lease that has run out is never
 * extended, even if nothing has looked at the record since: from that
 * instant a claim (in 'retry' scopes) may already have taken the operation
 * over, or made it unknown, and a heartbeat that revived it would let two
 * workers run.  The row lock orders a heartbeat against such a claim and
 * against the sweep: whichever comes second sees what the first did (a new
 * attempt, unknown: refused; a longer lease: busy, not due).
 *
 * The new lease is now + extend (NULL: the scope's lease), and never earlier
 * than the lease the attempt holds: a heartbeat only ever lengthens it, so a
 * late or repeated heartbeat cannot cut short a lease the claim or another
 * heartbeat gave.  It runs in the caller's transaction like every call; in
 * the transaction that acquired the attempt it is the same row, and
 * complete() after it takes the SQL path (the remembered TID no longer
 * shows the row: direct.c).  Nothing is written to the audit log: a
 * heartbeat changes no status.
 *
 * An extending heartbeat also moves last_attempt_at to its now, the last
 * grant.  verify()'s settle window no longer depends on it: it counts from
 * the end of the lease the attempt held when it ran out, which an attempt
 * made unknown keeps in last_attempt_at (expiry.c), so a request sent under
 * the extended lease is covered whether or not this moved.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "op_row.h"

PG_FUNCTION_INFO_V1(idempo_heartbeat);

static void
refuse_not_running(const char *scope, const char *key, int32 attempt, const char *why,
				   const char *hint)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("cannot heartbeat key \"%s\" in scope \"%s\": %s", key, scope, why),
			 errdetail("Attempt %d holds no running lease to extend.", attempt),
			 errhint("%s", hint)));
}

/* idempo.heartbeat(scope, key, attempt, extend) RETURNS timestamptz */
Datum
idempo_heartbeat(PG_FUNCTION_ARGS)
{
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	IdempoSpiSession session;
	const IdempoScope *scope;
	char	   *key;
	int32		attempt;
	Interval	extend;
	TimestampTz now;
	TimestampTz until;
	TimestampTz due;
	OpRow		r;

	idempo_spi_begin(&session);
	scope = idempo_scope_get_for_write(scope_name);
	key = idempo_key_arg(fcinfo, 1, scope);
	idempo_scope_check_use(scope, key, session.save_userid);
	extend = scope->lease;
	if (!PG_ARGISNULL(3))
	{
		extend = *PG_GETARG_INTERVAL_P(3);
		idempo_lease_check(&extend, scope, key, "extend", "heartbeat");
	}
	if (PG_ARGISNULL(2))
	{
		bool		on_commit;

		/* as complete(..., attempt => NULL): the attempt this transaction acquired */
		if (!idempo_txn_lookup(scope->name, key, &attempt, &on_commit, NULL))
			op_row_refuse_not_acquired("heartbeat", scope->name, key,
									   "Pass attempt => the attempt number idempo.claim() returned to the caller that does the work.");
	}
	else
		attempt = PG_GETARG_INT32(2);
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot heartbeat key \"%s\" in scope \"%s\" in a read-only transaction",
						key, scope->name),
				 errhint("Extend the lease in a read-write transaction on the primary.")));

	if (!op_row_read(scope->name, key, &r, OP_READ_FOR_UPDATE))
		op_row_refuse_missing("heartbeat", scope->name, key);
	/* the clock is read once the row is ours: a lock wait must not make an expired lease look live */
	now = idempo_now();
	op_row_check_attempt("heartbeat", scope->name, key, attempt, r.attempt);
	if (r.status != STATUS_IN_PROGRESS)
		refuse_not_running(scope->name, key, attempt, idempo_status_phrase(r.status),
						   idempo_status_finished(r.status) ?
						   "The attempt has finished (one claimed with complete_on_commit never had a lease): there is nothing to keep alive." :
						   r.status == STATUS_UNKNOWN ?
						   "Its lease ran out before this heartbeat: stop the work, and report what it did with complete() or fail() of this attempt, or let verify() find out." :
						   "Stop the work: the operation is no longer running under this attempt.");
	switch (op_expiry(&r, scope, now, &due))
	{
		case EXPIRY_NONE:
			break;
		case EXPIRY_REVIEW:
			refuse_not_running(scope->name, key, attempt,
							   psprintf("its retention ran out at %s, so it goes to review",
										timestamptz_to_str(op_review_at(&r, scope))),
							   "A person decides on it now (idempo.resolve()); stop the work.");
			break;
		default:
			/* the lease ran out: a claim may already have taken the operation over */
			refuse_not_running(scope->name, key, attempt,
							   psprintf("its lease ran out at %s", timestamptz_to_str(r.lease_expires_at)),
							   scope->retry_on_lease_expiry ?
							   "Another claim may acquire the next attempt from that instant on: stop the work, and report what it did with complete() or fail() of this attempt." :
							   "From that instant its outcome counts as unknown: stop the work, and report what it did with complete() or fail() of this attempt.");
			break;
	}

	until = idempo_time_plus(now, &extend);
	/* never shortens: a late or repeated heartbeat cannot cut a lease short */
	if (until > r.lease_expires_at)
	{
		r.lease_expires_at = until;
		/*
		 * The last grant, for whoever reads the record.  verify()'s settle
		 * window counts from this lease's end once it runs out (expiry.c).
		 */
		r.last_attempt_at = Max(r.last_attempt_at, now);
		r.sweep_at = Min(until, op_review_at(&r, scope));
		op_row_write(scope->name, key, &r);
	}
	idempo_spi_end(&session);
	PG_RETURN_TIMESTAMPTZ(r.lease_expires_at);
}
