/*-------------------------------------------------------------------------
 *
 * direct.c
 *	  The two writes on every protected transaction's path -- the record of
 *	  a new key, and the completion of an attempt this same transaction
 *	  inserted -- done through the table and index access methods, without
 *	  SPI, planning or executor start-up.
 *
 * Through SQL these two writes cost more than everything else idempo does
 * together (see docs/benchmarks.md).  Done here they follow the same protocol
 * as the SQL they replace:
 *
 * - the insert is a speculative insertion exactly as INSERT ... ON
 *	 CONFLICT DO NOTHING performs it (nodeModifyTable.c): pre-check the
 *	 arbiter (the primary key) with a dirty snapshot, waiting for an
 *	 in-progress inserter of the same key; insert the heap tuple with a
 *	 speculative token; insert the index entries; if another backend
 *	 inserted the same key meanwhile, kill our tuple and start over.  A
 *	 conflict is reported to the caller, which then reads the record FOR
 *	 UPDATE through SQL as before.  While keys are new, the first try
 *	 skips the pre-check (optimistic insertion, below);
 * - the finish updates only a tuple whose inserting transaction is ours
 *	 and which is its latest version.  No other backend can see, lock or
 *	 update such a tuple, so no locking or EvalPlanQual is involved.  The
 *	 fence (attempt and status) is checked in C with the same rule as the
 *	 SQL statement's WHERE clause; whenever anything is not as expected the
 *	 caller falls back to the SQL statement, which decides and explains.
 *
 * Both are used only when idempo.operations is a plain heap table exactly
 * as the extension script created it: no triggers, no CHECK constraints,
 * no columns we do not know.  On Citus (the citus extension exists in the
 * database) the table is a distributed table whose rows live in shards,
 * so every write must go through SQL and this file is never used.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/multixact.h"
#include "access/stratnum.h"
#include "access/sysattr.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "op_row.h"

/* The columns of idempo.operations, by name. */
typedef enum OpAttr
{
	A_SCOPE,
	A_KEY,
	A_FINGERPRINT,
	A_STATUS,
	A_ATTEMPT,
	A_RUN_ID,
	A_FIRST_SEEN_AT,
	A_LAST_ATTEMPT_AT,
	A_LEASE_EXPIRES_AT,
	A_COMPLETED_AT,
	A_EXPIRES_AT,
	A_SWEEP_AT,
	A_RESULT,
	A_TARGET_REF,
	A_ERROR,
	A_PARAMS,
	A_ATTEMPT_BASE,
	NUM_OP_ATTRS
} OpAttr;

static const char *const op_attr_names[NUM_OP_ATTRS] = {
	"scope", "key", "fingerprint", "status", "attempt", "run_id", "first_seen_at",
	"last_attempt_at", "lease_expires_at", "completed_at", "expires_at", "sweep_at",
	"result", "target_ref", "error", "params", "attempt_base"
};

/* Their types; InvalidOid: idempo.status, whose OID differs per database. */
static const Oid op_attr_types[NUM_OP_ATTRS] = {
	TEXTOID, TEXTOID, BYTEAOID, InvalidOid, INT4OID, TEXTOID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
	JSONBOID, TEXTOID, TEXTOID, JSONBOID, INT4OID
};

/* What we know about the table; rebuilt after any relcache invalidation of it. */
static struct
{
	bool		valid;
	Oid			relid;
	bool		usable;			/* the direct path may be used */
	bool		probe_usable;	/* a local heap with the primary key on (scope, key) */
	int			natts;
	int			attidx[NUM_OP_ATTRS];	/* 0-based position in the tuple */
	Oid			pk_index;		/* the primary key, on (scope, key) */
	List	   *arbiters;		/* what ON CONFLICT (scope, key) infers: the primary key and
								 * every other valid unique index on exactly (scope, key) */
	bool		other_unique;	/* another unique or exclusion index (or one being built) */
}			layout;

static bool callback_registered = false;

static void
direct_relcache_callback(Oid relid)
{
	if (relid == InvalidOid || relid == layout.relid)
		layout.valid = false;
}

