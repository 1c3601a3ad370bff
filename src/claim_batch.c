/*-------------------------------------------------------------------------
 *
 * claim_batch.c
 *	  idempo.claim_batch(), complete_batch() and fail_batch(): many keys of
 *	  one scope in one call, with one answer per element.
 *
 * Every element is decided by the single claim itself (claim.c, called
 * here through its fmgr entry point), so each one has every guarantee a
 * claim has: replays, conflicts recorded durably, busy, stale, the
 * verification lease, hash_keys, fingerprint_ignore, allowed_role,
 * read-only refusals.  What the batch adds:
 *
 * - Order.  The elements are processed in a canonical order, by the key as
 *	 stored (after hash_keys), then by position; the answers are returned in
 *	 input order.  Two batches of overlapping keys take the keys' locks (the
 *	 uncommitted insertion, or the row lock of a read FOR UPDATE) in the same
 *	 order whatever their input order, so they wait for each other but never
 *	 deadlock.  complete_batch and fail_batch go in the same order.
 * - Duplicates.  A key that occurs again in the same batch (the same stored
 *	 key) must not tell a second element to do the work.  Its later
 *	 occurrences carry duplicate_of, the position of the first, and each is
 *	 decided by claim() as a single claim of it later in the same
 *	 transaction would be: against the stored request, so a different
 *	 request is a 'conflict' (recorded) and a missing one is refused where
 *	 the scope requires a fingerprint.  Then 'acquired' and 'unknown' -- the
 *	 answers that hand out the work -- become 'busy' where an earlier
 *	 occurrence of the key was handed it.
 * - Scope.  A batch that may write takes claim()'s lock on
 *	 idempo.operations (idempo_claim_lock()) before it reads the scope for
 *	 its keys' stored form (hash_keys), so that an alter_scope() it waited
 *	 for applies to every element, as to a claim.
 * - Waiting.  wait applies to each element as to a single claim: with
 *	 wait => false a key held elsewhere answers 'busy' and the others go
 *	 on; with wait => true the batch waits for another transaction's
 *	 uncommitted claim of a key, as a claim does.
 * - Replays in one probe.  Before any element is claimed, one statement
 *	 reads the records of all the batch's keys (through the primary key, no
 *	 lock).  An element whose record is finished, not due for expiry, not
 *	 being changed or locked by another running transaction (a release: claim()
 *	 would wait for it), and requested with the same fingerprint (or none),
 *	 is answered 'replay' (or 'expired', a remembered key) from that read,
 *	 by claim()'s own rule (idempo_claim_answer_from_read()):
 *	 that answer writes nothing, and a read-only claim gives it from the same
 *	 plain read.  Everything else -- new keys, unfinished records, expiry
 *	 due, a differing fingerprint, a key this transaction acquired -- goes
 *	 through claim() as above.  Not in audit scopes (each claim writes an
 *	 event there), nor on Citus (each key's call goes to its node).
 * - Limits.  At most IDEMPO_BATCH_MAX elements; NULL keys, arrays of other
 *	 lengths than keys and arrays of more than one dimension are refused
 *	 before anything is claimed.  An element's error (a blank key, a
 *	 read-only refusal) fails the whole statement, as the claim does,
 *	 with a context line naming its position (not the key: in hash_keys
 *	 scopes the clear key must not reach the log).
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/htup_details.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "access/xact.h"
#include "funcapi.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/catcache.h"
#include "utils/datum.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "storage/lmgr.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"
#include "utils/typcache.h"

#include "citus.h"
#include "op_row.h"

PG_FUNCTION_INFO_V1(idempo_claim_batch);
PG_FUNCTION_INFO_V1(idempo_complete_batch);
PG_FUNCTION_INFO_V1(idempo_fail_batch);

#define IDEMPO_BATCH_MAX	10000

/* claim_result's columns that the duplicate rule reads */
#define CR_OUTCOME	0
#define CR_MAX		IDEMPO_CLAIM_RESULT_COLS	/* the columns of claim_result (claim.c) */

/* An element's answer: the columns of claim_result, in the batch's memory. */
typedef struct BatchAnswer
{
	Datum		values[CR_MAX];
	bool		nulls[CR_MAX];
} BatchAnswer;

/* An answer from these columns, its by-reference values copied into the current memory. */
static BatchAnswer *
answer_copy(TupleDesc cr, const Datum *values, const bool *nulls)
{
	BatchAnswer *a = palloc(sizeof(BatchAnswer));
	int			i;

	if (cr->natts > CR_MAX)
		elog(ERROR, "idempo.claim_result has %d attributes, this library knows %d", cr->natts, CR_MAX);
	for (i = 0; i < cr->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(cr, i);

		a->nulls[i] = nulls[i];
		if (nulls[i])
			a->values[i] = (Datum) 0;
		else if (att->attlen == -1)
			a->values[i] = PointerGetDatum(PG_DETOAST_DATUM_COPY(values[i]));	/* never a TOAST pointer */
		else
			a->values[i] = datumCopy(values[i], att->attbyval, att->attlen);
	}
	return a;
}

