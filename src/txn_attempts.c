/*-------------------------------------------------------------------------
 *
 * txn_attempts.c
 *	  The attempts this transaction acquired, so that complete() and fail()
 *	  with attempt => NULL know which attempt they finish.
 *
 * A claim that answers 'acquired' remembers (scope, key) -> attempt here.
 * The memory lives in TopTransactionContext and is forgotten at the end of
 * the transaction; a rolled-back subtransaction forgets what it acquired,
 * because its claim did not happen either, and what an enclosing one had
 * acquired of the same key is remembered again.  Before the commit, an
 * acquisition in a scope with durability 'replicated' has durability.c
 * check that the commit waits for a synchronous standby.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

typedef struct TxnAttempt
{
	struct TxnAttempt *next;	/* others with the same hash */
	SubTransactionId subid;
	int32		attempt;
	bool		on_commit;
	bool		replicated;		/* its scope has durability 'replicated' */
	ItemPointerData tid;		/* where the record is, if this transaction wrote it directly */
	SubTransactionId tid_subid;	/* the subtransaction that wrote it there */
	SubTransactionId finished_subid;	/* the one that completed or failed it, or 0 */
	struct TxnAttempt *outer;	/* what an enclosing subtransaction had remembered, if any */
	char	   *scope;
	char	   *key;
} TxnAttempt;

typedef struct TxnAttemptBucket
{
	uint64		hash;			/* hash key */
	TxnAttempt *first;
} TxnAttemptBucket;

static HTAB *txn_attempts = NULL;

static uint64
scope_key_hash(const char *scope, const char *key)
{
	uint64		h = hash_bytes_extended((const unsigned char *) scope, strlen(scope), 0);

	return hash_bytes_extended((const unsigned char *) key, strlen(key), h);
}

static TxnAttempt *
find(const char *scope, const char *key, TxnAttemptBucket **bucket_out, bool create)
{
	uint64		h = scope_key_hash(scope, key);
	TxnAttemptBucket *bucket;
	TxnAttempt *a;
	bool		found;

	if (txn_attempts == NULL)
	{
		HASHCTL		ctl;

		if (!create)
			return NULL;
		ctl.keysize = sizeof(uint64);
		ctl.entrysize = sizeof(TxnAttemptBucket);
		ctl.hcxt = TopTransactionContext;
		txn_attempts = hash_create("idempo attempts of this transaction", 16, &ctl,
								   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	bucket = hash_search(txn_attempts, &h, create ? HASH_ENTER : HASH_FIND, &found);
	if (bucket == NULL)
		return NULL;
	if (!found)
		bucket->first = NULL;
	if (bucket_out)
		*bucket_out = bucket;
	for (a = bucket->first; a != NULL; a = a->next)
		if (strcmp(a->scope, scope) == 0 && strcmp(a->key, key) == 0)
			return a;
	return NULL;
}

void
idempo_txn_remember(const IdempoScope *scope, const char *key, int32 attempt, bool on_commit,
					ItemPointer tid)
{
	TxnAttemptBucket *bucket = NULL;
	TxnAttempt *a = find(scope->name, key, &bucket, true);

	if (a == NULL)
	{
		a = MemoryContextAlloc(TopTransactionContext, sizeof(TxnAttempt));
		a->scope = MemoryContextStrdup(TopTransactionContext, scope->name);
		a->key = MemoryContextStrdup(TopTransactionContext, key);
		a->outer = NULL;
		a->next = bucket->first;
		bucket->first = a;
	}
	else if (a->subid != GetCurrentSubTransactionId())
	{
		/* an enclosing subtransaction's attempt: keep it for a rollback of this one */
		TxnAttempt *saved = MemoryContextAlloc(TopTransactionContext, sizeof(TxnAttempt));

		*saved = *a;
		a->outer = saved;
	}
	a->subid = GetCurrentSubTransactionId();
	a->attempt = attempt;
	a->on_commit = on_commit;
	a->replicated = scope->replicated;
	if (tid != NULL)
		a->tid = *tid;
	else
		ItemPointerSetInvalid(&a->tid);
	a->tid_subid = a->subid;
	a->finished_subid = InvalidSubTransactionId;
}

bool
idempo_txn_lookup(const char *scope, const char *key, int32 *attempt, bool *on_commit,
				  ItemPointer tid)
{
	TxnAttempt *a = find(scope, key, NULL, false);

	if (a == NULL)
		return false;
	*attempt = a->attempt;
	*on_commit = a->on_commit;
	if (tid != NULL)
		*tid = a->tid;
	return true;
}

/*
 * Whether this transaction acquired an attempt of (scope, key) that it has
 * not completed or failed yet: a claim of it again answers the same.
 */
bool
idempo_txn_holds(const char *scope, const char *key, int32 *attempt, bool *on_commit)
{
	TxnAttempt *a = find(scope, key, NULL, false);

	if (a == NULL || a->finished_subid != InvalidSubTransactionId)
		return false;
	*attempt = a->attempt;
	*on_commit = a->on_commit;
	return true;
}

/* The attempt this transaction acquired was completed or failed (until a rollback of that). */
void
idempo_txn_finished(const char *scope, const char *key, int32 attempt)
{
	TxnAttempt *a = find(scope, key, NULL, false);

	if (a != NULL && a->attempt == attempt && a->finished_subid == InvalidSubTransactionId)
		a->finished_subid = GetCurrentSubTransactionId();
}

/*
 * The record of an attempt this transaction acquired moved to *tid.  A
 * location written by a subtransaction is forgotten if it rolls back: the
 * record is then where it was before, which the SQL path finds.
 */
void
idempo_txn_moved(const char *scope, const char *key, ItemPointer tid)
{
	TxnAttempt *a = find(scope, key, NULL, false);

	if (a == NULL)
		return;
	a->tid = *tid;
	a->tid_subid = GetCurrentSubTransactionId();
}

/* Before the commit: the first acquisition in a 'replicated' scope is checked (durability.c). */
static void
check_replicated_acquisitions(void)
{
	HASH_SEQ_STATUS seq;
	TxnAttemptBucket *bucket;
	TxnAttempt *a;

	if (txn_attempts == NULL)
		return;
	hash_seq_init(&seq, txn_attempts);
	while ((bucket = hash_seq_search(&seq)) != NULL)
		for (a = bucket->first; a != NULL; a = a->next)
			if (a->replicated)
			{
				hash_seq_term(&seq);
				idempo_durability_check_commit(a->scope, a->key);
				return;
			}
}

static void
txn_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			check_replicated_acquisitions();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* the memory goes with TopTransactionContext */
			txn_attempts = NULL;
			break;
		default:
			break;
	}
}