/*
 * Whether an index is one that ON CONFLICT (scope, key) infers as an
 * arbiter (infer_arbiter_indexes): unique, immediate, no predicate, no
 * expressions, on exactly the columns scope and key, and valid -- or, from
 * PostgreSQL 19 on, at least taking inserts (src/compat.h): the copy a
 * REINDEX CONCURRENTLY of the primary key builds, or left behind when it
 * failed, is then an arbiter beside the primary key, and first claims
 * racing on it are decided, not a unique violation, as through SQL.
 */
static bool
index_is_arbiter(Relation rel, Form_pg_index index, HeapTuple tuple)
{
	int			scope_att = layout.attidx[A_SCOPE] + 1;
	int			key_att = layout.attidx[A_KEY] + 1;

	if (!index->indisunique || !IDEMPO_ON_CONFLICT_INFERS(index) || !index->indimmediate ||
		index->indnkeyatts != 2 ||
		!heap_attisnull(tuple, Anum_pg_index_indpred, NULL) ||
		!heap_attisnull(tuple, Anum_pg_index_indexprs, NULL))
		return false;
	return (index->indkey.values[0] == scope_att && index->indkey.values[1] == key_att) ||
		(index->indkey.values[0] == key_att && index->indkey.values[1] == scope_att);
}

/*
 * Reads the table's indexes into the layout; false unless the primary key
 * is (scope, key), in that order (the busy probe relies on it).  The
 * arbiters of the insert are the indexes ON CONFLICT (scope, key) infers:
 * a user's extra unique index on (scope, key) is one, so that two first
 * claims racing on it are decided as through SQL, not by a unique
 * violation.  Also notes whether another index is unique or an exclusion
 * constraint: a user's on other columns, or (before PostgreSQL 19, or
 * while it takes no inserts yet) the copy REINDEX CONCURRENTLY builds of
 * the primary key.  The insertion checks such an index without
 * waiting for the arbiters' verdict, so a key that exists would raise a
 * unique violation there instead of being reported: the insert must
 * pre-check.
 */
static bool
indexes_as_expected(Relation rel)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	bool		pk_ok = false;
	MemoryContext old;

	layout.pk_index = RelationGetPrimaryKeyIndex(rel, false);
	layout.other_unique = false;
	list_free(layout.arbiters);
	layout.arbiters = NIL;
	foreach(lc, indexes)
	{
		HeapTuple	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(lfirst_oid(lc)));
		Form_pg_index index;

		if (!HeapTupleIsValid(tuple))
			continue;
		index = (Form_pg_index) GETSTRUCT(tuple);
		if (index->indexrelid == layout.pk_index)
			pk_ok = index->indnatts == 2 && index->indnkeyatts == 2 &&
				index->indkey.values[0] == layout.attidx[A_SCOPE] + 1 &&
				index->indkey.values[1] == layout.attidx[A_KEY] + 1;
		if (index_is_arbiter(rel, index, tuple))
		{
			old = MemoryContextSwitchTo(TopMemoryContext);
			layout.arbiters = lappend_oid(layout.arbiters, index->indexrelid);
			MemoryContextSwitchTo(old);
		}
		else if (index->indisunique || index->indisexclusion)
			layout.other_unique = true;
		ReleaseSysCache(tuple);
	}
	list_free(indexes);
	return pk_ok;
}

/*
 * Whether the table is as the extension created it (fills layout.attidx
 * and the indexes); sets layout.probe_usable when at least the busy probe
 * may look at it.
 */
static bool
table_is_plain(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			seen = 0;
	int			i;

	layout.probe_usable = false;
	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		rel->rd_rel->relispartition ||
		rel->rd_rel->relam != HEAP_TABLE_AM_OID)
		return false;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		int			a;

		if (att->attisdropped)
			continue;
		for (a = 0; a < NUM_OP_ATTRS; a++)
			if (strcmp(NameStr(att->attname), op_attr_names[a]) == 0)
				break;
		if (a == NUM_OP_ATTRS || att->attgenerated || att->attidentity)
			return false;		/* a column this code would not fill */
		if (att->atttypid != (OidIsValid(op_attr_types[a]) ? op_attr_types[a] :
							  idempo_catalog()->status_typid) || att->atttypmod != -1)
			return false;		/* a column of another type than the script made */
		layout.attidx[a] = i;
		seen++;
	}
	layout.natts = desc->natts;
	if (seen != NUM_OP_ATTRS || !indexes_as_expected(rel))
		return false;
	layout.probe_usable = true;
	return rel->trigdesc == NULL && !rel->rd_rel->relhasrules &&
		(desc->constr == NULL || desc->constr->num_check == 0);
}