/* One element of a batch. */
typedef struct BatchElem
{
	int			pos;			/* 0-based position in the input */
	char	   *stored;			/* the key as stored: the order and the duplicate test */
	int			first;			/* 0-based position of the first occurrence; -1: this is it */
	bool		found;			/* the probe found its record */
	bool		has_fingerprint;
	uint8		fingerprint[IDEMPO_DIGEST_LEN];
} BatchElem;

/* A 1-D array argument taken apart; n == 0 and values NULL for a NULL argument. */
typedef struct BatchArray
{
	int			n;
	Datum	   *values;
	bool	   *nulls;
} BatchArray;

/* What a batch function keeps across calls: the single function it applies. */
typedef struct BatchFn
{
	FmgrInfo	single;
	TupleDesc	result_desc;	/* claim_batch: of idempo.claim_result */
} BatchFn;


/* The error context: which element was being decided. */
typedef struct BatchContext
{
	const char *fn;
	int			pos;			/* 0-based; -1: none yet */
} BatchContext;

static void
batch_error_context(void *arg)
{
	BatchContext *c = arg;

	if (c->pos >= 0)
		errcontext("%s, element at position %d", c->fn, c->pos + 1);
}

/*
 * The C function idempo.<name> of this database whose symbol is prosrc,
 * looked up once per call site.  Found by its symbol and not its argument
 * types: where several exist (a new trailing parameter), the one with the
 * most arguments, whose extra arguments are passed as NULL (their default).
 */
static FmgrInfo *
batch_single(FunctionCallInfo fcinfo, const char *name, const char *prosrc)
{
	BatchFn    *fn = (BatchFn *) fcinfo->flinfo->fn_extra;
	CatCList   *list;
	Oid			found = InvalidOid;
	int			nargs = -1;
	int			i;

	if (fn != NULL)
		return &fn->single;

	list = SearchSysCacheList1(PROCNAMEARGSNSP, CStringGetDatum(name));
	for (i = 0; i < list->n_members; i++)
	{
		HeapTuple	tup = &list->members[i]->tuple;
		Form_pg_proc proc = (Form_pg_proc) GETSTRUCT(tup);
		Datum		src;
		bool		isnull;

		if (proc->pronamespace != idempo_catalog()->namespace_oid || proc->prolang != ClanguageId)
			continue;
		src = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_prosrc, &isnull);
		if (isnull || strcmp(TextDatumGetCString(src), prosrc) != 0)
			continue;
		if (proc->pronargs > nargs)
		{
			nargs = proc->pronargs;
			found = proc->oid;
		}
	}
	ReleaseSysCacheList(list);
	if (!OidIsValid(found))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("function idempo.%s of the idempo extension was not found", name),
				 errhint("Update the extension: ALTER EXTENSION idempo UPDATE.")));

	fn = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(BatchFn));
	fmgr_info_cxt(found, &fn->single, fcinfo->flinfo->fn_mcxt);
	if (strcmp(name, "claim") == 0)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);
		TupleDesc	desc;

		if (get_func_result_type(found, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "idempo.claim must return a composite type");
		fn->result_desc = BlessTupleDesc(CreateTupleDescCopy(desc));
		MemoryContextSwitchTo(old);
	}
	fcinfo->flinfo->fn_extra = fn;
	return &fn->single;
}

/* Takes apart a 1-D array argument; n is its number of elements. */
static BatchArray
batch_array(FunctionCallInfo fcinfo, int argno, const char *fn, const char *argname, Oid elemtype)
{
	BatchArray	arr = {0, NULL, NULL};
	ArrayType  *a;
	int16		typlen;
	bool		typbyval;
	char		typalign;

	if (PG_ARGISNULL(argno))
		return arr;
	a = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(a) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s: %s has %d dimensions, a batch is one-dimensional", fn, argname, ARR_NDIM(a)),
				 errhint("Pass one array element per message, e.g. ARRAY['k1', 'k2'].")));
	arr.n = ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a));
	if (arr.n > IDEMPO_BATCH_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s: %s has %d elements, the limit is %d", fn, argname, arr.n, IDEMPO_BATCH_MAX),
				 errhint("Split the batch into calls of at most %d keys (each call is one transaction's worth of locks).",
						 IDEMPO_BATCH_MAX)));
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(a, elemtype, typlen, typbyval, typalign, &arr.values, &arr.nulls, &arr.n);
	return arr;
}

