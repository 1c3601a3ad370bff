/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  idempo.claim(): decide, atomically and in the caller's transaction,
 *	  whether this caller may perform a business action.
 *
 * Protocol, for one (scope, key):
 *
 * 1. The common case, a new key, is one insertion with the semantics of
 *	  INSERT ... ON CONFLICT (scope, key) DO NOTHING (done through the access
 *	  methods by direct.c, or as that statement).  A row inserted means
 *	  'acquired'.  If another transaction inserted the key and has not ended
 *	  yet, the INSERT waits for it (the unique index does that), so a second
 *	  claim sees what the first one left behind: committed, its record;
 *	  rolled back, nothing (and this claim inserts).
 * 2. Otherwise the record is read FOR UPDATE, and decide_existing() applies
 *	  the rules of the spec in their order: expiry first (a finished record
 *	  past expires_at counts as absent, or in a scope that remembers keys is
 *	  shrunk to a remembered key, answered 'expired'; unfinished work past retention goes to
 *	  review; a lease that ran out makes the attempt 'unknown', or is
 *	  re-acquired in 'retry' scopes), then the fingerprint comparison
 *	  ('conflict', recorded durably by conflicts.c), then the status.
 * 3. wait => false must not wait for anyone, and 'busy' must mean that
 *	  another transaction holds the key.  A lock on the whole table is
 *	  refused at once (55P03, as NOWAIT does).  A record that another running
 *	  transaction is inserting, updating or deleting is seen at once in the
 *	  primary key (direct.c) and answers 'busy'.  Otherwise the same steps run
 *	  in a subtransaction with a short lock_timeout, the record is read FOR
 *	  UPDATE SKIP LOCKED; a lock wait cut short is 'busy' if the key turns
 *	  out to be held, and otherwise (an extension lock, say) tried again.
 * 4. A key this transaction acquired answers 'acquired' again.  In a
 *	  read-only transaction or on a standby, only the answers that need no
 *	  write are given (replay, expired, busy, in_review); the others are
 *	  refused with 25006, saying why the claim would write.
 * 5. An unknown outcome is handed to one caller at a time: the claim that
 *	  answers 'unknown' takes a verification lease on the record (status
 *	  stays unknown, lease_expires_at = now + the scope's lease, written in
 *	  the claim's transaction).  While it is live, other claims answer
 *	  'busy', as for a live attempt; verify(), a late complete/fail, review
 *	  or the retention running out end it, and once it has run out the next
 *	  claim answers 'unknown' and takes it in turn.  Nothing needs sweeping
 *	  when it runs out.  A caller that cannot verify (verify_unknown =>
 *	  false: an HTTP retry) answers 'unknown' without taking it and without
 *	  writing, so that a client retrying does not lock the verifier out.
 *	  With the SQL objects of 0.1.0/0.2.0 (whose check_consistency() knows
 *	  leases only on in_progress records) every claim answers 'unknown' as
 *	  before, until ALTER EXTENSION UPDATE.
 *
 * No lock outlives these statements but the row's own, so a transaction can
 * claim any number of keys.  Every time is computed here and passed as a
 * parameter.  Row locks are node-local: on Citus this stays correct because
 * every call for one key is delegated to the node that owns the key's shard.
 *
 *-------------------------------------------------------------------------
 */
#include "idempo.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "op_row.h"

PG_FUNCTION_INFO_V1(idempo_claim);

typedef struct ClaimArgs
{
	const IdempoScope *scope;
	char	   *key;
	bool		has_fingerprint;
	uint8		fingerprint[IDEMPO_DIGEST_LEN];
	Jsonb	   *params;
	Datum		run_id;			/* text, or 0 */
	bool		has_intent_at;
	TimestampTz intent_at;
	bool		wait;
	bool		complete_on_commit;
	Interval	lease;			/* the lease this claim takes: claim(..., lease) or the scope's */
	bool		verify_unknown; /* false: an unknown outcome is answered without its verification lease */
	bool		read_only;		/* a read-only transaction, a standby or a subscriber: answers only */
	TimestampTz now;
	Oid			user;
} ClaimArgs;

typedef struct ClaimAnswer
{
	IdempoOutcome outcome;
	bool		has_row;		/* status etc. below are meaningful */
	OpRow		row;
	int64		conflict_id;
	int64		review_id;
	int			from_status;	/* for the audit log; -1: there was no record */
	bool		record_conflict;
	uint8		stored_fingerprint[IDEMPO_DIGEST_LEN];
	Jsonb	   *stored_params;
} ClaimAnswer;

/* The state of a freshly acquired attempt (attempt and first_seen_at set by the caller). */
static void
row_acquire(OpRow *r, const ClaimArgs *a)
{
	const IdempoScope *s = a->scope;

	r->last_attempt_at = a->now;
	r->run_id = a->run_id;
	if (a->has_fingerprint && !r->has_fingerprint)
	{
		r->has_fingerprint = true;
		memcpy(r->fingerprint, a->fingerprint, IDEMPO_DIGEST_LEN);
	}
	if (s->store_params && a->params != NULL && r->params == NULL)
		r->params = a->params;
	r->result = NULL;
	r->target_ref = (Datum) 0;
	r->error = (Datum) 0;
	if (a->complete_on_commit)
	{
		/* other sessions first see the row at commit: as succeeded */
		r->status = STATUS_SUCCEEDED;
		r->lease_expires_at = DT_NOBEGIN;
		r->completed_at = a->now;
		r->expires_at = idempo_time_plus(a->now, &s->retention);
		r->sweep_at = r->expires_at;
	}
	else
	{
		TimestampTz review_at = op_review_at(r, s);

		r->status = STATUS_IN_PROGRESS;
		r->lease_expires_at = idempo_time_plus(a->now, &a->lease);
		r->completed_at = DT_NOBEGIN;
		r->expires_at = DT_NOBEGIN;
		r->sweep_at = Min(r->lease_expires_at, review_at);
	}
}

/* A brand-new record for this claim (attempt 1), or a stale one (attempt 0, in review). */
static void
row_new(OpRow *r, const ClaimArgs *a, bool stale)
{
	op_row_init(r);
	r->first_seen_at = a->now;
	r->attempt = stale ? 0 : 1;
	row_acquire(r, a);
	if (stale)
	{
		r->status = STATUS_IN_REVIEW;
		r->lease_expires_at = DT_NOBEGIN;
		r->completed_at = DT_NOBEGIN;
		r->expires_at = DT_NOBEGIN;
		r->sweep_at = DT_NOBEGIN;
	}
}

static bool
intent_is_stale(const ClaimArgs *a)
{
	return a->has_intent_at &&
		idempo_time_plus(a->intent_at, &a->scope->retention) < a->now;
}

/* Opens a review and puts the operation in review (the row is written by the caller). */
static void
to_review(ClaimAnswer *ans, const ClaimArgs *a, const char *reason, const char *note)
{
	ans->review_id = idempo_open_review(a->scope->name, a->key, reason, note, a->now);
	ans->row.status = STATUS_IN_REVIEW;
	ans->row.lease_expires_at = DT_NOBEGIN;
	ans->row.sweep_at = DT_NOBEGIN;
}

static char *
stale_note(const ClaimArgs *a)
{
	return psprintf("intent_at %s is older than the scope's retention; a finished record may already have been purged",
					timestamptz_to_str(a->intent_at));
}

/*
 * In a read-only transaction (and on a standby) a claim gives the answers
 * that need no write -- replay, expired, busy, in_review -- and refuses the
 * others here, before anything is written, saying why it would write.
 * 'unknown' writes: it takes the verification lease.
 */
static void
must_write(const ClaimArgs *a, const char *why)
{
	if (!a->read_only)
		return;
	/* a logical replication subscriber of idempo's records answers like this too */
	idempo_refuse_on_subscriber(a->scope->name, a->key, why);
	ereport(ERROR,
			(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
			 errmsg("cannot claim key \"%s\" in scope \"%s\" in a read-only transaction",
					a->key, a->scope->name),
			 errdetail("The claim must write: %s.", why),
			 RecoveryInProgress() ?
			 errhint("This server is a standby: claim on the primary.") :
			 errhint("Claim in a read-write transaction; a read-only one gets only the answers that need no write (replay, expired, busy, in_review).")));
}

/*
 * The verification leases this transaction took (see the file header), so
 * that its own claims of the key answer 'unknown' again and not 'busy':
 * SELECT (claim(...)).* calls claim once per column.  A lease is known by
 * the exact lease_expires_at the claim wrote; if the subtransaction that
 * took it rolled back, the record no longer shows it.  The table lives in
 * the transaction's memory: its reset callback forgets it when the
 * transaction ends, however it ends.
 */
typedef struct VerifyLeaseKey
{
	char		scope[IDEMPO_MAX_SCOPE_BYTES + 1];
	char		key[IDEMPO_MAX_KEY_BYTES + 1];
} VerifyLeaseKey;

typedef struct VerifyLease
{
	VerifyLeaseKey id;			/* hash key: zero-padded, compared whole */
	int32		attempt;
	TimestampTz until;
} VerifyLease;

static HTAB *verify_leases = NULL;

static void
verify_leases_gone(void *arg)
{
	verify_leases = NULL;
}

static void
verify_lease_key(const ClaimArgs *a, VerifyLeaseKey *id)
{
	memset(id, 0, sizeof(*id));
	strlcpy(id->scope, a->scope->name, sizeof(id->scope));
	strlcpy(id->key, a->key, sizeof(id->key));
}

static bool
verify_lease_mine(const ClaimArgs *a, const OpRow *r)
{
	VerifyLeaseKey id;
	VerifyLease *l;

	if (verify_leases == NULL)
		return false;
	verify_lease_key(a, &id);
	l = hash_search(verify_leases, &id, HASH_FIND, NULL);
	return l != NULL && l->attempt == r->attempt && l->until == r->lease_expires_at;
}

static void
verify_lease_taken(const ClaimArgs *a, const OpRow *r)
{
	VerifyLeaseKey id;
	VerifyLease *l;

	if (verify_leases == NULL)
	{
		MemoryContext cxt = AllocSetContextCreate(TopTransactionContext, "idempo verification leases",
												  ALLOCSET_SMALL_SIZES);
		MemoryContextCallback *cb = MemoryContextAlloc(cxt, sizeof(MemoryContextCallback));
		HASHCTL		ctl;

		ctl.keysize = sizeof(VerifyLeaseKey);
		ctl.entrysize = sizeof(VerifyLease);
		ctl.hcxt = cxt;
		verify_leases = hash_create("idempo verification leases", 16, &ctl,
									HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		cb->func = verify_leases_gone;
		cb->arg = NULL;
		MemoryContextRegisterResetCallback(cxt, cb);
	}
	verify_lease_key(a, &id);
	l = hash_search(verify_leases, &id, HASH_ENTER, NULL);
	l->attempt = r->attempt;
	l->until = r->lease_expires_at;
}

/*
 * An unknown record: 'busy' while another caller's verification lease is
 * live, else 'unknown', with the lease taken for this caller (*took: the
 * caller writes the record) unless it cannot verify (verify_unknown =>
 * false): then the lease stays free for a verifier and nothing is written.
 */
static IdempoOutcome
decide_unknown(const ClaimArgs *a, OpRow *r, bool *took)
{
	/* the SQL objects of 0.1.0 and 0.2.0 know no verification lease: unknown to everyone */
	if (!idempo_catalog()->scope_rules)
		return OUTCOME_UNKNOWN;
	if (!TIMESTAMP_IS_NOBEGIN(r->lease_expires_at) && r->lease_expires_at > a->now)
		return verify_lease_mine(a, r) ? OUTCOME_UNKNOWN : OUTCOME_BUSY;
	if (!a->verify_unknown)
		return OUTCOME_UNKNOWN;
	must_write(a, "its outcome is unknown, and the one caller who looks it up takes a verification lease on it");
	r->lease_expires_at = idempo_time_plus(a->now, &a->lease);
	*took = true;
	return OUTCOME_UNKNOWN;
}

/* A finished record's answer: a remembered key finished, its result is gone; it must not run again. */
static IdempoOutcome
finished_answer(const OpRow *r)
{
	return op_row_remembered(r) ? OUTCOME_EXPIRED : OUTCOME_REPLAY;
}

/*
 * The rules for an existing record (locked FOR UPDATE, or only read in a
 * read-only transaction), in the spec's order.  Writes the record if it
 * changes.
 */
static void
decide_existing(ClaimAnswer *ans, const ClaimArgs *a)
{
	const IdempoScope *s = a->scope;
	OpRow	   *r = &ans->row;
	bool		changed = false;
	bool		lease_over_retry = false;
	TimestampTz next_due;

	ans->from_status = r->status;

	/* 1. expiry */
	switch (op_expiry(r, s, a->now, &next_due))
	{
		case EXPIRY_ABSENT:
			{
				/* the key starts afresh */
				bool		stale = intent_is_stale(a);

				must_write(a, "its finished record expired, so the key starts afresh");

				row_new(r, a, stale);
				ans->from_status = -1;
				op_row_write(s->name, a->key, r);
				if (stale)
				{
					ans->review_id = idempo_open_review(s->name, a->key, "stale_retry",
														stale_note(a), a->now);
					ans->outcome = OUTCOME_STALE;
				}
				else
				{
					ans->outcome = OUTCOME_ACQUIRED;
					idempo_txn_remember(s, a->key, r->attempt, a->complete_on_commit, NULL);
				}
				return;
			}
		case EXPIRY_REMEMBER:
			/* a remembered key from now on; a read-only claim answers so and leaves it to the sweep */
			op_row_shrink(r, s);
			changed = !a->read_only;
			break;
		case EXPIRY_REVIEW:
			must_write(a, "its retention ran out unfinished, so it goes to review");
			to_review(ans, a, "retention_expired", op_retention_detail(r));
			changed = true;
			break;
		case EXPIRY_LEASE_UNKNOWN:
			must_write(a, "its lease ran out, which makes the attempt unknown");
			op_row_make_unknown(r, s);
			changed = true;
			break;
		case EXPIRY_LEASE_RETRY:
			lease_over_retry = true;
			break;
		case EXPIRY_NONE:
			break;
	}

	/* 2. the fingerprint */
	if (a->has_fingerprint && r->has_fingerprint &&
		memcmp(a->fingerprint, r->fingerprint, IDEMPO_DIGEST_LEN) != 0)
	{
		must_write(a, "the request differs from the stored one, and the conflict must be recorded");
		if (changed)
			op_row_write(s->name, a->key, r);
		ans->outcome = OUTCOME_CONFLICT;
		ans->record_conflict = true;
		memcpy(ans->stored_fingerprint, r->fingerprint, IDEMPO_DIGEST_LEN);
		ans->stored_params = r->params;
		return;
	}

	/* 3. the status */
	if (lease_over_retry || r->status == STATUS_RETRYABLE)
	{
		must_write(a, "it may be tried again, and the new attempt must be recorded");
		if (s->max_attempts > 0 && r->attempt - r->attempt_base >= s->max_attempts)
		{
			to_review(ans, a, "attempts_exhausted",
					  psprintf("%d of %d attempts used", r->attempt - r->attempt_base, s->max_attempts));
			op_row_write(s->name, a->key, r);
			ans->outcome = OUTCOME_IN_REVIEW;
			return;
		}
		r->attempt++;
		row_acquire(r, a);
		op_row_write(s->name, a->key, r);
		ans->outcome = OUTCOME_ACQUIRED;
		idempo_txn_remember(s, a->key, r->attempt, a->complete_on_commit, NULL);
		return;
	}

	if (r->status == STATUS_UNKNOWN)
	{
		bool		took = false;

		ans->outcome = decide_unknown(a, r, &took);
		if (changed || took)
			op_row_write(s->name, a->key, r);
		if (took)
			verify_lease_taken(a, r);
		return;
	}
	if (changed)
		op_row_write(s->name, a->key, r);
	switch (r->status)
	{
		case STATUS_IN_PROGRESS:
			ans->outcome = OUTCOME_BUSY;
			break;
		case STATUS_SUCCEEDED:
		case STATUS_FAILED:
			ans->outcome = finished_answer(r);
			break;
		case STATUS_IN_REVIEW:
			ans->outcome = OUTCOME_IN_REVIEW;
			break;
		case STATUS_UNKNOWN:
		case STATUS_RETRYABLE:
		case NUM_STATUSES:
			elog(ERROR, "unexpected status %d", (int) r->status);
	}
}

/*
 * The answer decide_existing() gives a record read without a lock, where
 * that answer needs no write and nothing about the key is this
 * transaction's: a finished record not due for expiry, requested with its
 * fingerprint or none, in a scope that does not refuse the request for want
 * of one.  False where claim() must decide (it may write, record a
 * conflict, refuse, or answer the key this transaction holds).  The caller
 * knows that no other transaction is changing or holding the record.
 * claim_batch answers the keys its one read finds through this.
 */
bool
idempo_claim_answer_from_read(const IdempoScope *scope, const char *key, const uint8 *fingerprint,
							  const OpRow *r, TimestampTz now, IdempoOutcome *outcome)
{
	TimestampTz next_due;
	int32		attempt;
	bool		on_commit;

	if ((scope->require_fingerprint && fingerprint == NULL) ||
		!idempo_status_finished(r->status) ||
		op_expiry(r, scope, now, &next_due) != EXPIRY_NONE ||
		idempo_txn_holds(scope->name, key, &attempt, &on_commit) ||
		(fingerprint != NULL && r->has_fingerprint &&
		 memcmp(fingerprint, r->fingerprint, IDEMPO_DIGEST_LEN) != 0))
		return false;
	*outcome = finished_answer(r);
	return true;
}

/* The claim in a read-only transaction: no lock, no write (see must_write()). */
static void
claim_read_only(ClaimAnswer *ans, const ClaimArgs *a)
{
	if (!op_row_read(a->scope->name, a->key, &ans->row, OP_READ_PLAIN))
		must_write(a, "the key has no record yet");
	ans->has_row = true;
	decide_existing(ans, a);
}

/*
 * A key that this transaction acquired and has not finished yet: the same
 * answer again, 'acquired' with the same attempt (a second claim is not
 * another worker, and SELECT (claim(...)).* calls claim once per column).
 * False if it does not apply: the usual rules decide, including a
 * conflict when the request differs.
 */
static bool
reclaim_own(ClaimAnswer *ans, const ClaimArgs *a)
{
	int32		attempt;
	bool		on_commit;
	OpRow	   *r = &ans->row;

	if (!idempo_txn_holds(a->scope->name, a->key, &attempt, &on_commit) ||
		!op_row_read(a->scope->name, a->key, r, OP_READ_PLAIN) ||
		r->attempt != attempt ||
		!(r->status == STATUS_IN_PROGRESS || (on_commit && r->status == STATUS_SUCCEEDED)) ||
		(a->has_fingerprint && r->has_fingerprint &&
		 memcmp(a->fingerprint, r->fingerprint, IDEMPO_DIGEST_LEN) != 0))
		return false;
	ans->has_row = true;
	ans->from_status = r->status;
	ans->outcome = OUTCOME_ACQUIRED;
	return true;
}

/* The claim protocol (see the file header), inside an idempo SPI session. */
static void
claim_locked(ClaimAnswer *ans, const ClaimArgs *a)
{
	int			tries;

	for (tries = 0; tries < 3; tries++)
	{
		bool		stale = intent_is_stale(a);
		ItemPointerData tid;

		/* A new key: one INSERT.  A stale intent must first prove there is no record. */
		if (!stale)
		{
			row_new(&ans->row, a, false);
			if (op_row_insert(a->scope->name, a->key, &ans->row, &tid))
			{
				ans->has_row = true;
				ans->outcome = OUTCOME_ACQUIRED;
				idempo_txn_remember(a->scope, a->key, 1, a->complete_on_commit, &tid);
				return;
			}
		}

		if (op_row_read(a->scope->name, a->key, &ans->row,
						a->wait ? OP_READ_FOR_UPDATE : OP_READ_SKIP_LOCKED))
		{
			ans->has_row = true;
			decide_existing(ans, a);
			return;
		}
		if (!a->wait && op_row_read(a->scope->name, a->key, &ans->row, OP_READ_PLAIN))
		{
			/* locked by someone else (e.g. a complete() in flight) */
			ans->has_row = true;
			ans->outcome = OUTCOME_BUSY;
			return;
		}
		if (stale)
		{
			row_new(&ans->row, a, true);
			if (op_row_insert(a->scope->name, a->key, &ans->row, &tid))
			{
				ans->has_row = true;
				ans->review_id = idempo_open_review(a->scope->name, a->key, "stale_retry",
													stale_note(a), a->now);
				ans->outcome = OUTCOME_STALE;
				return;
			}
		}
		/* the record was purged between our statements: start over */
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("could not claim key \"%s\" in scope \"%s\": the record kept changing",
					a->key, a->scope->name),
			 errhint("Retry the transaction.")));
}

/*
 * claim_locked() for wait => false: in a subtransaction, with any lock wait
 * cut short after lock_timeout.  Returns false (everything undone) if it
 * would have had to wait longer.
 */
typedef struct ClaimCall
{
	ClaimAnswer *ans;
	const ClaimArgs *a;
	const char *lock_timeout;
} ClaimCall;

static void
claim_with_lock_timeout(void *arg)
{
	ClaimCall  *call = arg;
	int			nest = NewGUCNestLevel();

	(void) set_config_option("lock_timeout", call->lock_timeout, PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_SAVE, true, 0, false);
	claim_locked(call->ans, call->a);

	/*
	 * A lock granted just as its lock_timeout fired leaves the cancel
	 * pending (ProcSleep keeps the timeout's indicator so that the cancel is
	 * reported as a lock timeout).  It must surface here, where the
	 * subtransaction turns it into a retry, and not at the caller's next
	 * CHECK_FOR_INTERRUPTS() as a raw 55P03 that nobody asked for.
	 */
	CHECK_FOR_INTERRUPTS();
	AtEOXact_GUC(true, nest);
}

/* Whether another transaction holds a lock on the key's record (read in a subtransaction undone after). */
typedef struct RowLockProbe
{
	const ClaimArgs *a;
	bool		locked;
} RowLockProbe;

static void
probe_row_lock(void *arg)
{
	RowLockProbe *p = arg;
	OpRow		r;

	p->locked = !op_row_read(p->a->scope->name, p->a->key, &r, OP_READ_SKIP_LOCKED) &&
		op_row_read(p->a->scope->name, p->a->key, &r, OP_READ_PLAIN);
}

static bool
key_row_locked_elsewhere(const ClaimArgs *a)
{
	RowLockProbe p = {a, false};

	idempo_in_undone_subxact(probe_row_lock, &p);
	return p.locked;
}

/*
 * wait => false.  'busy' must mean that another transaction holds this key:
 * it is inserting, updating or deleting the record, or has it locked.  The
 * claim runs with a short lock timeout, but a lock wait that is cut short
 * may have been for something else (the table's extension lock under
 * concurrent inserts, say); then the claim is tried again with a longer
 * timeout.  Returns false for 'busy'.
 */
static void
refuse_table_locked(const ClaimArgs *a)
{
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not claim key \"%s\" in scope \"%s\" without waiting", a->key, a->scope->name),
			 errdetail("Another session holds a lock on idempo.operations or its primary key that conflicts with claiming, such as CREATE INDEX, REINDEX, VACUUM FULL, ALTER TABLE or LOCK TABLE."),
			 errhint("Retry later, or claim with wait => true to queue behind it.")));
}