/*
 * Opens idempo.operations for a direct write (for_write) or for the busy
 * probe; NULL if that must not be done here (the caller then runs the SQL
 * statement, or cannot tell).
 */
static Relation
open_operations(bool for_write)
{
	LOCKMODE	lockmode = for_write ? RowExclusiveLock : AccessShareLock;
	Oid			relid;
	Relation	rel;

	/* a read-only transaction (or a standby): the SQL statement refuses with 25006 */
	if (for_write && (!idempo_direct_writes || XactReadOnly))
		return NULL;
	if (!callback_registered)
	{
		idempo_catalog_watch_relcache(direct_relcache_callback);	/* catalog.c's one callback */
		callback_registered = true;
	}
	relid = idempo_catalog()->operations_relid;
	if (layout.valid && layout.relid == relid &&
		!(for_write ? layout.usable : layout.probe_usable))
		return NULL;

	rel = table_open(relid, lockmode);
	if (!layout.valid || layout.relid != relid)
	{
		bool		citus = OidIsValid(get_extension_oid("citus", true));

		layout.relid = relid;
		layout.usable = table_is_plain(rel) && !citus;
		layout.probe_usable = layout.probe_usable && !citus;
		layout.valid = true;
	}
	if (!(for_write ? layout.usable : layout.probe_usable))
	{
		table_close(rel, lockmode);
		return NULL;
	}
	return rel;
}

static void
set_ts(Datum *values, bool *isnull, OpAttr a, TimestampTz t)
{
	values[layout.attidx[a]] = TimestampTzGetDatum(t);
	isnull[layout.attidx[a]] = TIMESTAMP_IS_NOBEGIN(t);
}

static void
set_ptr(Datum *values, bool *isnull, OpAttr a, Datum d)
{
	values[layout.attidx[a]] = d;
	isnull[layout.attidx[a]] = (d == (Datum) 0);
}

/* The whole tuple of a record, in the table's column order (op_row_values() fills it). */
static void
form_values(const char *scope, const char *key, const OpRow *r, Datum *values, bool *isnull)
{
	Datum		v[NUM_OP_COLS];
	bool		n[NUM_OP_COLS];
	int			i;

	StaticAssertStmt(A_ATTEMPT_BASE - A_FINGERPRINT == COL_ATTEMPT_BASE - COL_FINGERPRINT,
					 "OpAttr lists the OpCol columns after scope and key");
	for (i = 0; i < layout.natts; i++)
	{
		values[i] = (Datum) 0;
		isnull[i] = true;		/* dropped columns stay NULL */
	}
	set_ptr(values, isnull, A_SCOPE, CStringGetTextDatum(scope));
	set_ptr(values, isnull, A_KEY, CStringGetTextDatum(key));
	op_row_values(r, v, n);
	for (i = 0; i < NUM_OP_COLS; i++)
	{
		values[layout.attidx[A_FINGERPRINT + i]] = v[i];
		isnull[layout.attidx[A_FINGERPRINT + i]] = n[i];
	}
}

/*
 * The NOT NULL check that ExecConstraints() would make: what we fill is
 * never NULL where the table says NOT NULL, but a mistake must be an error,
 * not a stored row that breaks the state machine.
 */
static void
check_not_null(TupleDesc desc, const bool *isnull)
{
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attnotnull && !att->attisdropped && isnull[i])
			elog(ERROR, "idempo: column \"%s\" of idempo.operations would be NULL",
				 NameStr(att->attname));
	}
}

/*
 * What ON CONFLICT DO NOTHING does when it finds a conflicting row
 * (ExecCheckTIDVisible): under REPEATABLE READ or SERIALIZABLE, a row that
 * the transaction's snapshot cannot see, inserted by another transaction,
 * is a serialization failure.
 */
