/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  Every difference between the PostgreSQL majors idempo builds against
 *	  (15 to 19), in one place.
 *
 * Each difference is a macro or a small static inline named after the
 * newest API, so the rest of the code is written for PostgreSQL 19 and
 * reads that way; this is the only file that tests PG_VERSION_NUM (a
 * change that minor releases made is decided at run time where it is used:
 * durability.c).  A macro
 * that keeps the name of the function it adapts expands to that function
 * with the older argument list (a function-like macro does not expand
 * inside its own expansion), so the headers declaring those functions are
 * included first.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEMPO_COMPAT_H
#define IDEMPO_COMPAT_H

#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/tableam.h"
#include "catalog/pg_database.h"
#include "executor/executor.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/wait_event.h"

#if PG_VERSION_NUM < 150000
#error "idempo needs PostgreSQL 15 or later"
#endif

/*
 * PostgreSQL 16
 */
#if PG_VERSION_NUM < 160000

/* the ownership test of any catalog object (16: one function for all of them) */
static inline bool
object_ownercheck(Oid classid, Oid objectid, Oid roleid)
{
	if (classid != DatabaseRelationId)
		elog(ERROR, "object_ownercheck: class %u is not supported before PostgreSQL 16", classid);
	return pg_database_ownercheck(objectid, roleid);
}

/* which index entries an update needs (16: told by simple_heap_update) */
typedef enum TU_UpdateIndexes
{
	TU_None,					/* a HOT update: no new index entries */
	TU_All,						/* a new entry in every index */
	TU_Summarizing				/* only summarizing (BRIN) indexes: 16 and later */
} TU_UpdateIndexes;

/* before 16 an update is either HOT (no index entries) or needs them all */
#define simple_heap_update(relation, otid, tup, update_indexes) \
	(simple_heap_update((relation), (otid), (tup)), \
	 *(update_indexes) = HeapTupleIsHeapOnly(tup) ? TU_None : TU_All)

/* relfilenodes became relfilelocators (16) */
#define rd_firstRelfilelocatorSubid rd_firstRelfilenodeSubid

/*
 * A GUC check hook's "extra" (16: guc_malloc, in GUC's own memory context, freed with pfree;
 * before, GUC freed it with free(): malloc)
 */
