/*-------------------------------------------------------------------------
 *
 * op_row.c
 *	  Reading and writing whole rows of idempo.operations through the kept
 *	  plans, column order as in OP_COLUMNS (op_row.h).
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "op_row.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

void
op_row_init(OpRow *r)
{
	memset(r, 0, sizeof(*r));
	r->lease_expires_at = DT_NOBEGIN;
	r->completed_at = DT_NOBEGIN;
	r->expires_at = DT_NOBEGIN;
	r->sweep_at = DT_NOBEGIN;
}

#define TS_OR_NOBEGIN(v, n, c) ((n)[c] ? DT_NOBEGIN : DatumGetTimestampTz((v)[c]))
#define VARLENA_OR_0(v, n, c) ((n)[c] ? (Datum) 0 : (v)[c])

/*
 * Fills *r from the columns OP_COLUMNS, in OpCol order (the inverse of
 * op_row_values()).  A column given as NULL that cannot be (status,
 * attempt, attempt_base) is a caller's mistake; run_id and params given as
 * NULL are left out (claim_batch's probe does not read them).
 */
void
op_row_from_values(const Datum *v, const bool *n, OpRow *r)
{
	op_row_init(r);
	if (!n[COL_FINGERPRINT])
	{
		bytea	   *fp = DatumGetByteaPP(v[COL_FINGERPRINT]);

		if (VARSIZE_ANY_EXHDR(fp) == IDEMPO_DIGEST_LEN)
		{
			r->has_fingerprint = true;
			memcpy(r->fingerprint, VARDATA_ANY(fp), IDEMPO_DIGEST_LEN);
		}
	}
	r->status = idempo_status_from_datum(v[COL_STATUS]);
	r->attempt = DatumGetInt32(v[COL_ATTEMPT]);
	r->run_id = VARLENA_OR_0(v, n, COL_RUN_ID);
	r->first_seen_at = TS_OR_NOBEGIN(v, n, COL_FIRST_SEEN_AT);
	r->last_attempt_at = TS_OR_NOBEGIN(v, n, COL_LAST_ATTEMPT_AT);
	r->lease_expires_at = TS_OR_NOBEGIN(v, n, COL_LEASE_EXPIRES_AT);
	r->completed_at = TS_OR_NOBEGIN(v, n, COL_COMPLETED_AT);
	r->expires_at = TS_OR_NOBEGIN(v, n, COL_EXPIRES_AT);
	r->sweep_at = TS_OR_NOBEGIN(v, n, COL_SWEEP_AT);
	r->result = n[COL_RESULT] ? NULL : DatumGetJsonbP(v[COL_RESULT]);
	r->target_ref = VARLENA_OR_0(v, n, COL_TARGET_REF);
	r->error = VARLENA_OR_0(v, n, COL_ERROR);
	r->params = n[COL_PARAMS] ? NULL : DatumGetJsonbP(v[COL_PARAMS]);
	r->attempt_base = DatumGetInt32(v[COL_ATTEMPT_BASE]);
}

/* Fills *r from a tuple whose columns OP_COLUMNS start at first_col (1-based). */
void
op_row_from_tuple(HeapTuple tuple, TupleDesc desc, int first_col, OpRow *r)
{
	Datum		v[NUM_OP_COLS];
	bool		n[NUM_OP_COLS];
	int			i;

	for (i = 0; i < NUM_OP_COLS; i++)
		v[i] = SPI_getbinval(tuple, desc, first_col + i, &n[i]);
	op_row_from_values(v, n, r);
}

/* Reads the record of (scope, key) into *r; false if there is none (or it is locked, SKIP LOCKED). */
bool
op_row_read(const char *scope, const char *key, OpRow *r, OpReadMode mode)
{
	static const IdempoPlanId plan_of_mode[] = {
		[OP_READ_PLAIN] = PLAN_OP_SELECT,
		[OP_READ_FOR_UPDATE] = PLAN_OP_SELECT_FOR_UPDATE,
		[OP_READ_SKIP_LOCKED] = PLAN_OP_SELECT_SKIP_LOCKED,
	};
	Datum		args[2];

	args[0] = CStringGetTextDatum(scope);
	args[1] = CStringGetTextDatum(key);
	if (idempo_spi_execute(plan_of_mode[mode], args, NULL, 1) == 0)
		return false;
	op_row_from_tuple(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, r);
	return true;
}