static void
check_conflict_visible(Relation rel, EState *estate, ItemPointer conflict_tid)
{
	TupleTableSlot *existing;
	bool		isnull;
	TransactionId xmin;

	if (!IsolationUsesXactSnapshot())
		return;
	existing = table_slot_create(rel, &estate->es_tupleTable);
	if (!table_tuple_fetch_row_version(rel, conflict_tid, SnapshotAny, existing))
		elog(ERROR, "failed to fetch conflicting tuple for ON CONFLICT");
	if (table_tuple_satisfies_snapshot(rel, existing, GetActiveSnapshot()))
		return;
	xmin = DatumGetTransactionId(slot_getsysattr(existing, MinTransactionIdAttributeNumber, &isnull));
	if (!TransactionIdIsCurrentTransactionId(xmin))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update")));
}

/* An executor state just big enough for the index routines of execIndexing.c. */
static ResultRelInfo *
begin_index_work(Relation rel, EState **estate_out)
{
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rri = makeNode(ResultRelInfo);

	/*
	 * The statement's snapshot, as ExecutorStart gives every EState: from
	 * PostgreSQL 19 on, the pre-check (check_exclusion_or_unique_constraint)
	 * fetches a conflicting tuple with es_snapshot under SERIALIZABLE (for
	 * SSI's predicate lock), and a NULL one crashed the backend.
	 */
	estate->es_snapshot = GetActiveSnapshot();
	InitResultRelInfo(rri, rel, 0, NULL, 0);
	ExecOpenIndices(rri, false);
	*estate_out = estate;
	return rri;
}

/*
 * What ExecOpenIndices(..., speculative = true) adds for the pre-check
 * (ExecCheckIndexConstraints): the equality operators of the unique
 * indexes.  Built only when a pre-check is made, not on every insert: the
 * index insertion's own check does not need them.
 */
static void
prepare_precheck(ResultRelInfo *rri)
{
	int			i;

	for (i = 0; i < rri->ri_NumIndices; i++)
	{
		IndexInfo  *ii = rri->ri_IndexRelationInfo[i];

		if (ii->ii_Unique && ii->ii_UniqueOps == NULL)
			BuildSpeculativeIndexInfo(rri->ri_IndexRelationDescs[i], ii);
	}
}