/* The dirty-snapshot look at the key (direct.c); a locked primary key is refused as a locked table. */
static OpKeyState
key_state(const ClaimArgs *a)
{
	OpKeyState	state = op_key_in_flux(a->scope->name, a->key);

	if (state == KEY_TABLE_LOCKED)
		refuse_table_locked(a);
	return state;
}

static bool
claim_without_waiting(ClaimAnswer *ans, const ClaimArgs *a)
{
	static const char *const timeouts[] = {"1ms", "10ms", "100ms", "1s"};
	int			i;

	for (i = 0; i < lengthof(timeouts); i++)
	{
		ClaimCall	call = {ans, a, timeouts[i]};

		if (key_state(a) == KEY_IN_FLUX)
			return false;
		if (idempo_try_in_subxact(claim_with_lock_timeout, &call, ERRCODE_LOCK_NOT_AVAILABLE))
			return true;
		memset(ans, 0, sizeof(*ans));
		ans->from_status = -1;
		/* where the probe cannot tell (Citus), any lock wait counts as the key's */
		if (key_state(a) != KEY_QUIET || key_row_locked_elsewhere(a))
			return false;
	}
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("could not claim key \"%s\" in scope \"%s\" without waiting", a->key, a->scope->name),
			 errdetail("Nobody holds the key, but a lock the claim needs stayed unavailable for over %s.",
					   timeouts[lengthof(timeouts) - 1]),
			 errhint("Retry the claim.")));
	return false;
}