static void
set_ts(Datum *values, bool *isnull, int i, TimestampTz t)
{
	values[i] = TimestampTzGetDatum(t);
	isnull[i] = TIMESTAMP_IS_NOBEGIN(t);
}

static void
set_ptr(Datum *values, bool *isnull, int i, Datum d)
{
	values[i] = d;
	isnull[i] = (d == (Datum) 0);
}

/*
 * The row's columns as datums, in OP_COLUMNS order: what the SQL statements
 * take as parameters and what direct.c stores.  Status is the enum value.
 */
void
op_row_values(const OpRow *r, Datum *values, bool *isnull)
{
	if (r->has_fingerprint)
	{
		bytea	   *fp = palloc(VARHDRSZ + IDEMPO_DIGEST_LEN);

		SET_VARSIZE(fp, VARHDRSZ + IDEMPO_DIGEST_LEN);
		memcpy(VARDATA(fp), r->fingerprint, IDEMPO_DIGEST_LEN);
		set_ptr(values, isnull, COL_FINGERPRINT, PointerGetDatum(fp));
	}
	else
		set_ptr(values, isnull, COL_FINGERPRINT, (Datum) 0);
	values[COL_STATUS] = idempo_status_datum(r->status);
	isnull[COL_STATUS] = false;
	values[COL_ATTEMPT] = Int32GetDatum(r->attempt);
	isnull[COL_ATTEMPT] = false;
	set_ptr(values, isnull, COL_RUN_ID, r->run_id);
	set_ts(values, isnull, COL_FIRST_SEEN_AT, r->first_seen_at);
	set_ts(values, isnull, COL_LAST_ATTEMPT_AT, r->last_attempt_at);
	set_ts(values, isnull, COL_LEASE_EXPIRES_AT, r->lease_expires_at);
	set_ts(values, isnull, COL_COMPLETED_AT, r->completed_at);
	set_ts(values, isnull, COL_EXPIRES_AT, r->expires_at);
	set_ts(values, isnull, COL_SWEEP_AT, r->sweep_at);
	set_ptr(values, isnull, COL_RESULT, PointerGetDatum(r->result));
	set_ptr(values, isnull, COL_TARGET_REF, r->target_ref);
	set_ptr(values, isnull, COL_ERROR, r->error);
	set_ptr(values, isnull, COL_PARAMS, PointerGetDatum(r->params));
	values[COL_ATTEMPT_BASE] = Int32GetDatum(r->attempt_base);
	isnull[COL_ATTEMPT_BASE] = false;
}

/*
 * The parameters $1..$17 of PLAN_OP_INSERT and PLAN_OP_WRITE.  The status
 * goes as text (plans.c casts it), so that every parameter type is built in.
 */
static void
row_params(const char *scope, const char *key, const OpRow *r, Datum *values, char *nulls)
{
	bool		isnull[NUM_OP_COLS];
	int			i;

	values[0] = CStringGetTextDatum(scope);
	values[1] = CStringGetTextDatum(key);
	nulls[0] = nulls[1] = ' ';
	op_row_values(r, values + 2, isnull);
	values[2 + COL_STATUS] = CStringGetTextDatum(idempo_status_names[r->status]);
	for (i = 0; i < NUM_OP_COLS; i++)
		nulls[2 + i] = isnull[i] ? 'n' : ' ';
}

/*
 * INSERT ... ON CONFLICT DO NOTHING; true if the row was inserted.  *tid is
 * where, if known (the direct path knows; SQL does not tell us).
 */