static inline void *
guc_malloc(int elevel, size_t size)
{
	void	   *p = malloc(size);

	if (p == NULL)
		ereport(elevel, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	return p;
}

#endif							/* PG_VERSION_NUM < 160000 */

/*
 * PostgreSQL 17: infinite intervals ('infinity', '-infinity'), tested by
 * these macros of datatype/timestamp.h; before, every interval is finite.
 */
#if PG_VERSION_NUM < 170000
#define INTERVAL_IS_NOBEGIN(i)	((void) (i), false)
#define INTERVAL_IS_NOEND(i)	((void) (i), false)

/*
 * Named wait events of extensions (17): before, every wait of an extension
 * shows in pg_stat_activity as the one event "Extension".
 */
#define WaitEventExtensionNew(wait_event_name) ((void) (wait_event_name), (uint32) PG_WAIT_EXTENSION)
#endif

/*
 * PostgreSQL 18
 */
#if PG_VERSION_NUM < 180000

/* deferrable_ok (18): before 18 the relcache never reports a deferrable primary key */
#define RelationGetPrimaryKeyIndex(relation, deferrable_ok) \
	(AssertMacro(!(deferrable_ok)), RelationGetPrimaryKeyIndex(relation))

/* tupleid (18): the row being updated, for WITHOUT OVERLAPS constraints; NULL for an insert */
#define ExecCheckIndexConstraints(resultRelInfo, slot, estate, conflictTid, tupleid, arbiterIndexes) \
	(AssertMacro((tupleid) == NULL), \
	 ExecCheckIndexConstraints((resultRelInfo), (slot), (estate), (conflictTid), (arbiterIndexes)))

#endif							/* PG_VERSION_NUM < 180000 */

/*
 * PostgreSQL 19
 */
#if PG_VERSION_NUM < 190000

/*
 * ExecInsertIndexTuples (19): the booleans became a flags word, and the
 * arguments were reordered.  Before 16 there is no onlySummarizing: no
 * update leaves only summarizing indexes to fill.
 */
#define EIIT_IS_UPDATE			(1 << 0)
#define EIIT_NO_DUPE_ERROR		(1 << 1)
#define EIIT_ONLY_SUMMARIZING	(1 << 2)
#if PG_VERSION_NUM < 160000
#define ExecInsertIndexTuples(resultRelInfo, estate, flags, slot, arbiterIndexes, specConflict) \
	(AssertMacro(((flags) & EIIT_ONLY_SUMMARIZING) == 0), \
	 ExecInsertIndexTuples((resultRelInfo), (slot), (estate), ((flags) & EIIT_IS_UPDATE) != 0, \
						   ((flags) & EIIT_NO_DUPE_ERROR) != 0, (specConflict), (arbiterIndexes)))
#else
#define ExecInsertIndexTuples(resultRelInfo, estate, flags, slot, arbiterIndexes, specConflict) \
	ExecInsertIndexTuples((resultRelInfo), (slot), (estate), ((flags) & EIIT_IS_UPDATE) != 0, \
						  ((flags) & EIIT_NO_DUPE_ERROR) != 0, (specConflict), (arbiterIndexes), \
						  ((flags) & EIIT_ONLY_SUMMARIZING) != 0)
#endif

/*
 * index_beginscan: instrument (18: EXPLAIN ANALYZE's counters; idempo
 * passes NULL) and flags (19: scan options; idempo passes SO_NONE).
 */
#define SO_NONE 0
#if PG_VERSION_NUM < 180000
#define index_beginscan(heapRelation, indexRelation, snapshot, instrument, nkeys, norderbys, flags) \
	(AssertMacro((instrument) == NULL && (flags) == SO_NONE), \
	 index_beginscan((heapRelation), (indexRelation), (snapshot), (nkeys), (norderbys)))
#else
#define index_beginscan(heapRelation, indexRelation, snapshot, instrument, nkeys, norderbys, flags) \
	(AssertMacro((flags) == SO_NONE), \
	 index_beginscan((heapRelation), (indexRelation), (snapshot), (instrument), (nkeys), (norderbys)))
#endif

/*
 * pushJsonbValue (19): builds into a JsonbInState, whose result is set
 * when the outermost container is closed; before, it took the parse-state
 * stack and returned the value (the whole one, on that last call).
 */
typedef struct JsonbInState
{
	JsonbValue *result;
	JsonbParseState *parseState;
} JsonbInState;

static inline void
idempo_push_jsonb_value(JsonbInState *state, JsonbIteratorToken seq, JsonbValue *jbval)
{
	JsonbValue *v = pushJsonbValue(&state->parseState, seq, jbval);

	if (state->parseState == NULL)
		state->result = v;
}
#define pushJsonbValue(state, seq, jbval) idempo_push_jsonb_value((state), (seq), (jbval))

/* signal handlers (19): they get the signal's information too, and pass it on */
#define IDEMPO_SIGNAL_ARGS_PASS postgres_signal_arg

/*
 * Which of the unique indexes matching ON CONFLICT's columns it infers as
 * arbiters (infer_arbiter_indexes): before 19 only valid ones; from 19 on
 * also one that takes inserts but is not valid (being built or rebuilt
 * concurrently, or left so by a failed CREATE INDEX or REINDEX
 * CONCURRENTLY), beside a valid one.
 */
#define IDEMPO_ON_CONFLICT_INFERS(index) ((index)->indisvalid)

#else
#define IDEMPO_SIGNAL_ARGS_PASS postgres_signal_arg, pg_siginfo
#define IDEMPO_ON_CONFLICT_INFERS(index) ((index)->indisready)
#endif							/* PG_VERSION_NUM < 190000 */

#endif							/* IDEMPO_COMPAT_H */