/*
 * The columns of idempo.claim_result (natts of them: 0.2.0's has 10) for an
 * answer: outcome, the record it is about (NULL: none), the conflict and
 * review it opened (0: none).  One place for what an answer holds: claim()
 * and claim_batch (the replays its probe answers, the keys it inserts).
 */
void
idempo_claim_result_values(IdempoOutcome outcome, const OpRow *r, int64 conflict_id,
						   int64 review_id, int natts, Datum *values, bool *nulls)
{
	bool		replay = outcome == OUTCOME_REPLAY;
	bool		expired = outcome == OUTCOME_EXPIRED;

	if (natts > IDEMPO_CLAIM_RESULT_COLS)
		elog(ERROR, "idempo.claim_result has %d attributes, this library knows %d",
			 natts, IDEMPO_CLAIM_RESULT_COLS);
	memset(nulls, true, sizeof(bool) * natts);
	values[0] = idempo_outcome_datum(outcome);
	nulls[0] = false;
	if (r != NULL)
	{
		values[1] = idempo_status_datum(r->status);
		values[2] = Int32GetDatum(r->attempt);
		values[6] = TimestampTzGetDatum(r->first_seen_at);
		nulls[1] = nulls[2] = nulls[6] = false;
		if (!TIMESTAMP_IS_NOBEGIN(r->lease_expires_at))
		{
			values[7] = TimestampTzGetDatum(r->lease_expires_at);
			nulls[7] = false;
		}
		/* only a replay returns the stored answer */
		if (replay && r->result != NULL)
		{
			values[3] = PointerGetDatum(r->result);
			nulls[3] = false;
		}
		if ((replay || expired) && r->target_ref != (Datum) 0)
		{
			values[4] = r->target_ref;
			nulls[4] = false;
		}
		if (replay && r->error != (Datum) 0)
		{
			values[5] = r->error;
			nulls[5] = false;
		}
	}
	if (conflict_id != 0)
	{
		values[8] = Int64GetDatum(conflict_id);
		nulls[8] = false;
	}
	if (review_id != 0)
	{
		values[9] = Int64GetDatum(review_id);
		nulls[9] = false;
	}
	/* completed_at (0.3.0's claim_result): when a replayed or remembered action finished */
	if (natts > 10 && r != NULL && (replay || expired) &&
		!TIMESTAMP_IS_NOBEGIN(r->completed_at))
	{
		values[10] = TimestampTzGetDatum(r->completed_at);
		nulls[10] = false;
	}
}