/* An optional array argument must have one element per key. */
static void
batch_same_length(const BatchArray *arr, int n, const char *fn, const char *argname)
{
	if (arr->values != NULL && arr->n != n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg_plural("%s: %s has %d element and keys has %d",
							   "%s: %s has %d elements and keys has %d",
							   arr->n, fn, argname, arr->n, n),
				 errhint("Pass one %s element per key, in the same order (NULL for none), or leave the argument out.",
						 argname)));
}

/* NULL keys are refused before anything is done, naming the position. */
static void
batch_no_null_keys(const BatchArray *keys, const char *fn, const char *scope)
{
	int			i;

	for (i = 0; i < keys->n; i++)
		if (keys->nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s: the key at position %d is NULL (scope \"%s\")", fn, i + 1, scope),
					 errhint("Pass the stable identity of the business action for every element, e.g. 'order-1001/shipment-1'.")));
}

/* The canonical order: by stored key (bytewise), then by position. */
static int
elem_cmp(const void *a, const void *b)
{
	const BatchElem *x = *(const BatchElem *const *) a;
	const BatchElem *y = *(const BatchElem *const *) b;
	int			c = strcmp(x->stored, y->stored);

	if (c != 0)
		return c;
	return (x->pos > y->pos) - (x->pos < y->pos);
}

/* The order's comparison by stored key only (bsearch). */
static int
elem_cmp_key(const void *a, const void *b)
{
	const BatchElem *x = *(const BatchElem *const *) a;
	const BatchElem *y = *(const BatchElem *const *) b;

	return strcmp(x->stored, y->stored);
}

/*
 * The elements in canonical order, with their stored keys and duplicates
 * marked.  Runs in an SPI session of its own: the scope is valid only
 * inside it.  A batch that writes reads it here after taking the claim's
 * lock (idempo_claim_lock()), so that the stored keys are those of the
 * scope its inserts and claims see.
 */
static BatchElem **
batch_order(const char *scope_name, const BatchArray *keys, BatchElem **elems_out,
			BatchContext *ctx)
{
	IdempoSpiSession session;
	const IdempoScope *scope;
	BatchElem  *elems = palloc0(sizeof(BatchElem) * Max(keys->n, 1));
	BatchElem **order = palloc(sizeof(BatchElem *) * Max(keys->n, 1));
	MemoryContext callcxt = CurrentMemoryContext;
	LOCAL_FCINFO(keyarg, 1);
	int			i;

	idempo_spi_begin(&session);
	scope = idempo_scope_get(scope_name);

	/*
	 * Each key checked (blank, too long) and in its stored form, by the
	 * claim's own function, before anything is claimed: the inserts of new
	 * keys do not go through the claim.
	 */
	InitFunctionCallInfoData(*keyarg, NULL, 1, InvalidOid, NULL, NULL);
	for (i = 0; i < keys->n; i++)
	{
		BatchElem  *e = &elems[i];

		ctx->pos = i;
		keyarg->args[0].value = keys->values[i];
		keyarg->args[0].isnull = false;
		e->pos = i;
		e->first = -1;
		e->stored = MemoryContextStrdup(callcxt, idempo_key_arg(keyarg, 0, scope));
		order[i] = e;
	}
	ctx->pos = -1;
	if (keys->n > 1)
		qsort(order, keys->n, sizeof(BatchElem *), elem_cmp);

	for (i = 1; i < keys->n; i++)
	{
		BatchElem  *prev = order[i - 1];
		BatchElem  *e = order[i];

		if (strcmp(prev->stored, e->stored) != 0)
			continue;
		e->first = prev->first >= 0 ? prev->first : prev->pos;
	}
	idempo_spi_end(&session);
	*elems_out = elems;
	return order;
}

/* What batch_probe() reads, for probe_record(). */
typedef struct ProbeState
{
	const IdempoScope *scope;
	const BatchArray *keys;
	const BatchArray *params;
	BatchElem **order;
	int			from;
	TupleDesc	result_desc;
	BatchAnswer **answers;
	MemoryContext callcxt;
	TimestampTz now;
} ProbeState;

