/*-------------------------------------------------------------------------
 *
 * audit.c
 *	  Rows that record what happened to an operation: reviews (a person must
 *	  decide) and events (the audit log of scopes with audit = true).
 *
 * Both run inside an idempo SPI session, in the caller's transaction: a
 * review or event exists exactly when the transition it describes
 * committed.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "miscadmin.h"
#include "utils/builtins.h"

static Datum
text_or_null(const char *s, char *null_flag)
{
	*null_flag = s ? ' ' : 'n';
	return s ? CStringGetTextDatum(s) : (Datum) 0;
}

/*
 * Appends one event.  from_status, to_status and outcome are -1 when they
 * do not apply.  No-op unless the scope audits.
 */
void
idempo_log_event(const IdempoScope *scope, const char *key, const char *run_id, int32 attempt,
				 int from_status, int to_status, int outcome, const char *action,
				 TimestampTz at, Oid actor)
{
	Datum		values[10];
	char		nulls[10];

	if (!scope->audit)
		return;
	memset(nulls, ' ', sizeof(nulls));
	values[0] = TimestampTzGetDatum(at);
	values[1] = CStringGetTextDatum(scope->name);
	values[2] = CStringGetTextDatum(key);
	values[3] = text_or_null(run_id, &nulls[3]);
	values[4] = Int32GetDatum(attempt);
	if (attempt < 0)
		nulls[4] = 'n';
	values[5] = text_or_null(from_status >= 0 ? idempo_status_names[from_status] : NULL, &nulls[5]);
	values[6] = text_or_null(to_status >= 0 ? idempo_status_names[to_status] : NULL, &nulls[6]);
	values[7] = text_or_null(outcome >= 0 ? idempo_outcome_names[outcome] : NULL, &nulls[7]);
	values[8] = CStringGetTextDatum(action);
	values[9] = CStringGetTextDatum(GetUserNameFromId(actor, false));
	idempo_spi_execute(PLAN_EVENT_LOG, values, nulls, 0);
}

/*
 * Opens a review of an operation, with a snapshot of the row as it is now.
 * If one is already open, returns its id instead.
 */
int64
idempo_open_review(const char *scope, const char *key, const char *reason, const char *detail,
				   TimestampTz at)
{
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;

	values[0] = CStringGetTextDatum(scope);
	values[1] = CStringGetTextDatum(key);
	values[2] = CStringGetTextDatum(reason);
	values[3] = TimestampTzGetDatum(at);
	values[4] = text_or_null(detail, &nulls[4]);
	/* the snapshot: the row as it is now, as text */
	if (idempo_spi_execute(PLAN_OP_LOOKUP, values, NULL, 1) == 1)
	{
		values[5] = CStringGetTextDatum(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1));
		if (idempo_spi_execute(PLAN_REVIEW_OPEN, values, nulls, 0) == 1)
			return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}

	if (idempo_spi_execute(PLAN_REVIEW_FIND_OPEN, values, NULL, 1) == 1)
		return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	elog(ERROR, "could not open a review of operation \"%s\" in scope \"%s\": it does not exist",
		 key, scope);
	pg_unreachable();
}

/* Closes the open review of an operation, if there is one. */
void
idempo_close_review(const char *scope, const char *key, const char *reviewer,
					const char *resolution, const char *note, TimestampTz at)
{
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};

	values[0] = CStringGetTextDatum(scope);
	values[1] = CStringGetTextDatum(key);
	values[2] = TimestampTzGetDatum(at);
	values[3] = CStringGetTextDatum(reviewer);
	values[4] = CStringGetTextDatum(resolution);
	values[5] = text_or_null(note, &nulls[5]);
	idempo_spi_execute(PLAN_REVIEW_CLOSE, values, nulls, 0);
}