static Datum
build_result(FunctionCallInfo fcinfo, ClaimAnswer *ans)
{
	TupleDesc	desc;
	Datum		values[IDEMPO_CLAIM_RESULT_COLS];
	bool		nulls[IDEMPO_CLAIM_RESULT_COLS];

	/* the result's descriptor, looked up once per call site */
	desc = (TupleDesc) fcinfo->flinfo->fn_extra;
	if (desc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "idempo.claim must return a composite type");
		desc = BlessTupleDesc(desc);
		fcinfo->flinfo->fn_extra = desc;
		MemoryContextSwitchTo(old);
	}
	idempo_claim_result_values(ans->outcome, ans->has_row ? &ans->row : NULL, ans->conflict_id,
							   ans->review_id, desc->natts, values, nulls);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

static bool
bool_arg(FunctionCallInfo fcinfo, int argno, const char *name, const ClaimArgs *a)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL (key \"%s\" in scope \"%s\")", name, a->key, a->scope->name),
				 errhint("Pass true or false, or leave the argument out for its default.")));
	return PG_GETARG_BOOL(argno);
}

/*
 * claim(..., lease): the lease this claim takes instead of the scope's, for
 * the attempt it acquires or the verification lease of an unknown outcome
 * (bounded as the scope's own: idempo_lease_check()).  NULL, and the SQL
 * objects of 0.1.0/0.2.0 (whose claim has no such argument): the scope's.
 */