/* One record the probe found: a replay answered here, or the element marked found. */
static void
probe_record(const char *stored, OpRow *rp, bool in_flux, void *arg)
{
	ProbeState *st = arg;
	const IdempoScope *scope = st->scope;
	BatchElem	probe_key;
	BatchElem  *probe_ptr = &probe_key;
	BatchElem **found;
	BatchElem  *e;
	OpRow		r = *rp;
	IdempoOutcome outcome;
	Datum		values[CR_MAX];
	bool		nulls[CR_MAX];
	uint8		fingerprint[IDEMPO_DIGEST_LEN];
	bool		has_params;

	/* the first occurrence of the key: the first in order with that stored key */
	probe_key.stored = (char *) stored;
	probe_key.pos = -1;
	found = bsearch(&probe_ptr, st->order + st->from, st->keys->n - st->from, sizeof(BatchElem *),
					elem_cmp_key);
	if (found == NULL)
		return;
	while (found > st->order + st->from && strcmp((*(found - 1))->stored, stored) == 0)
		found--;
	e = *found;
	if (e->first >= 0)
		return;					/* its first occurrence came before order[from]: decided */

	e->found = true;

	/*
	 * Not a version another running transaction is deleting (a release),
	 * updating or has locked, which claim() waits for (or is 'busy' for) and
	 * decides after.  Otherwise the claim's own answer without a write, if
	 * it has one (claim.c); else claim() decides.
	 */
	if (in_flux)
		return;
	has_params = st->params->values != NULL && !st->params->nulls[e->pos];
	if (has_params)
		idempo_claim_fingerprint(scope, DatumGetJsonbP(st->params->values[e->pos]), fingerprint);
	if (!idempo_claim_answer_from_read(scope, stored, has_params ? fingerprint : NULL, &r, st->now,
									   &outcome))
		return;
	idempo_claim_result_values(outcome, &r, 0, 0, st->result_desc->natts, values, nulls);
	{
		MemoryContext old = MemoryContextSwitchTo(st->callcxt);

		st->answers[e->pos] = answer_copy(st->result_desc, values, nulls);
		MemoryContextSwitchTo(old);
	}
	idempo_count(COUNTER_CLAIMS + outcome, 1);
}

/*
 * The replays of the batch, from one read of its records (see the file
 * header): answers[pos] is set for the elements answered here; the others
 * are left to claim().  Runs in an SPI session of its own.
 */
static bool
batch_probe(const char *scope_name, const BatchArray *keys, const BatchArray *params,
			BatchElem *elems, BatchElem **order, TupleDesc result_desc,
			BatchAnswer **answers, BatchContext *ctx, bool may_insert, IdempoScope *scope_out,
			int from, bool read_rows)
{
	IdempoSpiSession session;
	const IdempoScope *scope;
	MemoryContext callcxt = CurrentMemoryContext;
	Datum	   *distinct;
	int			ndistinct = 0;
	Datum		args[2];
	ProbeState	st;
	uint64		row;
	int			i;

	if (idempo_citus_distributed())
		return false;
	idempo_spi_begin(&session);
	scope = idempo_scope_get(scope_name);
	if (scope->audit)
	{
		idempo_spi_end(&session);
		return false;
	}

	/*
	 * A disabled scope, allowed_role: refused as claim() refuses them, for
	 * the first element it would claim (every element has the scope).
	 */
	ctx->pos = order[0]->pos;
	idempo_scope_check_use(scope, order[0]->stored, session.save_userid);
	ctx->pos = -1;

	/* what the inserts need of the scope, past this session: its values only */
	idempo_scope_values(scope, scope_out);

	/* the stored keys from order[from] on, each once, in order */
	distinct = palloc(sizeof(Datum) * keys->n);
	for (i = from; i < keys->n && read_rows; i++)
		if (order[i]->first < 0)
			distinct[ndistinct++] = CStringGetTextDatum(order[i]->stored);

	args[0] = CStringGetTextDatum(scope->name);
	args[1] = PointerGetDatum(construct_array(distinct, ndistinct, TEXTOID, -1, false, TYPALIGN_INT));

	st.scope = scope;
	st.keys = keys;
	st.params = params;
	st.order = order;
	st.from = from;
	st.result_desc = result_desc;
	st.answers = answers;
	st.callcxt = callcxt;
	st.now = idempo_now();
	if (ndistinct > 0 &&
		!op_direct_read_many(scope->name, DatumGetArrayTypeP(args[1]), probe_record, &st))
	{
		/* not through the index here (Citus, a table not as created): the statement */
		idempo_spi_execute(PLAN_OP_PROBE_BATCH, args, NULL, 0);
		for (row = 0; row < SPI_processed; row++)
		{
			HeapTuple	tuple = SPI_tuptable->vals[row];
			bool		isnull;
			OpRow		r;

			op_row_from_tuple(tuple, SPI_tuptable->tupdesc, 2, &r);
			/* whether another transaction is changing it is not told here: claim() decides */
			probe_record(TextDatumGetCString(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1, &isnull)),
						 &r, true, &st);
		}
	}

	/* the fingerprints of the new keys' records, as claim() computes them */
	for (i = from; i < keys->n && may_insert; i++)
	{
		BatchElem  *e = order[i];

		if (e->first < 0 && !e->found && !e->has_fingerprint &&
			params->values != NULL && !params->nulls[e->pos])
		{
			idempo_claim_fingerprint(scope, DatumGetJsonbP(params->values[e->pos]), e->fingerprint);
			e->has_fingerprint = true;
		}
	}
	idempo_spi_end(&session);
	return true;
}

/*
 * The answer of claim() for a record it inserted (its build_result() for
 * 'acquired'), in the current memory.
 */