static void
end_index_work(ResultRelInfo *rri, EState *estate)
{
	ExecCloseIndices(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
}

/*
 * Optimistic insertion.  ON CONFLICT looks for the key in the arbiter index
 * first (the pre-check) and then inserts; the index insertion itself
 * detects a key that appeared in between, which is what makes the protocol
 * correct.  The pre-check only saves, when the key exists, the work of a
 * tuple inserted and killed again (and the dead tuple and index entries it
 * leaves).  When keys are new -- every first delivery of a request -- it is
 * a B-tree descent per claim for nothing, the largest single cost of a
 * claim.  So while few of this backend's recent inserts found their key,
 * the first try skips the pre-check; a conflict then kills the tuple, as
 * after a race, and the retry pre-checks (waiting for an in-progress
 * inserter exactly as before).  A backend that meets existing keys, say one
 * serving a burst of redeliveries, pre-checks again after about three: the
 * burst leaves a few dead tuples, not one per replay.  The average is in
 * 1/256ths, each insert weighing 1/8.
 */
#define OPTIMISM_ONE 256
#define OPTIMISM_PRECHECK_AT (OPTIMISM_ONE / 4)
static int	existing_average = 0;

static bool
optimism_says_precheck(void)
{
	/*
	 * Also pre-check where an insertion that meets the key costs more than
	 * the wasted work: another unique index would raise a unique violation
	 * (see indexes_as_expected), and under SERIALIZABLE the insertion
	 * checks for rw-conflicts that DO NOTHING never does.
	 */
	return existing_average >= OPTIMISM_PRECHECK_AT || layout.other_unique ||
		IsolationIsSerializable();
}

static void
optimism_learn(bool existed)
{
	existing_average += ((existed ? OPTIMISM_ONE : 0) - existing_average) / 8;
}

/*
 * The insertion protocol itself, into a relation, index state and slot
 * that the caller opened (for one record, or for a batch of them).
 */
static OpDirectResult
insert_into(Relation rel, ResultRelInfo *rri, EState *estate, TupleTableSlot *slot, List *arbiters,
			const char *scope, const char *key, const OpRow *r, ItemPointer tid)
{
	OpDirectResult result;
	bool		precheck;

	ExecClearTuple(slot);
	form_values(scope, key, r, slot->tts_values, slot->tts_isnull);
	check_not_null(RelationGetDescr(rel), slot->tts_isnull);
	ExecStoreVirtualTuple(slot);

	for (precheck = optimism_says_precheck();; precheck = true)
	{
		ItemPointerData conflict_tid;
		TransactionId xid;
		uint32		token;
		bool		spec_conflict = false;
		List	   *recheck;

		/* waits for an in-progress inserter of the key, as ON CONFLICT does */
		if (precheck)
		{
			prepare_precheck(rri);
			if (!ExecCheckIndexConstraints(rri, slot, estate, &conflict_tid, NULL, arbiters))
			{
				check_conflict_visible(rel, estate, &conflict_tid);
				result = OP_DIRECT_EXISTS;
				break;
			}
		}

		xid = GetCurrentTransactionId();
		token = SpeculativeInsertionLockAcquire(xid);
		table_tuple_insert_speculative(rel, slot, GetCurrentCommandId(true), 0, NULL, token);
		recheck = ExecInsertIndexTuples(rri, estate, EIIT_NO_DUPE_ERROR, slot, arbiters, &spec_conflict);
		table_tuple_complete_speculative(rel, slot, token, !spec_conflict);
		SpeculativeInsertionLockRelease(xid);
		list_free(recheck);
		if (!spec_conflict)
		{
			*tid = slot->tts_tid;
			result = OP_DIRECT_INSERTED;
			break;
		}
		/* the key exists, or someone inserted it after our pre-check: look again */
		CHECK_FOR_INTERRUPTS();
	}
	optimism_learn(result == OP_DIRECT_EXISTS);
	return result;
}

/*
 * Inserts the record of a new key (scope, key) unless one exists.
 * Returns OP_DIRECT_INSERTED (with *tid set), OP_DIRECT_EXISTS, or
 * OP_DIRECT_UNAVAILABLE (nothing done: use the SQL statement).
 */
OpDirectResult
op_direct_insert(const char *scope, const char *key, const OpRow *r, ItemPointer tid)
{
	Relation	rel = open_operations(true);
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	List	   *arbiters;
	OpDirectResult result;

	if (rel == NULL)
		return OP_DIRECT_UNAVAILABLE;
	arbiters = list_copy(layout.arbiters);

	rri = begin_index_work(rel, &estate);
	slot = ExecInitExtraTupleSlot(estate, RelationGetDescr(rel), &TTSOpsVirtual);
	result = insert_into(rel, rri, estate, slot, arbiters, scope, key, r, tid);

	end_index_work(rri, estate);
	list_free(arbiters);
	table_close(rel, NoLock);
	return result;
}

/*
 * op_direct_insert() for many records (claim_batch): the table, its indexes
 * and the executor state opened once for all of them.  The caller may run
 * other statements between the inserts (claims of the batch's other keys):
 * it holds the table's lock, so its layout stays as read.
 */
struct OpDirectBatch
{
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot *slot;
	List	   *arbiters;
};

/* NULL where the direct path is unavailable (the caller then claims each key). */
OpDirectBatch *
op_direct_batch_begin(void)
{
	Relation	rel = open_operations(true);
	OpDirectBatch *b;
	MemoryContext old;

	if (rel == NULL)
		return NULL;
	b = palloc0(sizeof(OpDirectBatch));
	b->rel = rel;
	b->arbiters = list_copy(layout.arbiters);
	b->rri = begin_index_work(rel, &b->estate);
	b->slot = ExecInitExtraTupleSlot(b->estate, RelationGetDescr(rel), &TTSOpsVirtual);

	/*
	 * What a pre-check needs, built now in the executor state's memory: the
	 * caller's memory between two inserts may be reset.
	 */
	old = MemoryContextSwitchTo(b->estate->es_query_cxt);
	prepare_precheck(b->rri);
	MemoryContextSwitchTo(old);
	return b;
}

OpDirectResult
op_direct_batch_insert(OpDirectBatch *b, const char *scope, const char *key, const OpRow *r,
					   ItemPointer tid)
{
	return insert_into(b->rel, b->rri, b->estate, b->slot, b->arbiters, scope, key, r, tid);
}

void
op_direct_batch_end(OpDirectBatch *b)
{
	end_index_work(b->rri, b->estate);
	list_free(b->arbiters);
	table_close(b->rel, NoLock);
	pfree(b);
}

/*
 * Whether another transaction, still running, is inserting, updating or
 * deleting the record of (scope, key): what claim(wait => false) answers
 * 'busy' for (a row lock is found through SQL, see claim.c).  Looks,
 * without waiting, at the primary key with a dirty snapshot, which reports
 * a running inserter in xmin and a running updater or deleter in xmax.
 * KEY_CANNOT_TELL where the table is not a local heap with that primary
 * key (on Citus its rows live in shards).
 */
OpKeyState
op_key_in_flux(const char *scope, const char *key)
{
	Relation	rel = open_operations(false);
	Relation	index;
	SnapshotData dirty;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	OpKeyState	state = KEY_QUIET;
	int			i;

	if (rel == NULL)
		return KEY_CANNOT_TELL;
	/* wait => false must not queue behind REINDEX, ALTER INDEX ... either */
	if (!ConditionalLockRelationOid(layout.pk_index, AccessShareLock))
	{
		table_close(rel, AccessShareLock);
		return KEY_TABLE_LOCKED;
	}
	index = index_open(layout.pk_index, NoLock);
	for (i = 0; i < 2; i++)
		ScanKeyEntryInitialize(&skey[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
							   index->rd_indcollation[i], F_TEXTEQ,
							   CStringGetTextDatum(i == 0 ? scope : key));

	InitDirtySnapshot(dirty);
	slot = table_slot_create(rel, NULL);
	scan = index_beginscan(rel, index, &dirty, NULL, 2, 0, SO_NONE);
	index_rescan(scan, skey, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		if ((TransactionIdIsValid(dirty.xmin) && !TransactionIdIsCurrentTransactionId(dirty.xmin)) ||
			(TransactionIdIsValid(dirty.xmax) && !TransactionIdIsCurrentTransactionId(dirty.xmax)))
		{
			state = KEY_IN_FLUX;
			break;
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);
	table_close(rel, AccessShareLock);
	return state;
}

/*
 * Whether the version the snapshot sees may not be the record claim() would
 * decide from: another running transaction (or, for a multixact, any
 * running one, ours included) has locked it, or one that is running or has
 * committed deleted or updated it (a release; in REPEATABLE READ, after the
 * snapshot).  claim() waits for such a transaction (FOR UPDATE), answers
 * 'busy' (wait => false), or reads the record that is there now.  The
 * caller holds a pin and a share lock on the buffer.
 */
static bool
version_in_flux(HeapTupleHeader t)
{
	TransactionId xmax;

	if (t->t_infomask & HEAP_XMAX_INVALID)
		return false;
	xmax = HeapTupleHeaderGetRawXmax(t);
	if (t->t_infomask & HEAP_XMAX_IS_MULTI)
	{
		/* a lock from before pg_upgrade from 9.2: nobody holds it (heapam_visibility.c) */
		if (HEAP_LOCKED_UPGRADED(t->t_infomask))
			return false;
		if (MultiXactIdIsRunning(xmax, HEAP_XMAX_IS_LOCKED_ONLY(t->t_infomask)))
			return true;
		if (HEAP_XMAX_IS_LOCKED_ONLY(t->t_infomask))
			return false;
		xmax = HeapTupleHeaderGetUpdateXid(t);
	}
	else if (HEAP_XMAX_IS_LOCKED_ONLY(t->t_infomask))
		return !TransactionIdIsCurrentTransactionId(xmax) && TransactionIdIsInProgress(xmax);
	return TransactionIdIsValid(xmax) &&
		(TransactionIdIsCurrentTransactionId(xmax) || TransactionIdIsInProgress(xmax) ||
		 TransactionIdDidCommit(xmax));
}

/*
 * Reads the records of many keys of one scope through the primary key, as
 * "WHERE scope = $1 AND key = ANY ($2)" would, with the snapshot a
 * statement would take now (claim_batch's probe): calls found() for each,
 * with the key and the record (its run_id and params not read; pointers
 * into the tuple, valid during the call), and whether that version is
 * being changed, locked or was replaced since the snapshot (version_in_flux:
 * the record may then only be answered by claim()).  False, having read nothing,
 * where the table is not a local heap with that primary key: the caller
 * runs the SQL statement.
 */
bool
op_direct_read_many(const char *scope, ArrayType *keys,
					void (*found) (const char *key, OpRow *r, bool in_flux, void *arg), void *arg)
{
	Relation	rel = open_operations(false);
	Relation	index;
	Snapshot	snapshot;
	ScanKeyData skey[2];
	IndexScanDesc scan;
	TupleTableSlot *slot;

	if (rel == NULL)
		return false;
	index = index_open(layout.pk_index, AccessShareLock);
	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ, CStringGetTextDatum(scope));
	ScanKeyEntryInitialize(&skey[1], SK_SEARCHARRAY, 2, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[1], F_TEXTEQ, PointerGetDatum(keys));

	/* what SPI does before a statement: our own writes so far are seen */
	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	slot = table_slot_create(rel, NULL);
	scan = index_beginscan(rel, index, snapshot, NULL, 2, 0, SO_NONE);
	index_rescan(scan, skey, 2, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		OpRow		r;
		Datum	   *v;
		bool	   *n;
		Datum		cv[NUM_OP_COLS];	/* the columns OP_COLUMNS, in OpCol order */
		bool		cn[NUM_OP_COLS];
		int			i;
		bool		in_flux = true;	/* not a heap tuple in a buffer: claim() decides */

		if (TTS_IS_BUFFERTUPLE(slot))
		{
			BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;

			LockBuffer(bslot->buffer, BUFFER_LOCK_SHARE);
			in_flux = version_in_flux(bslot->base.tuple->t_data);
			LockBuffer(bslot->buffer, BUFFER_LOCK_UNLOCK);
		}
		slot_getallattrs(slot);
		v = slot->tts_values;
		n = slot->tts_isnull;
		for (i = 0; i < NUM_OP_COLS; i++)
		{
			cv[i] = v[layout.attidx[A_FINGERPRINT + i]];
			cn[i] = n[layout.attidx[A_FINGERPRINT + i]];
		}
		/* what the probe's statement does not read either (PLAN_OP_PROBE_BATCH) */
		cn[COL_RUN_ID] = cn[COL_PARAMS] = true;
		op_row_from_values(cv, cn, &r);
		found(TextDatumGetCString(v[layout.attidx[A_KEY]]), &r, in_flux, arg);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(index, AccessShareLock);
	table_close(rel, AccessShareLock);
	return true;
}

static bool
text_equals(Datum d, const char *s)
{
	text	   *t = DatumGetTextPP(d);
	size_t		len = strlen(s);

	return VARSIZE_ANY_EXHDR(t) == len && memcmp(VARDATA_ANY(t), s, len) == 0;
}

/*
 * Finishes an attempt whose record this transaction inserted at *tid; the
 * same change as plans.c's PLAN_OP_FINISH.  Returns false if the direct
 * path does not apply (nothing done: run the SQL statement); on success
 * *tid is the record's new location.
 */
bool
op_direct_finish(const OpDirectFinish *f, ItemPointer tid)
{
	Relation	rel = open_operations(true);
	TupleDesc	desc;
	HeapTupleData tuple;
	HeapTuple	old;
	HeapTuple	newtup;
	Buffer		buffer;
	Datum	   *values;
	bool	   *isnull;
	bool		mine;
	IdempoStatus status;
	bool		fence_ok;
	int			i_sweep;
	TU_UpdateIndexes update_indexes;

	if (rel == NULL)
		return false;
	/* TRUNCATE or a rewrite in this transaction: a remembered TID means nothing */
	if (rel->rd_createSubid != InvalidSubTransactionId ||
		rel->rd_firstRelfilelocatorSubid != InvalidSubTransactionId)
	{
		table_close(rel, RowExclusiveLock);
		return false;
	}
	desc = RelationGetDescr(rel);

	/* our own earlier writes must be older than this command (see heap_update) */
	CommandCounterIncrement();

	tuple.t_self = *tid;
	/* SnapshotSelf shows our own insert and hides versions we replaced */
	if (!heap_fetch(rel, SnapshotSelf, &tuple, &buffer, false))
	{
		table_close(rel, RowExclusiveLock);
		return false;
	}
	mine = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple.t_data));
	old = mine ? heap_copytuple(&tuple) : NULL;
	ReleaseBuffer(buffer);
	if (!mine)
	{
		table_close(rel, RowExclusiveLock);
		return false;
	}

	values = palloc(desc->natts * sizeof(Datum));
	isnull = palloc(desc->natts * sizeof(bool));
	heap_deform_tuple(old, desc, values, isnull);

	/* the record of this key and attempt, in a state the fence admits */
	status = idempo_status_from_datum(values[layout.attidx[A_STATUS]]);
	fence_ok = !isnull[layout.attidx[A_SCOPE]] && !isnull[layout.attidx[A_KEY]] &&
		text_equals(values[layout.attidx[A_SCOPE]], f->scope) &&
		text_equals(values[layout.attidx[A_KEY]], f->key) &&
		DatumGetInt32(values[layout.attidx[A_ATTEMPT]]) == f->attempt &&
		(status == STATUS_IN_PROGRESS || status == STATUS_UNKNOWN ||
		 status == STATUS_RETRYABLE || (f->on_commit && status == STATUS_SUCCEEDED));
	if (!fence_ok)
	{
		table_close(rel, RowExclusiveLock);
		return false;
	}

	values[layout.attidx[A_STATUS]] = idempo_status_datum(f->to);
	set_ptr(values, isnull, A_RESULT, f->result);
	set_ptr(values, isnull, A_TARGET_REF, f->target_ref);
	set_ptr(values, isnull, A_ERROR, f->error);
	set_ts(values, isnull, A_COMPLETED_AT, f->completed_at);
	set_ts(values, isnull, A_EXPIRES_AT, f->expires_at);
	set_ts(values, isnull, A_LEASE_EXPIRES_AT, DT_NOBEGIN);
	/* sweep_at = LEAST(sweep_at, expires_at): never later than the new expiry */
	i_sweep = layout.attidx[A_SWEEP_AT];
	if (!TIMESTAMP_IS_NOBEGIN(f->expires_at) &&
		(isnull[i_sweep] || f->expires_at < DatumGetTimestampTz(values[i_sweep])))
		set_ts(values, isnull, A_SWEEP_AT, f->expires_at);

	check_not_null(desc, isnull);
	/* as UPDATE does: refuse if a publication needs a replica identity the table lacks */
	CheckCmdReplicaIdentity(rel, CMD_UPDATE);
	newtup = heap_form_tuple(desc, values, isnull);
	simple_heap_update(rel, &old->t_self, newtup, &update_indexes);

	/*
	 * A HOT update needs no index entries; otherwise add them as UPDATE does:
	 * all of them, or (16 and later) only the summarizing ones if only those
	 * changed.
	 */
	if (update_indexes != TU_None)
	{
		EState	   *estate;
		ResultRelInfo *rri = begin_index_work(rel, &estate);
		TupleTableSlot *slot = ExecInitExtraTupleSlot(estate, desc, &TTSOpsHeapTuple);

		ExecStoreHeapTuple(newtup, slot, false);
		list_free(ExecInsertIndexTuples(rri, estate,
										 update_indexes == TU_Summarizing ? EIIT_ONLY_SUMMARIZING : 0,
										 slot, NIL, NULL));
		end_index_work(rri, estate);
	}

	*tid = newtup->t_self;
	table_close(rel, NoLock);
	return true;
}