bool
op_row_insert(const char *scope, const char *key, const OpRow *r, ItemPointer tid)
{
	Datum		values[2 + NUM_OP_COLS];
	char		nulls[2 + NUM_OP_COLS];

	ItemPointerSetInvalid(tid);
	if (unlikely(idempo_records_subscription() != NULL))
	{
		OpRow		existing;

		/*
		 * Where the records are a publisher's (replication.c), nothing is
		 * inserted: an existing key is answered as ON CONFLICT DO NOTHING
		 * would, so the claim goes on to read it; a new one is refused.
		 */
		if (op_row_read(scope, key, &existing, OP_READ_PLAIN))
			return false;
		idempo_refuse_on_subscriber(scope, key, NULL);
	}
	switch (op_direct_insert(scope, key, r, tid))
	{
		case OP_DIRECT_INSERTED:
			return true;
		case OP_DIRECT_EXISTS:
			return false;
		case OP_DIRECT_UNAVAILABLE:
			break;
	}
	row_params(scope, key, r, values, nulls);
	return idempo_spi_execute(PLAN_OP_INSERT, values, nulls, 0) == 1;
}

/* Overwrites the record of (scope, key), which the caller has locked. */
void
op_row_write(const char *scope, const char *key, const OpRow *r)
{
	Datum		values[2 + NUM_OP_COLS];
	char		nulls[2 + NUM_OP_COLS];

	row_params(scope, key, r, values, nulls);
	if (idempo_spi_execute(PLAN_OP_WRITE, values, nulls, 0) != 1)
		elog(ERROR, "operation \"%s\" in scope \"%s\" vanished while locked", key, scope);
}

static Datum
copy_varlena(Datum d)
{
	return d ? PointerGetDatum(PG_DETOAST_DATUM_COPY(d)) : (Datum) 0;
}

/* Copies the row's values out of SPI's memory into the current context. */
void
op_row_copy_out(OpRow *r)
{
	r->run_id = copy_varlena(r->run_id);
	r->result = (Jsonb *) DatumGetPointer(copy_varlena(PointerGetDatum(r->result)));
	r->target_ref = copy_varlena(r->target_ref);
	r->error = copy_varlena(r->error);
	r->params = (Jsonb *) DatumGetPointer(copy_varlena(PointerGetDatum(r->params)));
}

/*
 * The fence of every call that reports on an attempt (complete, fail,
 * verify): only the operation's current attempt may.  A superseded attempt
 * is refused, so that a late writer cannot overwrite what a newer attempt
 * did or decide for it.
 */
void
op_row_check_attempt(const char *verb, const char *scope, const char *key, int32 given,
					 int32 current)
{
	if (given < current)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot %s key \"%s\" in scope \"%s\": attempt %d was superseded by attempt %d",
						verb, key, scope, given, current),
				 errhint("A newer attempt owns the operation; a late attempt must not overwrite it.")));
	if (given != current)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cannot %s key \"%s\" in scope \"%s\": there is no attempt %d, the current one is %d",
						verb, key, scope, given, current),
				 errhint("Pass the attempt number idempo.claim() returned.")));
}

/*
 * The refusal of a call naming a key that has no record (never claimed, or
 * its finished record expired): complete, fail, heartbeat.
 */
void
op_row_refuse_missing(const char *verb, const char *scope, const char *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("cannot %s key \"%s\" in scope \"%s\": there is no such operation",
					verb, key, scope),
			 errhint("Claim the key first with idempo.claim(); a finished record may also have expired.")));
}

/*
 * The refusal of a call given attempt => NULL ("the attempt this
 * transaction acquired") in a transaction that acquired none of the key,
 * saying the real cause: a key nobody claimed has no attempt to name
 * either.  hint: how to name the attempt.
 */
void
op_row_refuse_not_acquired(const char *verb, const char *scope, const char *key,
						   const char *hint)
{
	OpRow		r;

	if (!op_row_read(scope, key, &r, OP_READ_PLAIN))
		op_row_refuse_missing(verb, scope, key);
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("cannot %s key \"%s\" in scope \"%s\": this transaction acquired no attempt of it",
					verb, key, scope),
			 errdetail("The operation is %s, at attempt %d.", idempo_status_names[r.status], r.attempt),
			 errhint("%s", hint)));
}