static BatchAnswer *
acquired_answer(const OpRow *r, TupleDesc result_desc)
{
	Datum		values[CR_MAX];
	bool		nulls[CR_MAX];

	idempo_claim_result_values(OUTCOME_ACQUIRED, r, 0, 0, result_desc->natts, values, nulls);
	return answer_copy(result_desc, values, nulls);
}

/*
 * Optimism, as for single claims (direct.c): while the keys of the scope's
 * recent batches in this backend were new, the probe is skipped and each new
 * key's insertion finds an existing one by itself; the insertion then
 * leaves a killed tuple and claim() decides.  After BATCH_EXISTING_SWITCH
 * such keys in one batch the probe reads the rest, so a batch of replays
 * that follows new ones kills a few tuples, not one per key.  The average
 * fraction of existing keys, in 1/256ths, each batch weighing 1/4.
 */
#define BATCH_OPTIMISM_ONE 256
#define BATCH_PROBE_AT (BATCH_OPTIMISM_ONE / 8)
#define BATCH_EXISTING_SWITCH 4

/*
 * Per scope: a scope is one flow, whose mix of new and redelivered keys is
 * its own (a backend may serve a topic of first deliveries and a replay of
 * old ones).  The last few scopes are kept; one not kept starts by probing.
 */
typedef struct BatchOptimism
{
	char		scope[IDEMPO_MAX_SCOPE_BYTES + 1];
	int			existing_average;
} BatchOptimism;

static BatchOptimism batch_optimism[8];
static int	batch_optimism_next = 0;

static int *
batch_existing_average(const char *scope)
{
	BatchOptimism *o;
	int			i;

	for (i = 0; i < lengthof(batch_optimism); i++)
		if (strcmp(batch_optimism[i].scope, scope) == 0)
			return &batch_optimism[i].existing_average;
	o = &batch_optimism[batch_optimism_next];
	batch_optimism_next = (batch_optimism_next + 1) % lengthof(batch_optimism);
	strlcpy(o->scope, scope, sizeof(o->scope));
	o->existing_average = BATCH_OPTIMISM_ONE;	/* start by probing */
	return &o->existing_average;
}

static void
batch_optimism_learn(const char *scope, int existing, int total)
{
	int		   *average = batch_existing_average(scope);

	if (total > 0)
		*average += (existing * BATCH_OPTIMISM_ONE / total - *average) / 4;
}

/* Whether an answer hands the work to its caller. */
static bool
outcome_hands_out_work(Datum outcome)
{
	return DatumGetObjectId(outcome) == DatumGetObjectId(idempo_outcome_datum(OUTCOME_ACQUIRED)) ||
		DatumGetObjectId(outcome) == DatumGetObjectId(idempo_outcome_datum(OUTCOME_UNKNOWN));
}

/* Calls the single function with these arguments (the others NULL: their defaults). */
static Datum
batch_call(FmgrInfo *single, int nargs, const Datum *values, const bool *nulls, bool *isnull)
{
	LOCAL_FCINFO(call, FUNC_MAX_ARGS);
	Datum		d;
	int			i;

	InitFunctionCallInfoData(*call, single, single->fn_nargs, InvalidOid, NULL, NULL);
	for (i = 0; i < single->fn_nargs; i++)
	{
		call->args[i].value = i < nargs ? values[i] : (Datum) 0;
		call->args[i].isnull = i < nargs ? nulls[i] : true;
	}
	d = FunctionCallInvoke(call);
	*isnull = call->isnull;
	return d;
}

/*
 * idempo.claim_batch(scope, keys, params, run_id, intent_at, wait,
 *					  complete_on_commit)
 *	 RETURNS TABLE (position, key, duplicate_of, <the columns of claim_result>)
 */