static void
lease_arg(FunctionCallInfo fcinfo, int argno, ClaimArgs *a)
{
	a->lease = a->scope->lease;
	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return;
	a->lease = *PG_GETARG_INTERVAL_P(argno);
	idempo_lease_check(&a->lease, a->scope, a->key, "lease", "claim");
}

/*
 * Whether claims here give only the answers that need no write: a read-only
 * transaction, a standby, or a subscriber of the publisher's records.
 */
bool
idempo_claim_read_only(void)
{
	return XactReadOnly || idempo_records_subscription() != NULL;
}

/*
 * The lock on idempo.operations that a claim's write takes anyway, taken
 * before the scope is read, as idempo_scope_get_for_write() does and for
 * the reason it gives: a claim that read the scope before an alter_scope()
 * of how keys are stored (hash_keys), fingerprinted or scheduled never
 * writes after it.  claim() and claim_batch() (before it reads the scope
 * for its keys' stored form and fingerprints) take it here; a read-only
 * claim writes nothing and takes none.  wait => false must not queue
 * behind a lock on the whole table either (CREATE INDEX, VACUUM FULL, ALTER
 * TABLE, LOCK TABLE, alter_scope): that is not 'busy' (nobody holds the
 * key), so false is returned and the claim refuses, as NOWAIT does, once
 * its arguments are checked.
 */