/* Subtransaction end: forget what an aborted one acquired, hand the rest up. */
static void
subtxn_callback(SubXactEvent event, SubTransactionId mySubid, SubTransactionId parentSubid,
				void *arg)
{
	HASH_SEQ_STATUS seq;
	TxnAttemptBucket *bucket;

	if (txn_attempts == NULL ||
		(event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB))
		return;

	hash_seq_init(&seq, txn_attempts);
	while ((bucket = hash_seq_search(&seq)) != NULL)
	{
		TxnAttempt **link = &bucket->first;

		while (*link != NULL)
		{
			TxnAttempt *a = *link;

			if (a->subid == mySubid)
			{
				if (event == SUBXACT_EVENT_ABORT_SUB)
				{
					if (a->outer == NULL)
					{
						*link = a->next;
						continue;
					}
					/* back to what the enclosing subtransaction had acquired */
					a->outer->next = a->next;
					*link = a->outer;
					a = a->outer;
				}
				else
				{
					a->subid = parentSubid;
					/* the parent's own earlier attempt is now replaced for good */
					if (a->outer != NULL && a->outer->subid == parentSubid)
						a->outer = a->outer->outer;
				}
			}
			if (a->tid_subid == mySubid)
			{
				if (event == SUBXACT_EVENT_ABORT_SUB)
					ItemPointerSetInvalid(&a->tid);
				a->tid_subid = parentSubid;
			}
			if (a->finished_subid == mySubid)
				a->finished_subid = event == SUBXACT_EVENT_ABORT_SUB ?
					InvalidSubTransactionId : parentSubid;
			link = &a->next;
		}
	}
}

void
idempo_txn_register_callbacks(void)
{
	RegisterXactCallback(txn_callback, NULL);
	RegisterSubXactCallback(subtxn_callback, NULL);
}