Datum
idempo_claim_batch(PG_FUNCTION_ARGS)
{
	static const char fn[] = "claim_batch";
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	FmgrInfo   *single = batch_single(fcinfo, "claim", "idempo_claim");
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext callcxt = CurrentMemoryContext;
	MemoryContext elemcxt;
	BatchArray	keys = batch_array(fcinfo, 1, fn, "keys", TEXTOID);
	BatchArray	params = batch_array(fcinfo, 2, fn, "params", JSONBOID);
	BatchArray	intents = batch_array(fcinfo, 4, fn, "intent_at", TIMESTAMPTZOID);
	BatchElem  *elems;
	BatchElem **order;
	BatchAnswer **answers;
	bool	   *handed_out;		/* by first occurrence: an element was handed the work */
	BatchContext ctx = {fn, -1};
	ErrorContextCallback errcb;
	TupleDesc	outdesc;
	TupleDesc	cr;				/* of idempo.claim_result: the answers */
	IdempoScope scope_copy;
	OpDirectBatch *inserts = NULL;
	bool		read_only;
	bool		table_locked;
	bool		may_insert;
	bool		probed;
	bool		rows_read;		/* the probe read the records (not skipped: see batch_optimism_learn) */
	int			existing = 0;	/* first occurrences whose record existed (probe or insert) */
	int			i;

	batch_same_length(&params, keys.n, fn, "params");
	batch_same_length(&intents, keys.n, fn, "intent_at");
	batch_no_null_keys(&keys, fn, scope_name);
	if (PG_ARGISNULL(5) || PG_ARGISNULL(6))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s: %s must not be NULL (scope \"%s\")", fn,
						PG_ARGISNULL(5) ? "wait" : "complete_on_commit", scope_name),
				 errhint("Pass true or false, or leave the argument out for its default.")));

	InitMaterializedSRF(fcinfo, 0);
	outdesc = rsinfo->setDesc;
	if (keys.n == 0)
		return (Datum) 0;

	errcb.callback = batch_error_context;
	errcb.arg = &ctx;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;

	/*
	 * The claim's lock, before the scope is read for the keys' stored form:
	 * for the reason idempo_claim_lock() gives, the batch's inserts, the
	 * probe's answers and the keys' order come from the scope every
	 * element's claim() sees.  Where wait => false cannot take it at once,
	 * nothing is answered from the probe: each element's claim() refuses as
	 * a single claim does.
	 */
	read_only = idempo_claim_read_only();
	table_locked = !read_only && !idempo_claim_lock(PG_GETARG_BOOL(5));
	order = batch_order(scope_name, &keys, &elems, &ctx);
	answers = palloc0(sizeof(BatchAnswer *) * keys.n);
	handed_out = palloc0(sizeof(bool) * keys.n);
	elemcxt = AllocSetContextCreate(callcxt, "idempo claim_batch element", ALLOCSET_DEFAULT_SIZES);

	cr = ((BatchFn *) fcinfo->flinfo->fn_extra)->result_desc;

	/*
	 * New keys are inserted here, through one open table, where the claim
	 * would insert them without anything else to decide: a read-write
	 * transaction, wait => true, no intent_at (stale), not the records of
	 * a publisher.  Anything else about them -- an insert that finds the
	 * key after all -- goes to claim().
	 */
	may_insert = !read_only && PG_GETARG_BOOL(5);
	rows_read = !may_insert || *batch_existing_average(scope_name) >= BATCH_PROBE_AT;
	probed = !table_locked &&
		batch_probe(scope_name, &keys, &params, elems, order, cr, answers, &ctx,
					may_insert, &scope_copy, 0, rows_read);
	may_insert = may_insert && probed;

	for (i = 0; i < keys.n; i++)
	{
		BatchElem  *e = order[i];
		BatchElem  *first = e->first >= 0 ? &elems[e->first] : NULL;
		Datum		args[10];
		bool		argnulls[10];
		bool		isnull;
		Datum		answer;
		MemoryContext old;

		ctx.pos = e->pos;
		if (answers[e->pos] != NULL)
			continue;			/* a replay, answered by the probe */
		if (may_insert && first == NULL && !e->found &&
			(intents.values == NULL || intents.nulls[e->pos]) &&
			(e->has_fingerprint || !scope_copy.require_fingerprint))
		{
			OpRow		r;
			ItemPointerData tid;

			if (inserts == NULL)
				inserts = op_direct_batch_begin();
			if (inserts == NULL)
				may_insert = false;	/* direct writes off, or a table not as created: claim() */
			else
			{
				old = MemoryContextSwitchTo(elemcxt);
				idempo_claim_new_record(&r, &scope_copy, idempo_now(), PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3),
										e->has_fingerprint ? e->fingerprint : NULL,
										params.values && !params.nulls[e->pos] ?
										DatumGetJsonbP(params.values[e->pos]) : NULL,
										PG_GETARG_BOOL(6));
				if (op_direct_batch_insert(inserts, scope_copy.name, e->stored, &r, &tid) == OP_DIRECT_INSERTED)
				{
					idempo_txn_remember(&scope_copy, e->stored, 1, PG_GETARG_BOOL(6), &tid);
					idempo_count(COUNTER_CLAIMS + OUTCOME_ACQUIRED, 1);
					MemoryContextSwitchTo(callcxt);
					answers[e->pos] = acquired_answer(&r, cr);
				}
				MemoryContextSwitchTo(old);
				MemoryContextReset(elemcxt);
				if (answers[e->pos] != NULL)
					continue;
				/* the key exists after all (not read, or a concurrent claim): claim() decides */
				existing++;
				if (!rows_read && existing >= BATCH_EXISTING_SWITCH)
				{
					/* not a batch of new keys after all: read the rest first */
					rows_read = true;
					(void) batch_probe(scope_name, &keys, &params, elems, order, cr, answers, &ctx,
									   may_insert, &scope_copy, i + 1, true);
				}
			}
		}

		/*
		 * Everything else, a later occurrence of a key included, is decided
		 * by claim() itself, as a single claim of the element in this
		 * transaction would be: against the stored request, with the
		 * claim's own refusals.
		 */
		args[0] = PG_GETARG_DATUM(0);
		argnulls[0] = false;
		args[1] = keys.values[e->pos];
		argnulls[1] = false;
		args[2] = params.values ? params.values[e->pos] : (Datum) 0;
		argnulls[2] = params.values ? params.nulls[e->pos] : true;
		args[3] = (Datum) 0;	/* fingerprint */
		argnulls[3] = true;
		args[4] = PG_GETARG_DATUM(3);	/* run_id */
		argnulls[4] = PG_ARGISNULL(3);
		args[5] = intents.values ? intents.values[e->pos] : (Datum) 0;
		argnulls[5] = intents.values ? intents.nulls[e->pos] : true;
		args[6] = PG_GETARG_DATUM(5);	/* wait */
		argnulls[6] = false;
		args[7] = PG_GETARG_DATUM(6);	/* complete_on_commit */
		argnulls[7] = false;
		args[8] = (Datum) 0;	/* lease: the scope's */
		argnulls[8] = true;
		args[9] = BoolGetDatum(true);	/* verify_unknown: a batch's claim takes the verification lease */
		argnulls[9] = false;

		old = MemoryContextSwitchTo(elemcxt);
		answer = batch_call(single, lengthof(args), args, argnulls, &isnull);
		if (isnull)
			elog(ERROR, "idempo.claim returned NULL");
		{
			HeapTupleHeader th = DatumGetHeapTupleHeader(answer);
			HeapTupleData tuple;
			Datum		values[CR_MAX];
			bool		nulls[CR_MAX];

			if (cr->natts > CR_MAX)
				elog(ERROR, "idempo.claim_result has %d attributes, this library knows %d", cr->natts, CR_MAX);
			tuple.t_len = HeapTupleHeaderGetDatumLength(th);
			ItemPointerSetInvalid(&tuple.t_self);
			tuple.t_tableOid = InvalidOid;
			tuple.t_data = th;
			heap_deform_tuple(&tuple, cr, values, nulls);
			/* copied into the batch's memory; the element's own is freed */
			MemoryContextSwitchTo(callcxt);
			answers[e->pos] = answer_copy(cr, values, nulls);
		}
		MemoryContextSwitchTo(old);
		MemoryContextReset(elemcxt);
	}
	if (inserts != NULL)
		op_direct_batch_end(inserts);
	error_context_stack = errcb.previous;
	if (may_insert)
	{
		int			firsts = 0;

		/* the keys that existed: found by the probe, or by an insertion */
		for (i = 0; i < keys.n; i++)
		{
			firsts += elems[i].first < 0;
			existing += elems[i].first < 0 && elems[i].found;
		}
		batch_optimism_learn(scope_name, existing, firsts);
	}

	/* in input order */
	for (i = 0; i < keys.n; i++)
	{
		BatchElem  *e = &elems[i];
		Datum		values[3 + CR_MAX];
		bool		nulls[3 + CR_MAX];
		int			first_pos = e->first;

		if (cr->natts + 3 != outdesc->natts || cr->natts > CR_MAX)
			elog(ERROR, "idempo.claim_batch returns %d columns, idempo.claim_result has %d",
				 outdesc->natts, cr->natts);
		memcpy(values + 3, answers[i]->values, sizeof(Datum) * cr->natts);
		memcpy(nulls + 3, answers[i]->nulls, sizeof(bool) * cr->natts);

		values[0] = Int32GetDatum(i + 1);
		nulls[0] = false;
		values[1] = keys.values[i];
		nulls[1] = false;
		values[2] = Int32GetDatum(first_pos + 1);
		nulls[2] = first_pos < 0;

		/*
		 * The work goes to one element: a later occurrence answers 'busy'
		 * where an earlier one was handed it (see the file header).
		 */
		if (outcome_hands_out_work(values[3 + CR_OUTCOME]))
		{
			int			group = first_pos >= 0 ? first_pos : i;

			if (handed_out[group])
				values[3 + CR_OUTCOME] = idempo_outcome_datum(OUTCOME_BUSY);
			handed_out[group] = true;
		}
		tuplestore_putvalues(rsinfo->setResult, outdesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * complete_batch and fail_batch: the single finish applied to each element
 * in the canonical order.  A key given twice is refused: the second finish
 * of one attempt could only be refused itself.
 */
typedef struct FinishBatch
{
	const char *fn;
	const char *single_name;
	const char *single_prosrc;
	int			extra_argno[2];	/* the batch's array arguments after attempts, per element */
	Oid			extra_type[2];
	const char *extra_name[2];
	int			scalar_argno;	/* a scalar argument passed to every element, or -1 */
} FinishBatch;

static Datum
finish_batch(FunctionCallInfo fcinfo, const FinishBatch *fb)
{
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	FmgrInfo   *single = batch_single(fcinfo, fb->single_name, fb->single_prosrc);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	BatchArray	keys = batch_array(fcinfo, 1, fb->fn, "keys", TEXTOID);
	BatchArray	attempts = batch_array(fcinfo, 2, fb->fn, "attempts", INT4OID);
	BatchArray	extra[2];
	BatchArray	none = {0, NULL, NULL};
	BatchElem  *elems;
	BatchElem **order;
	Datum	   *statuses;
	BatchContext ctx = {fb->fn, -1};
	ErrorContextCallback errcb;
	MemoryContext elemcxt;
	int			i;

	extra[0] = batch_array(fcinfo, fb->extra_argno[0], fb->fn, fb->extra_name[0], fb->extra_type[0]);
	extra[1] = fb->extra_argno[1] >= 0 ?
		batch_array(fcinfo, fb->extra_argno[1], fb->fn, fb->extra_name[1], fb->extra_type[1]) : none;
	batch_same_length(&attempts, keys.n, fb->fn, "attempts");
	batch_same_length(&extra[0], keys.n, fb->fn, fb->extra_name[0]);
	if (fb->extra_argno[1] >= 0)
		batch_same_length(&extra[1], keys.n, fb->fn, fb->extra_name[1]);
	batch_no_null_keys(&keys, fb->fn, scope_name);

	InitMaterializedSRF(fcinfo, 0);
	if (keys.n == 0)
		return (Datum) 0;

	errcb.callback = batch_error_context;
	errcb.arg = &ctx;
	errcb.previous = error_context_stack;
	error_context_stack = &errcb;
	order = batch_order(scope_name, &keys, &elems, &ctx);
	for (i = 0; i < keys.n; i++)
		if (order[i]->first >= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s: the key at position %d is the key at position %d again (scope \"%s\")",
							fb->fn, order[i]->pos + 1, order[i]->first + 1, scope_name),
					 errhint("Finish each attempt once: leave out the elements claim_batch answered with duplicate_of.")));

	statuses = palloc0(sizeof(Datum) * keys.n);
	elemcxt = AllocSetContextCreate(CurrentMemoryContext, "idempo finish batch element",
									ALLOCSET_DEFAULT_SIZES);
	for (i = 0; i < keys.n; i++)
	{
		BatchElem  *e = order[i];
		Datum		args[5];
		bool		argnulls[5];
		bool		isnull;
		int			j;
		MemoryContext old;

		ctx.pos = e->pos;
		args[0] = PG_GETARG_DATUM(0);
		argnulls[0] = false;
		args[1] = keys.values[e->pos];
		argnulls[1] = false;
		args[2] = attempts.values ? attempts.values[e->pos] : (Datum) 0;
		argnulls[2] = attempts.values ? attempts.nulls[e->pos] : true;
		for (j = 0; j < 2; j++)
		{
			args[3 + j] = extra[j].values ? extra[j].values[e->pos] : (Datum) 0;
			argnulls[3 + j] = extra[j].values ? extra[j].nulls[e->pos] : true;
		}
		if (fb->scalar_argno >= 0)
		{
			args[4] = PG_GETARG_DATUM(fb->scalar_argno);
			argnulls[4] = PG_ARGISNULL(fb->scalar_argno);
		}
		old = MemoryContextSwitchTo(elemcxt);
		/* idempo.status is an enum: passed by value */
		statuses[e->pos] = batch_call(single, lengthof(args), args, argnulls, &isnull);
		MemoryContextSwitchTo(old);
		if (isnull)
			elog(ERROR, "idempo.%s returned NULL", fb->single_name);
		MemoryContextReset(elemcxt);
	}
	error_context_stack = errcb.previous;

	for (i = 0; i < keys.n; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, false};

		values[0] = Int32GetDatum(i + 1);
		values[1] = keys.values[i];
		values[2] = statuses[i];
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * idempo.complete_batch(scope, keys, attempts, results, target_refs)
 *	 RETURNS TABLE (position, key, status)
 */
Datum
idempo_complete_batch(PG_FUNCTION_ARGS)
{
	static const FinishBatch fb = {
		"complete_batch", "complete", "idempo_complete",
		{3, 4}, {JSONBOID, TEXTOID}, {"results", "target_refs"}, -1
	};

	return finish_batch(fcinfo, &fb);
}

/*
 * idempo.fail_batch(scope, keys, attempts, errors, retryable)
 *	 RETURNS TABLE (position, key, status)
 */
Datum
idempo_fail_batch(PG_FUNCTION_ARGS)
{
	static const FinishBatch fb = {
		"fail_batch", "fail", "idempo_fail",
		{3, -1}, {TEXTOID, InvalidOid}, {"errors", NULL}, 4
	};

	return finish_batch(fcinfo, &fb);
}