bool
idempo_claim_lock(bool wait)
{
	if (wait)
	{
		LockRelationOid(idempo_catalog()->operations_relid, RowExclusiveLock);
		return true;
	}
	return ConditionalLockRelationOid(idempo_catalog()->operations_relid, RowExclusiveLock);
}

/*
 * idempo.claim(scope, key, params, fingerprint, run_id, intent_at, wait,
 *				complete_on_commit, lease, verify_unknown) RETURNS idempo.claim_result
 */
Datum
idempo_claim(PG_FUNCTION_ARGS)
{
	char	   *scope_name = idempo_scope_arg(fcinfo, 0);
	MemoryContext callcxt = CurrentMemoryContext;
	IdempoSpiSession session;
	ClaimArgs	a;
	ClaimAnswer ans;
	bool		table_locked = false;
	Jsonb	   *conflict_stored = NULL;
	Jsonb	   *conflict_incoming = NULL;
	Datum		result;

	memset(&a, 0, sizeof(a));
	memset(&ans, 0, sizeof(ans));
	ans.from_status = -1;
	a.params = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	a.run_id = PG_ARGISNULL(4) ? (Datum) 0 : PointerGetDatum(PG_GETARG_TEXT_PP(4));
	if (!PG_ARGISNULL(5))
	{
		a.has_intent_at = true;
		a.intent_at = PG_GETARG_TIMESTAMPTZ(5);
	}

	idempo_spi_begin(&session);
	a.user = session.save_userid;
	a.read_only = idempo_claim_read_only();
	if (!a.read_only)
		table_locked = !idempo_claim_lock(PG_ARGISNULL(6) || PG_GETARG_BOOL(6));
	a.scope = idempo_scope_get(scope_name);
	/* the key outlives the SPI session: conflicts.c records it after idempo_spi_end() */
	a.key = MemoryContextStrdup(callcxt, idempo_key_arg(fcinfo, 1, a.scope));
	idempo_scope_check_use(a.scope, a.key, a.user);
	a.wait = bool_arg(fcinfo, 6, "wait", &a);
	a.complete_on_commit = bool_arg(fcinfo, 7, "complete_on_commit", &a);
	lease_arg(fcinfo, 8, &a);
	/* the SQL objects of 0.1.0/0.2.0 have no verify_unknown: every claim verifies */
	a.verify_unknown = PG_NARGS() <= 9 || bool_arg(fcinfo, 9, "verify_unknown", &a);

	/*
	 * A run id passed by position lands in fingerprint; but fingerprint may
	 * have been passed by name on purpose, and the call does not tell us
	 * which.  Say what the argument is, and mention a run id only when it
	 * is not a digest.
	 */
	if (a.params != NULL && !PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("claim of key \"%s\" in scope \"%s\" gives both params and fingerprint",
						a.key, a.scope->name),
				 errdetail("The fingerprint argument (the 4th) is %s.",
						   idempo_bytea_arg_text(PG_GETARG_BYTEA_PP(3))),
				 VARSIZE_ANY_EXHDR(PG_GETARG_BYTEA_PP(3)) == IDEMPO_DIGEST_LEN ?
				 errhint("Pass params (idempo computes the fingerprint) or a fingerprint you computed, not both.") :
				 errhint("Pass params (idempo computes the fingerprint) or a fingerprint you computed, not both. A run id given as the 4th argument by position lands in fingerprint: pass it by name, run_id => ...")));
	if (!PG_ARGISNULL(3))
	{
		bytea	   *fp = PG_GETARG_BYTEA_PP(3);
		size_t		len = VARSIZE_ANY_EXHDR(fp);

		if (len != IDEMPO_DIGEST_LEN)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg_plural("fingerprint for key \"%s\" in scope \"%s\" is %zu byte long, not %d",
								   "fingerprint for key \"%s\" in scope \"%s\" is %zu bytes long, not %d",
								   len, a.key, a.scope->name, len, IDEMPO_DIGEST_LEN),
					 errdetail("The fingerprint argument (the 4th) is %s.", idempo_bytea_arg_text(fp)),
					 errhint("A fingerprint is a SHA-256 digest, e.g. idempo.fingerprint(params) or sha256(...). A run id given as the 4th argument by position lands in fingerprint: pass it by name, run_id => ...")));
		memcpy(a.fingerprint, VARDATA_ANY(fp), IDEMPO_DIGEST_LEN);
		a.has_fingerprint = true;
	}
	else if (a.params != NULL)
	{
		idempo_claim_fingerprint(a.scope, a.params, a.fingerprint);
		a.has_fingerprint = true;
	}
	if (a.scope->require_fingerprint && !a.has_fingerprint)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("scope \"%s\" requires a fingerprint, and the claim of key \"%s\" has none",
						a.scope->name, a.key),
				 errhint("Pass params => the request's business parameters as jsonb.")));

	a.now = idempo_now();
	if (reclaim_own(&ans, &a))
		;
	else if (a.read_only)
		claim_read_only(&ans, &a);
	else if (a.wait)
		claim_locked(&ans, &a);
	else
	{
		if (table_locked)
			refuse_table_locked(&a);
		if (!claim_without_waiting(&ans, &a))
		{
			/* another transaction is working on the key right now */
			memset(&ans, 0, sizeof(ans));
			ans.from_status = -1;
			ans.outcome = OUTCOME_BUSY;
			ans.has_row = op_row_read(a.scope->name, a.key, &ans.row, OP_READ_PLAIN);
		}
	}

	/* the audit log is a table: a read-only transaction answers without it */
	if (a.scope->audit && !a.read_only)
		idempo_log_event(a.scope, a.key, a.run_id ? TextDatumGetCString(a.run_id) : NULL,
						 ans.has_row ? ans.row.attempt : -1, ans.from_status,
						 ans.has_row ? (int) ans.row.status : -1, ans.outcome, "claim",
						 a.now ? a.now : idempo_now(), a.user);

	/*
	 * The answer outlives SPI: build it in the caller's memory.  So does what
	 * the conflict recorder needs, taken from the scope now: the scope is
	 * valid only until idempo_spi_end().
	 */
	{
		MemoryContext spicxt = MemoryContextSwitchTo(callcxt);

		op_row_copy_out(&ans.row);
		if (ans.stored_params)
			ans.stored_params = (Jsonb *) PG_DETOAST_DATUM_COPY(PointerGetDatum(ans.stored_params));
		if (ans.record_conflict)
		{
			/* the fields the fingerprint does not count are no part of what differs: left out of both */
			conflict_stored = a.scope->store_params && ans.stored_params ?
				idempo_fingerprint_view(ans.stored_params, idempo_scope_include(a.scope),
										idempo_scope_ignore(a.scope)) : NULL;
			conflict_incoming = a.scope->store_params && a.params ?
				idempo_fingerprint_view(a.params, idempo_scope_include(a.scope),
										idempo_scope_ignore(a.scope)) : NULL;
		}
		MemoryContextSwitchTo(spicxt);
	}
	idempo_spi_end(&session);
	a.scope = NULL;

	if (ans.record_conflict)
	{
		IdempoConflict c;

		c.scope = scope_name;
		c.key = a.key;
		c.stored_fingerprint = ans.stored_fingerprint;
		c.incoming_fingerprint = a.fingerprint;
		c.stored_params = conflict_stored;
		c.incoming_params = conflict_incoming;
		c.run_id = a.run_id ? TextDatumGetCString(a.run_id) : NULL;
		c.detected_at = a.now;
		ans.conflict_id = idempo_record_conflict(&c);
	}

	idempo_count(COUNTER_CLAIMS + ans.outcome, 1);
	result = build_result(fcinfo, &ans);
	PG_RETURN_DATUM(result);
}

/*
 * The record of a new key exactly as a claim acquires it (row_new(), attempt
 * 1), for claim_batch's inserts of the keys its probe found new
 * (claim_batch.c): one place decides what an acquired record holds.
 * fingerprint: NULL if the claim has none.
 */
void
idempo_claim_new_record(OpRow *r, const IdempoScope *scope, TimestampTz now, Datum run_id,
						const uint8 *fingerprint, Jsonb *params, bool complete_on_commit)
{
	ClaimArgs	a;

	memset(&a, 0, sizeof(a));
	a.scope = scope;
	a.lease = scope->lease;		/* a batch takes the scope's lease */
	a.now = now;
	a.run_id = run_id;
	if (fingerprint != NULL)
	{
		a.has_fingerprint = true;
		memcpy(a.fingerprint, fingerprint, IDEMPO_DIGEST_LEN);
	}
	a.params = params;
	a.wait = true;
	a.complete_on_commit = complete_on_commit;
	a.verify_unknown = true;
	row_new(r, &a, false);
}

/*
 * The fingerprint a claim computes from params: only the fields the scope
 * includes, without those it ignores (fingerprint_include.c).  claim_batch
 * computes its keys' fingerprints here too, so that the records it inserts
 * and the replays it answers agree with claim().
 */
void
idempo_claim_fingerprint(const IdempoScope *scope, Jsonb *params, uint8 *digest_out)
{
	idempo_fingerprint_jsonb(idempo_fingerprint_view(params, idempo_scope_include(scope),
													 idempo_scope_ignore(scope)),
							 digest_out);
}
