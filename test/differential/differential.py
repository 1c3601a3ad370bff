#!/usr/bin/env python3
"""The differential test: one random sequence of calls, several places that decide claims.

idempo's claim decision is restated in two more places: claim_batch (src/claim_batch.c,
managed/sql/batch.sql) and the whole managed edition (managed/). This program generates random,
seeded, reproducible sequences of calls and runs each one, step by step, against up to four
databases ("targets"), comparing every answer and, after every step, every stored row:

  c-batch   the C edition, with claim_batch, complete_batch and fail_batch as they are;
  c-single  the C edition, with each batch call replaced by its REFERENCE: the elements claimed
            one by one with claim() in the same transaction, in the order the batch documents
            (by stored key, bytewise, then position), their answers given in input order, then
            the batch's own rule: a later occurrence of a key that would be handed work an
            earlier occurrence of the same key already got answers busy (duplicate_of names the
            first occurrence).  Every later occurrence is claimed too, as docs/reference.md
            says: against the stored request, as a single claim of it in the same transaction;
  m-batch, m-single   the same two on the managed edition (managed/, installed with the plain
            script in a cluster without the C library).

Pairs compared: c-batch/c-single and m-batch/m-single (a batch against its reference), c-single/
m-single and c-batch/m-batch (the editions).  A difference stops the run: the seed, the step and
every target's answer are printed, the sequence is shrunk (delta debugging) to a short one that
still shows a difference between the same two targets, and that one is printed as SQL to paste.

Sequences: scopes created and altered with random options (hash_keys, require_fingerprint,
fingerprint_ignore/include, store_params, audit, retention, lease, verify_settle, remember,
on_lease_expiry, max_attempts, durability), claims of keys from a small pool (so that they
repeat) with random params (NULL, near-equal documents, JSON null...), fingerprint, run_id,
intent_at, wait, complete_on_commit, lease and verify_unknown; batches with repeated keys and mixed params;
complete, fail (retryable or not), complete_batch, fail_batch, heartbeat, verify, resolve,
request_review, release, lookup, resolve_conflict, sweep, check_consistency; scope changes
(alter_scope, disable_scope, enable_scope); moves of idempo's clock (idempo.clock_offset);
transactions (read committed, repeatable read, serializable, read only) committed or rolled
back, savepoints; odd keys and scope names (whitespace, 'v', E'\\x0b', long, unicode); and
"episodes" with a second session (the holder) that claims keys, changes a scope or finishes
records in an open transaction while the main session claims with wait => true or false; the
holder commits or rolls back once the main session's statement is blocked (seen in
pg_blocking_pids) or done (never a sleep).

Errors are answers: their SQLSTATE is compared, not their text (the managed edition adds
PL/pgSQL's CONTEXT lines).  NOTICEs and WARNINGs are compared by severity and SQLSTATE.

NORMALISATIONS, each with why it cannot hide a real difference:
  - Times are compared with a tolerance of TOLERANCE seconds.  idempo's clock is the wall clock
    plus idempo.clock_offset in both editions; the targets run each step one after the other,
    within well under a second, so the same step's times differ by that much.  Every duration
    this program uses (retention, lease, verify_settle, remember, clock moves, intent_at ages)
    is a whole number of minutes, so a time computed from another instant or another duration
    is off by at least 60 s - TOLERANCE.  What the tolerance cannot tell apart: two instants of
    the same clock setting (no clock move between them), which both editions take from the
    same wall clock.
  - Ids (conflicts, reviews, events) come from sequences, which each edition draws from in its
    own way (the C edition draws a conflict's id before it knows whether the row is new).
    They are left out of the rows; an id in an answer (conflict_id, review_id, the id
    request_review and release return) is replaced by what it names (the conflict's scope,
    key and fingerprints; the review's scope, key and reason), read back at once, so an id
    that names the wrong row, or none, is still a difference.  Rows are ordered by scope, key
    and id (id order is creation order for one key).
  - A batch against its reference only: idempo.events is compared as the set of distinct
    (scope, key, run_id, attempt, to_status, outcome, action, actor), without from_status, at
    and multiplicity.  The reference claims a later occurrence with params on one side only
    again (see above), where the batch may answer it without a claim: that writes a second
    event whose from_status is the first one's to_status.  The editions are compared on every
    event, in order.
EXCLUDED, being documented choices (docs/managed-edition.md "Differences",
managed/differences.list); the program does not generate them:
  - PREPARE TRANSACTION (the managed edition refuses it where the transaction acquired, its
    attempts being in a temporary table), allowed_role callers inside SECURITY DEFINER
    functions, idempo.counters(), idempo.workers(), the DROP guard, logical replication;
  - a scope change by the holder in an episode whose main transaction is REPEATABLE READ or
    SERIALIZABLE (the managed edition reads scopes with the transaction's snapshot and raises
    40001, or answers from the old scope, where the C edition reads them as committed now):
    such an episode's main transaction is READ COMMITTED;
  - a replay that claim_batch answers from its one read of the keys takes no lock on the
    record, where a single claim's replay holds the record's row lock (FOR UPDATE) to the end
    of its transaction (docs/reference.md, claim_batch, "Cost"): another session's wait =>
    false claim meanwhile answers replay after the batch and busy after the single claim.  The
    holder of an episode therefore claims one by one (--without replay-lock, always applied);
  - conflicts recorded when the caller rolls back: both editions keep them here (the C
    sweeper serves the test's databases; the managed edition's recorder is dblink's foreign
    server idempo_conflicts), and the managed edition without dblink would not.

SCENARIOS: short fixed sequences that each showed a difference once; they run before the random
runs, and where one fails the random runs keep away from what it shows (--without), so that they
look for other differences.

Usage: differential.py --host SOCKETDIR --port-c PORT --port-m PORT [--seed N] [--steps N]
       [--runs N] [--targets LIST] [--budget SECONDS] [--scenario NAME|all|none] [--keep-going]
       [--without LIST] [--stats] [--print-sequence]
test/differential/run sets up the servers and calls it (docs/internals.md, "The differential test").
"""
import argparse
import json
import random
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import psycopg
from psycopg.adapt import Loader
from psycopg.pq import TransactionStatus
from psycopg.types.string import TextLoader

TOLERANCE = 20.0            # seconds: see NORMALISATIONS
STATEMENT_TIMEOUT_MS = 30000
TARGETS = ['c-batch', 'c-single', 'm-batch', 'm-single']
# (target, target, kind): 'batch' = a batch against its reference, 'edition' = C against managed
PAIRS = [('c-single', 'm-single', 'edition'), ('c-batch', 'c-single', 'batch'),
         ('m-batch', 'm-single', 'batch'), ('c-batch', 'm-batch', 'edition')]

# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

# Key pairs whose managed-edition advisory lock keys collide: hashtext(scope || E'\x1f' || key)
# (managed/sql/claim.sql, managed_decide) is the same 32-bit value for both keys of a pair.
# Found once with:  SELECT s, string_agg(k, ' ') FROM (SELECT s, 'key-' || i AS k,
#   hashtext(s || E'\x1f' || 'key-' || i) h FROM unnest(ARRAY['s1','s2','s3']) s,
#   generate_series(1, 200000) i) x GROUP BY s, h HAVING count(*) > 1;
# check_collisions() verifies them on the managed server at start (hashtext is PostgreSQL's
# hash_any, the same on every little-endian machine and major).
COLLIDING = {
    's1': [('key-723', 'key-94668'), ('key-82241', 'key-90865')],
    's2': [('key-106363', 'key-106369'), ('key-12577', 'key-47199')],
    's3': [('key-108203', 'key-25493'), ('key-162609', 'key-9205')],
}
BASE_SCOPES = ['s1', 's2', 's3']
KEYS = ['k1', 'k2', 'k3', 'order-7', 'alice@example.com']
# odd keys: whitespace the two editions may see differently, 'v' (E'\v' is no escape in
# PostgreSQL: the letter), long, unicode, a unit separator (the managed lock key's separator)
ODD_KEYS = ['v', '\x0b', '\x0bk', ' ', '', ' k', 'k ', '\tk\n', 'vv', 'ключ', 'ß', '\U0001F600',
            'a\x1fb', 'x' * 1024, 'y' * 1025, 'é' * 512, 'é' * 513]
ODD_SCOPES = ['v', '\x0b', ' ', '', 'x' * 129, 'скоуп', 'nope']
PARAMS = [None, None, None, '{"amount": 10}', '{"amount": 10}', '{"amount": 99}',
          '{"amount": 10.0}', '{"amount": "10"}', '{"amount": 1e1}',
          '{"amount": 10, "delivered_at": "2026-01-01"}', '{"amount": 10, "delivered_at": "2026-02-02"}',
          '{"amount": 10, "meta": {"trace_id": "a"}}', '{"amount": 10, "meta": {"trace_id": "b"}}',
          '{"amount": 99, "meta": {"trace_id": "a"}}',
          '{"items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]}',
          '{"items": [{"sku": "a", "qty": 5}, {"sku": "b", "qty": 2}]}',
          '{"items": [{"sku": "b", "qty": 2}, {"sku": "a", "qty": 1}]}',
          '{"b": 1, "a": 2}', '{"s": "\\u00e9"}', '{"s": "é"}', '{}', '[]', 'null', '1', '"x"',
          '{"amount": -0}', '{"amount": 0}']
RESULTS = [None, '{"row": 1}', '{"row": 2.50}', '[]', '"done"']
RETENTIONS = ['10 minutes', '1 hour', '1 day', '1 day', '7 days', '30 days', '30 days']
LEASES = ['2 minutes', '5 minutes', '30 minutes', '2 hours']
CLAIM_LEASES = ['3 minutes', '1 hour', '0 minutes', '40 days']
CLOCK_MOVES = [1, 1, 1, 2, 2, 3, 5, 5, 10, 30, 61, 120] * 3 + [1440, 1441, 8 * 1440, 40 * 1440]
IGNORES = [[], [], ['delivered_at'], ['meta.trace_id'], ['delivered_at', 'meta.trace_id'], ['a..b']]
INCLUDES = [[], [], ['amount'], ['items[*].sku'], ['amount', 'items[*].sku'], ['[*]']]


# ---------------------------------------------------------------------------------------------
# SQL literals (the statements run are the ones printed, so they are written out in full)
# ---------------------------------------------------------------------------------------------

def q(s):
    """A text literal (E'' with escapes where it has control characters or backslashes)."""
    if s is None:
        return 'NULL'
    if any(ord(ch) < 0x20 or ord(ch) == 0x7f or ch == '\\' for ch in s):
        body = ''.join('\\\\' if ch == '\\' else "''" if ch == "'" else
                       '\\x%02x' % ord(ch) if ord(ch) < 0x20 or ord(ch) == 0x7f else ch for ch in s)
        return "E'" + body + "'"
    if len(s) > 60 and len(set(s)) == 1:
        return "repeat(%s, %d)" % (q(s[0]), len(s))
    return "'" + s.replace("'", "''") + "'"


def qj(j):
    return 'NULL::jsonb' if j is None else q(j) + '::jsonb'


def qi(minutes_or_text):
    if minutes_or_text is None:
        return 'NULL::interval'
    return q(minutes_or_text) + '::interval'


def qarr(vals, typ, fmt=q):
    if vals is None:
        return 'NULL::%s[]' % typ
    if not vals:
        return "'{}'::%s[]" % typ
    return 'ARRAY[%s]::%s[]' % (', '.join(fmt(v) for v in vals), typ)


def qintent(minutes):
    if minutes is None:
        return 'NULL::timestamptz'
    return "idempo.now() - '%d minutes'::interval" % minutes


def qbool(b):
    return 'NULL' if b is None else ('true' if b else 'false')


def qint(i):
    return 'NULL' if i is None else str(int(i))


def args_sql(pos, named):
    """Positional literals, then name => value for the named ones that are given (not None)."""
    parts = list(pos) + ['%s => %s' % (n, v) for n, v in named if v is not None]
    return ', '.join(parts)


# ---------------------------------------------------------------------------------------------
# Times and comparison
# ---------------------------------------------------------------------------------------------

class TS:
    """A timestamptz, equal to another within TOLERANCE seconds (see NORMALISATIONS)."""
    __slots__ = ('v',)
    origin = 0.0            # printed relative to the run's start

    def __init__(self, v):
        self.v = v

    @staticmethod
    def parse(s):
        if s == 'infinity':
            return TS(float('inf'))
        if s == '-infinity':
            return TS(float('-inf'))
        s = s.replace(' ', 'T', 1)
        if re.search(r'[+-]\d\d$', s):
            s += ':00'
        return TS(datetime.fromisoformat(s).timestamp())

    def __eq__(self, other):
        return isinstance(other, TS) and (self.v == other.v or abs(self.v - other.v) <= TOLERANCE)

    def __ne__(self, other):
        return not self == other

    __hash__ = None

    def __repr__(self):
        if self.v in (float('inf'), float('-inf')):
            return 'infinity' if self.v > 0 else '-infinity'
        d = int(round(self.v - TS.origin))
        sign = '-' if d < 0 else '+'
        d = abs(d)
        return 't%s%dm%02ds' % (sign, d // 60, d % 60)


class TsLoader(Loader):
    def load(self, data):
        return TS.parse(bytes(data).decode())


TS_RE = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?[+-]\d\d:\d\d$')
TS_IN_TEXT = re.compile(r'(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?[+-]\d\d(?::\d\d)?)')


def json_times(v):
    """Timestamps in to_jsonb() output as TS; a text with times in it (a review's detail) as
    its pieces, the times among them as TS."""
    if isinstance(v, str):
        if TS_RE.match(v) or v in ('infinity', '-infinity'):
            return TS.parse(v)
        if TS_IN_TEXT.search(v):
            return ['text with times'] + [TS.parse(x) if i % 2 else x for i, x in enumerate(TS_IN_TEXT.split(v))]
        return v
    if isinstance(v, list):
        return [json_times(x) for x in v]
    if isinstance(v, dict):
        return {k: json_times(x) for k, x in v.items()}
    return v


def num(s):
    return ('num', s)       # numbers as written: jsonb keeps 10.0 and 10 apart


def first_diff(a, b, path=''):
    """None if equal, else a path and the two values where they first differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if k not in a or k not in b:
                return (path + '.' + str(k), a.get(k, '<absent>'), b.get(k, '<absent>'))
            d = first_diff(a[k], b[k], path + '.' + str(k))
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_diff(x, y, '%s[%d]' % (path, i))
            if d:
                return d
        if len(a) != len(b):
            return (path + '.length', len(a), len(b))
        return None
    if a == b:
        return None
    return (path, a, b)


def short(v, n=300):
    s = v if isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[:n] + '...'


# ---------------------------------------------------------------------------------------------
# The generator: a sequence of steps, each a dict, from the seed alone
# ---------------------------------------------------------------------------------------------

class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.scopes = []            # created (as far as the generator knows)
        self.fresh = 0
        self.in_txn = False
        self.iso = 'read committed'
        self.sp = []
        self.spn = 0
        self.last_params = {}
        self.recent = []
        self.queue = []             # steps of a flow, emitted next
        self.reenable = []          # [steps to go, scope]: a disabled scope enabled again

    def chance(self, p):
        return self.r.random() < p

    def pick(self, seq):
        return self.r.choice(seq)

    # -- arguments --
    def scope(self, odd=0.02):
        if self.chance(odd) or not self.scopes:
            return self.pick(ODD_SCOPES + ['s1'])
        # the scopes of colliding keys and the fresh ones (hash_keys races) are the interesting ones
        return self.pick(self.scopes)

    def key(self, scope, odd=0.04):
        if self.chance(odd):
            return self.pick(ODD_KEYS)
        if scope in COLLIDING and self.chance(0.15):
            return self.pick(self.pick(COLLIDING[scope]))
        return self.pick(KEYS)

    def params(self, scope=None, key=None):
        """Mostly the params this key was claimed with last (a redelivery), else any."""
        last = self.last_params.get((scope, key), 'none yet')
        if last != 'none yet' and self.chance(0.88):
            return last
        p = self.pick(PARAMS)
        self.last_params[(scope, key)] = p
        return p

    def recent_key(self, scope=None):
        """A key claimed lately (to finish, verify, claim again), else a new pick."""
        pool = [x for x in self.recent if scope is None or x[0] == scope]
        if pool and self.chance(0.75):
            return self.pick(pool[-6:])
        scope = scope or self.scope()
        return scope, self.key(scope)

    def remember_key(self, scope, key):
        self.recent.append((scope, key))
        del self.recent[:-20]

    def scope_options(self, alter=False):
        o = {}
        r = self.r
        if self.chance(0.5):
            o['retention'] = self.pick(RETENTIONS)
        if self.chance(0.5):
            o['lease'] = self.pick(LEASES)
        if self.chance(0.3):
            o['on_lease_expiry'] = self.pick(['unknown', 'retry', 'retry'])
        if self.chance(0.2):
            o['verify_settle'] = self.pick(['1 minute', '5 minutes', '2 hours'])
        if self.chance(0.25):
            o['max_attempts'] = self.pick([1, 2, 3] + ([0] if alter else []))
        if self.chance(0.1):
            o['require_fingerprint'] = self.chance(0.7)
        if self.chance(0.15 if not alter else 0.4):
            o['hash_keys'] = self.chance(0.8)
        if self.chance(0.3):
            o['store_params'] = self.chance(0.8)
        if self.chance(0.3):
            o['audit'] = self.chance(0.8)
        if self.chance(0.01):
            o['durability'] = 'replicated'
        elif alter and self.chance(0.05):
            o['durability'] = 'local'
        if self.chance(0.25):
            o['remember'] = self.pick(['0', '10 minutes', '1 day', '30 days'])
        if self.chance(0.2):
            o['fingerprint_ignore'] = self.pick(IGNORES)
        if self.chance(0.15):
            o['fingerprint_include'] = self.pick(INCLUDES)
        if self.chance(0.03):
            o['owner'] = self.pick(['team', ''])
        if alter and not o:
            o['lease'] = self.pick(LEASES)
        if not alter and self.chance(0.9):
            # mostly a scope that can be created: lease and verify_settle shorter than retention
            minutes = {'10 minutes': 10, '1 hour': 60, '1 day': 1440, '7 days': 10080, '30 days': 43200,
                       '2 minutes': 2, '5 minutes': 5, '30 minutes': 30, '2 hours': 120, '1 minute': 1}
            ret = minutes[o.get('retention', '1 day')]
            for k in ('lease', 'verify_settle'):
                if k in o and minutes[o[k]] >= ret:
                    del o[k]
            if ret <= 5 and 'lease' not in o:
                o['lease'] = '2 minutes'
            if ret <= 10 and o.get('durability') == 'replicated':
                del o['durability']
        del r
        return o

    # -- steps --
    def create_scope(self, name=None, **force):
        if name is None:
            if self.chance(0.05):
                name = self.pick(ODD_SCOPES)
            elif self.chance(0.1) and self.scopes:
                name = self.pick(self.scopes)          # already exists: 42710
            else:
                self.fresh += 1
                name = 'h%d' % self.fresh
        opts = self.scope_options()
        opts.update(force)
        if name not in self.scopes and name not in ODD_SCOPES:
            self.scopes.append(name)
        return {'op': 'create_scope', 'name': name, 'opts': opts}

    def claim(self, scope=None, key=None, wait=None):
        if scope is None and key is None and self.chance(0.4):
            scope, key = self.recent_key()
        scope = scope or self.scope()
        key = key if key is not None else self.key(scope)
        self.remember_key(scope, key)
        s = {'op': 'claim', 'scope': scope, 'key': key, 'params': self.params(scope, key),
             'wait': True if wait is None else wait}
        if wait is None and self.chance(0.15):
            s['wait'] = False
        if self.chance(0.2):
            s['coc'] = True
        if self.chance(0.1):
            s['run_id'] = self.pick(['r1', 'r2'])
        if self.chance(0.06):
            s['intent'] = self.pick([5, 90, 1500, 12000, 50000])
        if self.chance(0.07):
            s['lease'] = self.pick(CLAIM_LEASES)
        if self.chance(0.15):
            s['no_verify'] = True          # verify_unknown => false: a caller that cannot verify
        if self.chance(0.03):
            # a fingerprint of one's own: a good one, a short one, or with params as well
            s['fingerprint'] = self.pick(['sha256:a', 'sha256:b', 'short'])
            if self.chance(0.7):
                s['params'] = None
        return s

    def batch(self, scope=None, keys=None, wait=None):
        scope = scope or self.scope()
        n = self.pick([1, 2, 2, 3, 3, 4, 5, 8])
        if keys is None:
            pool = [self.key(scope) for _ in range(max(1, n // 2 + 1))]
            keys = [self.pick(pool) for _ in range(n)]       # repeats on purpose
        s = {'op': 'batch', 'scope': scope, 'keys': keys, 'wait': True if wait is None else wait}
        for k in keys:
            self.remember_key(scope, k)
        if self.chance(0.7):
            s['params'] = [self.params(scope, k) for k in keys]
        if wait is None and self.chance(0.15):
            s['wait'] = False
        if self.chance(0.15):
            s['coc'] = True
        if self.chance(0.1):
            s['run_id'] = 'rb'
        if self.chance(0.05):
            s['intents'] = [self.pick([None, None, 90, 50000]) for _ in keys]
        if self.chance(0.02):
            s['keys'] = keys + [None]                       # a NULL key: 22004
            if 'params' in s:
                s['params'] = s['params'] + [None]
        if self.chance(0.02) and 'params' in s:
            s['params'] = s['params'] + ['{}']              # another length: 22023
        if self.chance(0.01):
            s['keys'] = []
            s.pop('params', None)
            s.pop('intents', None)
        return s

    def finish(self, scope=None, key=None):
        if scope is None:
            scope, key = self.recent_key()
        kind = self.pick(['complete', 'complete', 'fail', 'fail', 'complete_batch', 'fail_batch'])
        if key is not None:
            kind = kind.replace('_batch', '')
        if kind in ('complete', 'fail'):
            s = {'op': kind, 'scope': scope, 'key': key if key is not None else self.key(scope),
                 'attempt': None if self.chance(0.6) else self.pick([1, 1, 2, 3, 0])}
            if kind == 'complete':
                s['result'] = self.pick(RESULTS)
                if self.chance(0.2):
                    s['target_ref'] = 't-1'
            else:
                s['retryable'] = self.chance(0.6)
                s['error'] = self.pick([None, 'boom'])
            return s
        keys = list(dict.fromkeys(self.recent_key(scope)[1] for _ in range(self.pick([1, 2, 3, 4]))))
        if self.chance(0.08):
            keys.append(keys[0])                            # given twice: 22023
        s = {'op': kind, 'scope': scope, 'keys': keys}
        if self.chance(0.2):
            s['attempts'] = [self.pick([None, 1, 2]) for _ in keys]
        if kind == 'complete_batch':
            if self.chance(0.5):
                s['results'] = [self.pick(RESULTS) for _ in keys]
            if self.chance(0.2):
                s['target_refs'] = ['t-%d' % i for i in range(len(keys))]
        else:
            s['retryable'] = self.chance(0.6)
            if self.chance(0.3):
                s['errors'] = ['e%d' % i for i in range(len(keys))]
        return s

    def other(self):
        scope, key = self.recent_key()
        kind = self.pick(['verify', 'verify', 'resolve', 'resolve', 'resolve', 'resolve', 'request_review', 'release',
                          'release', 'heartbeat', 'heartbeat', 'lookup', 'resolve_conflict',
                          'sweep', 'check', 'stored_key'])
        if kind == 'verify':
            return {'op': 'verify', 'scope': scope, 'key': key, 'attempt': self.pick([1, 2, 3]),
                    'found': self.chance(0.5), 'result': self.pick([None, '{"found": 1}'])}
        if kind == 'resolve':
            return {'op': 'resolve', 'scope': scope, 'key': key,
                    'resolution': self.pick(['succeeded', 'not_executed', 'not_executed', 'failed', 'bogus'])}
        if kind == 'request_review':
            return {'op': 'request_review', 'scope': scope, 'key': key}
        if kind == 'release':
            return {'op': 'release', 'scope': scope, 'key': key}
        if kind == 'heartbeat':
            return {'op': 'heartbeat', 'scope': scope, 'key': key, 'attempt': self.pick([None, 1, 2]),
                    'extend': self.pick([None, None, '10 minutes', '3 hours', '0 minutes'])}
        if kind == 'lookup':
            return {'op': 'lookup', 'scope': scope, 'key': key}
        if kind == 'stored_key':
            return {'op': 'stored_key', 'scope': scope, 'key': key}
        if kind == 'resolve_conflict':
            return {'op': 'resolve_conflict', 'scope': scope, 'key': key,
                    'resolution': self.pick(['dismissed', 'kept_stored', 'new_key'])}
        if kind == 'sweep':
            return {'op': 'sweep', 'batch': self.pick([1000, 1000, 1, 2])}
        return {'op': 'check'}

    def scope_change(self):
        kind = self.pick(['create', 'create', 'alter', 'alter', 'alter', 'disable', 'enable', 'enable'])
        if kind == 'create':
            return self.create_scope()
        name = self.scope(odd=0.03)
        if kind == 'alter':
            return {'op': 'alter_scope', 'name': name, 'opts': self.scope_options(alter=True)}
        if kind == 'disable' and self.chance(0.8):
            self.reenable.append([self.r.randint(3, 30), name])     # enabled again a little later
        return {'op': kind + '_scope', 'name': name}

    def txn(self):
        if not self.in_txn:
            self.in_txn = True
            self.sp = []
            self.iso = self.pick(['read committed'] * 5 + ['repeatable read', 'repeatable read', 'serializable'])
            ro = self.chance(0.05)
            return {'op': 'begin', 'iso': self.iso, 'ro': ro}
        x = self.r.random()
        if x < 0.15:
            self.spn += 1
            self.sp.append('sp%d' % self.spn)
            return {'op': 'savepoint', 'name': self.sp[-1]}
        if x < 0.25 and self.sp:
            return {'op': 'rollback_to', 'name': self.pick(self.sp)}
        if x < 0.3 and self.sp:
            name = self.pick(self.sp)
            self.sp = self.sp[:self.sp.index(name)]
            return {'op': 'release_sp', 'name': name}
        self.in_txn = False
        return {'op': 'commit' if self.chance(0.6) else 'rollback'}

    def episode(self):
        """The holder claims (or changes a scope, or finishes...) in an open transaction; the
        main session then claims or batches the same key (or a colliding one), with wait true or
        false; the holder commits or rolls back once that is blocked or done."""
        scope = self.scope()
        if scope not in self.scopes:
            scope = self.pick(self.scopes)
        key = self.key(scope, odd=0)
        other = key
        if scope in COLLIDING and self.chance(0.35):
            key, other = self.pick(COLLIDING[scope])
            if self.chance(0.5):
                key, other = other, key
        holder = []
        before = None
        x = self.r.random()
        scope_changed = False
        if x < 0.45:
            holder.append(self.claim(scope, key, wait=True))
        elif x < 0.55:
            holder.append(self.batch(scope, [key, self.key(scope, odd=0)], wait=True))
        elif x < 0.75:
            # a scope change in flight: hash_keys (on a scope without operations, the fresh ones),
            # fingerprint rules, retention, disable
            target = scope
            fresh = [s for s in self.scopes if s.startswith('h')]
            y = self.r.random()
            if self.chance(0.3):
                # a scope created just before: no operations yet, so hash_keys and the
                # fingerprint rules may still change (the step before the episode creates it);
                # the holder turns its hash_keys around
                hashed = self.chance(0.3)
                before = self.create_scope(hash_keys=hashed)
                target = scope = before['name']
                other = key = self.pick(KEYS)
                y = 0
            elif fresh and self.chance(0.6):
                target = self.pick(fresh)
                scope = target
                other = key = self.pick(KEYS)
            if y < 0.5:
                flip = not hashed if before is not None else self.chance(0.7)
                holder.append({'op': 'alter_scope', 'name': target, 'opts': {'hash_keys': flip}})
            elif y < 0.65:
                holder.append({'op': 'alter_scope', 'name': target,
                               'opts': {'fingerprint_ignore': self.pick(IGNORES[2:5])}})
            elif y < 0.85:
                holder.append({'op': 'alter_scope', 'name': target, 'opts': self.scope_options(alter=True)})
            else:
                holder.append({'op': self.pick(['disable_scope', 'enable_scope']), 'name': target})
            scope_changed = True
        elif x < 0.85:
            holder.append(self.claim(scope, key, wait=True))
            holder.append({'op': self.pick(['complete', 'fail']), 'scope': scope, 'key': key,
                           'attempt': None, 'retryable': self.chance(0.5)})
        elif x < 0.93:
            holder.append({'op': 'release', 'scope': scope, 'key': key})
        else:
            holder.append({'op': 'sweep', 'batch': 1000})
        main = []
        if self.chance(0.3):
            iso = 'read committed' if scope_changed else self.pick(['read committed', 'repeatable read'])
            main.append({'op': 'begin', 'iso': iso, 'ro': False})
        wait = self.chance(0.75 if scope_changed else 0.5)
        y = self.r.random()
        if scope_changed:
            y = 0.2 + 0.8 * y       # against a scope change: batches more often (they read the scope too)
        if y < 0.5:
            m = self.claim(scope, other, wait=wait)
        elif y < 0.85:
            keys = [other] + ([self.pick([other, key, self.key(scope, odd=0)])] if self.chance(0.6) else [])
            m = self.batch(scope, keys, wait=wait)
        else:
            m = {'op': self.pick(['complete', 'fail']), 'scope': scope, 'key': other, 'attempt': 1,
                 'retryable': True}
        main.append(m)
        if self.chance(0.4):
            main.append(self.claim(scope, other if self.chance(0.7) else key, wait=True))
        if main[0]['op'] == 'begin' and self.chance(0.7):
            main.append({'op': self.pick(['commit', 'rollback'])})
        elif main[0]['op'] == 'begin':
            self.in_txn = True
            self.sp = []
        episode = {'op': 'episode', 'holder': holder, 'main': main,
                   'end': 'commit' if self.chance(0.9 if before is not None else 0.7) else 'rollback'}
        if before is not None:
            self.queue.insert(0, episode)
            return before
        return episode

    def flow(self):
        """A few steps as an application or an operator would run them, so that the paths
        behind them are reached: claim and finish in one transaction, claim now and finish
        later, a lease that runs out (unknown, verify), heartbeats, a result that expires (a
        remembered key, release), attempts used up (review, resolve), savepoints, a read-only
        transaction."""
        scope, key = self.recent_key() if self.chance(0.3) else (self.scope(), None)
        if key is None:
            key = self.key(scope)
        c = self.claim(scope, key)
        x = self.r.random()
        later = self.finish(scope, key)
        later['attempt'] = self.pick([1, 1, 1, 2, None])
        if not self.in_txn and x < 0.3:
            rest = [c, self.finish(scope, key)]
            if self.chance(0.3):
                # a savepoint rolled back over a second claim: its attempt no longer counts
                k2 = self.key(scope)
                self.spn += 1
                sp = 'sp%d' % self.spn
                rest = [c, {'op': 'savepoint', 'name': sp}, self.claim(scope, k2),
                        {'op': 'rollback_to', 'name': sp}, self.finish(scope, k2), self.finish(scope, key)]
            self.queue = rest + [{'op': 'commit' if self.chance(0.8) else 'rollback'}]
            self.in_txn = True
            self.sp = []
            return {'op': 'begin', 'iso': self.pick(['read committed'] * 4 + ['repeatable read', 'serializable']),
                    'ro': False}
        if not self.in_txn and x < 0.36:
            self.queue = [c, {'op': 'lookup', 'scope': scope, 'key': key},
                          self.claim(scope, self.key(scope)), {'op': 'commit'}]
            self.in_txn = True
            self.sp = []
            return {'op': 'begin', 'iso': self.pick(['read committed', 'repeatable read']), 'ro': True}
        if x < 0.45 and self.in_txn:
            self.queue = [self.finish(scope, key)]
            return c
        if x < 0.6:
            # the lease runs out: unknown (or the next attempt in a retry scope), then a verdict
            verdict = self.pick([
                {'op': 'verify', 'scope': scope, 'key': key, 'attempt': self.pick([1, 1, 2]),
                 'found': self.chance(0.5), 'result': None},
                later,
                {'op': 'resolve', 'scope': scope, 'key': key,
                 'resolution': self.pick(['succeeded', 'not_executed', 'failed'])}])
            self.queue = [{'op': 'clock', 'minutes': self.pick([6, 31, 121, 1500])},
                          self.claim(scope, key), {'op': 'clock', 'minutes': self.pick([1, 2, 6])}, verdict,
                          self.claim(scope, key)]
            return c
        if x < 0.7:
            hb = {'op': 'heartbeat', 'scope': scope, 'key': key, 'attempt': self.pick([1, 1, None]),
                  'extend': self.pick([None, '10 minutes', '3 hours'])}
            self.queue = [{'op': 'clock', 'minutes': self.pick([1, 3, 6])}, hb,
                          {'op': 'clock', 'minutes': self.pick([1, 4, 8])}, dict(hb), later]
            return c
        if x < 0.8:
            # finished, then its result expires: expired (a remembered key) or acquired again
            c['coc'] = True
            self.queue = [{'op': 'clock', 'minutes': self.pick([61, 1441, 8 * 1440, 40 * 1440])},
                          self.pick([{'op': 'sweep', 'batch': 1000}, self.claim(scope, key)]),
                          {'op': 'release', 'scope': scope, 'key': key}, self.claim(scope, key)]
            return c
        if x < 0.88:
            # attempts used up: retryable failures until the scope's max_attempts, then review
            fail = {'op': 'fail', 'scope': scope, 'key': key, 'attempt': 1, 'retryable': True}
            self.queue = [fail, self.claim(scope, key), dict(fail, attempt=2), self.claim(scope, key),
                          dict(fail, attempt=3), self.claim(scope, key),
                          {'op': 'resolve', 'scope': scope, 'key': key, 'resolution': 'not_executed'},
                          self.claim(scope, key)]
            return c
        self.queue = [{'op': 'clock', 'minutes': self.pick([1, 1, 2, 10])}, later] if self.chance(0.3) else [later]
        return c

    def step(self):
        for r in self.reenable:
            r[0] -= 1
        if self.reenable and self.reenable[0][0] <= 0 and not self.queue:
            return {'op': 'enable_scope', 'name': self.reenable.pop(0)[1]}
        if self.queue:
            s = self.queue.pop(0)
            if s['op'] in ('commit', 'rollback'):
                self.in_txn = False
            return s
        x = self.r.random()
        if x < 0.12:
            return self.flow()
        if x < 0.28:
            return self.claim()
        if x < 0.40:
            return self.batch()
        if x < 0.52:
            return self.finish()
        if x < 0.62:
            return self.txn() if self.in_txn or self.chance(0.8) else self.claim()
        if x < 0.67:
            return {'op': 'clock', 'minutes': self.pick(CLOCK_MOVES)}
        if x < 0.78:
            return self.other()
        if x < 0.83:
            return self.scope_change()
        if not self.in_txn:
            return self.episode()
        return self.txn()

    def sequence(self, steps):
        seq = []
        for name in BASE_SCOPES:
            # the scopes of the colliding pairs: their keys are stored in clear
            seq.append(self.create_scope(name, hash_keys=False))
        seq.append(self.create_scope('h0', hash_keys=False))
        while len(seq) < steps:
            seq.append(self.step())
        if self.in_txn:
            seq.append({'op': 'commit'})
        return seq


# ---------------------------------------------------------------------------------------------
# Targets and sessions
# ---------------------------------------------------------------------------------------------

class StepError(Exception):
    """An error that is the step's answer: a server's SQLSTATE, or the reference's own."""

    def __init__(self, sqlstate, message):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message


def connect(host, port, dbname, app):
    conn = psycopg.connect(host=host, port=port, dbname=dbname, user='postgres', autocommit=True,
                           application_name=app,
                           options='-c TimeZone=UTC -c DateStyle=ISO -c statement_timeout=%d '
                                   '-c client_min_messages=notice' % STATEMENT_TIMEOUT_MS)
    for t in ('jsonb', 'json'):
        conn.adapters.register_loader(t, TextLoader)
    conn.adapters.register_loader('timestamptz', TsLoader)
    return conn


class Session:
    def __init__(self, target, role):
        self.target = target
        self.role = role            # 'A': the main session; 'B': the holder
        self.conn = connect(target.host, target.port, target.db, 'differential %s %s' % (target.name, role))
        self.pid = self.conn.info.backend_pid
        self.notices = []
        self.conn.add_notice_handler(lambda d: self.notices.append(
            '%s %s' % (d.severity_nonlocalized or d.severity, d.sqlstate)))
        self.offset = None          # the clock offset (minutes) this session has set
        self.savepoints = []
        self.snapshot = False       # the open transaction ran a statement (its rows may be read)
        self.iso = None

    def in_txn(self):
        return self.conn.info.transaction_status != TransactionStatus.IDLE

    def execute(self, sql, note=None):
        """Runs one statement (logged); returns (columns, rows); raises StepError."""
        self.target.log.append((self.role, sql, note))
        try:
            cur = self.conn.execute(sql)
        except psycopg.Error as e:
            raise StepError(e.sqlstate or 'XX000', str(e).splitlines()[0] if str(e) else repr(e))
        cols = [d.name for d in cur.description] if cur.description else []
        rows = cur.fetchall() if cur.description else []
        return cols, rows

    def harness(self, sql):
        """A statement of the harness itself (logged as such)."""
        self.target.log.append((self.role, sql, 'the harness'))
        self.conn.execute(sql)

    def set_clock(self, minutes):
        if self.offset != minutes:
            self.execute("SET idempo.clock_offset = '%d minutes'" % minutes)
            self.offset = minutes

    def recover(self):
        """After an error: back to the innermost savepoint, or out of the transaction."""
        if self.in_txn():
            if self.savepoints:
                self.harness('ROLLBACK TO SAVEPOINT %s' % self.savepoints[-1])
            else:
                self.harness('ROLLBACK')
                self.snapshot = False
        self.offset = None      # a SET since the savepoint or BEGIN is undone

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass


class Target:
    def __init__(self, name, host, port, template):
        self.name = name
        self.edition = name[0]              # 'c' or 'm'
        self.single = name.endswith('single')
        self.host = host
        self.port = port
        self.db = 'diff_' + name.replace('-', '_')
        self.template = template
        self.log = []
        self.main = self.holder = self.monitor = None

    def create(self):
        admin = connect(self.host, self.port, 'postgres', 'differential setup')
        admin.execute('DROP DATABASE IF EXISTS %s WITH (FORCE)' % self.db)
        admin.execute('CREATE DATABASE %s TEMPLATE %s' % (self.db, self.template))
        admin.close()
        if self.edition == 'm':
            c = connect(self.host, self.port, self.db, 'differential setup')
            c.execute("ALTER SERVER idempo_conflicts OPTIONS (SET dbname %s)" % q(self.db))
            c.close()

    def reset(self):
        """Empty tables and new sessions: every run starts the same way."""
        self.close()
        c = connect(self.host, self.port, self.db, 'differential reset')
        c.execute('TRUNCATE idempo.operations, idempo.conflicts, idempo.reviews, idempo.events, '
                  'idempo.scopes RESTART IDENTITY')
        c.close()
        self.log = []
        self.main = Session(self, 'A')
        self.holder = Session(self, 'B')
        self.monitor = connect(self.host, self.port, self.db, 'differential monitor')

    def close(self):
        for s in (self.main, self.holder):
            if s:
                s.close()
        if self.monitor:
            self.monitor.close()
        self.main = self.holder = self.monitor = None

    # -- what a target stores: every row of idempo's tables, as to_jsonb() text --
    STATE_SQL = """
SELECT t, j FROM (
  SELECT 'scopes' t, s.name a, '' b, 0::bigint c, to_jsonb(s)::text j FROM idempo.scopes s
  UNION ALL SELECT 'operations', o.scope, o.key, 0, to_jsonb(o)::text FROM idempo.operations o
  UNION ALL SELECT 'conflicts', c.scope, c.key, c.id, (to_jsonb(c) - 'id')::text FROM idempo.conflicts c
  UNION ALL SELECT 'reviews', r.scope, r.key, r.id, (to_jsonb(r) - 'id')::text FROM idempo.reviews r
  UNION ALL SELECT 'events', e.scope, e.key, e.id, (to_jsonb(e) - 'id')::text FROM idempo.events e
) x ORDER BY t COLLATE "C", a COLLATE "C", b COLLATE "C", c"""

    def state(self):
        """The stored rows as the main session sees them (its own uncommitted writes too), by
        table, or None where they are not read now: a transaction that has not taken its
        snapshot yet (reading would take it), or a SERIALIZABLE one (reading every table would
        add predicate locks the sequence did not ask for)."""
        s = self.main
        if s.in_txn() and (not s.snapshot or s.iso == 'serializable'):
            return None
        if s.conn.info.transaction_status == TransactionStatus.INERROR:
            return None
        out = {t: [] for t in TABLES}
        for t, j in s.conn.execute(self.STATE_SQL).fetchall():
            out[t].append(j)
        return out

    def label_ids(self, conflict_ids, review_ids):
        """What each id names, read in the main session (its own rows), else as committed."""
        labels = {}
        for kind, ids, sql in (
                ('conflict', conflict_ids,
                 "SELECT id, scope || '/' || key || ' ' || encode(stored_fingerprint, 'hex') || '->' || "
                 "encode(incoming_fingerprint, 'hex') FROM idempo.conflicts WHERE id = ANY(%s)"),
                ('review', review_ids,
                 "SELECT id, scope || '/' || key || ' ' || reason || ' ' || coalesce(resolution, 'open') "
                 "FROM idempo.reviews WHERE id = ANY(%s)")):
            ids = [i for i in ids if i is not None]
            if not ids:
                continue
            for conn in (self.main.conn, self.monitor):
                if conn.info.transaction_status == TransactionStatus.INERROR:
                    continue
                want = [i for i in ids if (kind, i) not in labels]
                if not want:
                    break
                for i, text in conn.execute(sql, (want,)).fetchall():
                    labels[(kind, i)] = '%s %s' % (kind, text)
        return labels


# ---------------------------------------------------------------------------------------------
# Steps: SQL, and how each target runs them
# ---------------------------------------------------------------------------------------------

CLAIM_COLS = ['outcome', 'status', 'attempt', 'result', 'target_ref', 'error', 'first_seen_at',
              'lease_expires_at', 'conflict_id', 'review_id', 'completed_at']


def fingerprint_sql(f):
    if f is None:
        return None
    if f == 'short':
        return "'\\x0102'::bytea"
    return "sha256(%s)" % q(f.split(':', 1)[1] + '')


def claim_sql(s):
    return 'SELECT * FROM idempo.claim(%s)' % args_sql(
        [q(s['scope']), q(s['key'])],
        [('params', None if s.get('params') is None else qj(s['params'])),
         ('fingerprint', fingerprint_sql(s.get('fingerprint'))),
         ('run_id', None if s.get('run_id') is None else q(s['run_id'])),
         ('intent_at', None if s.get('intent') is None else qintent(s['intent'])),
         ('wait', None if s.get('wait', True) else 'false'),
         ('complete_on_commit', 'true' if s.get('coc') else None),
         ('lease', None if s.get('lease') is None else qi(s['lease'])),
         ('verify_unknown', 'false' if s.get('no_verify') else None)])


def batch_sql(s):
    return 'SELECT * FROM idempo.claim_batch(%s)' % args_sql(
        [q(s['scope']), qarr(s['keys'], 'text')],
        [('params', None if s.get('params') is None else qarr(s['params'], 'jsonb', qj)),
         ('run_id', None if s.get('run_id') is None else q(s['run_id'])),
         ('intent_at', None if s.get('intents') is None else qarr(s['intents'], 'timestamptz', qintent)),
         ('wait', None if s.get('wait', True) else 'false'),
         ('complete_on_commit', 'true' if s.get('coc') else None)])


def finish_sql(s):
    if s['op'] == 'complete':
        return 'SELECT idempo.complete(%s) AS status' % args_sql(
            [q(s['scope']), q(s['key'])],
            [('attempt', None if s.get('attempt') is None else qint(s['attempt'])),
             ('result', None if s.get('result') is None else qj(s['result'])),
             ('target_ref', None if s.get('target_ref') is None else q(s['target_ref']))])
    return 'SELECT idempo.fail(%s) AS status' % args_sql(
        [q(s['scope']), q(s['key'])],
        [('attempt', None if s.get('attempt') is None else qint(s['attempt'])),
         ('error', None if s.get('error') is None else q(s['error'])),
         ('retryable', 'false' if s.get('retryable') is False else None)])


def finish_batch_sql(s):
    if s['op'] == 'complete_batch':
        return 'SELECT * FROM idempo.complete_batch(%s)' % args_sql(
            [q(s['scope']), qarr(s['keys'], 'text')],
            [('attempts', None if s.get('attempts') is None else qarr(s['attempts'], 'integer', qint)),
             ('results', None if s.get('results') is None else qarr(s['results'], 'jsonb', qj)),
             ('target_refs', None if s.get('target_refs') is None else qarr(s['target_refs'], 'text'))])
    return 'SELECT * FROM idempo.fail_batch(%s)' % args_sql(
        [q(s['scope']), qarr(s['keys'], 'text')],
        [('attempts', None if s.get('attempts') is None else qarr(s['attempts'], 'integer', qint)),
         ('errors', None if s.get('errors') is None else qarr(s['errors'], 'text')),
         ('retryable', 'false' if s.get('retryable') is False else None)])


def scope_opts_sql(opts):
    named = []
    for k, v in opts.items():
        if k in ('retention', 'lease', 'verify_settle', 'remember'):
            named.append((k, qi(v)))
        elif k in ('on_lease_expiry', 'durability', 'owner'):
            named.append((k, q(v)))
        elif k == 'max_attempts':
            named.append((k, qint(v)))
        elif k in ('fingerprint_ignore', 'fingerprint_include'):
            named.append((k, qarr(v, 'text')))
        else:
            named.append((k, qbool(v)))
    return named


def simple_sql(s):
    """The SQL of a step that is one statement in every target."""
    op = s['op']
    if op == 'claim':
        return claim_sql(s)
    if op == 'batch':
        return batch_sql(s)
    if op in ('complete', 'fail'):
        return finish_sql(s)
    if op in ('complete_batch', 'fail_batch'):
        return finish_batch_sql(s)
    if op == 'create_scope':
        return 'SELECT name FROM idempo.create_scope(%s)' % args_sql([q(s['name'])], scope_opts_sql(s['opts']))
    if op == 'alter_scope':
        return 'SELECT name FROM idempo.alter_scope(%s)' % args_sql([q(s['name'])], scope_opts_sql(s['opts']))
    if op in ('disable_scope', 'enable_scope'):
        return 'SELECT name, enabled FROM idempo.%s(%s)' % (op, q(s['name']))
    if op == 'verify':
        return 'SELECT idempo.verify(%s) AS status' % args_sql(
            [q(s['scope']), q(s['key']), qint(s['attempt']), qbool(s['found'])],
            [('result', None if s.get('result') is None else qj(s['result']))])
    if op == 'resolve':
        return "SELECT idempo.resolve(%s, %s, %s, 'reviewer') AS status" % (q(s['scope']), q(s['key']), q(s['resolution']))
    if op == 'request_review':
        return "SELECT idempo.request_review(%s, %s, 'look') AS review_id" % (q(s['scope']), q(s['key']))
    if op == 'release':
        return "SELECT idempo.release(%s, %s, 'reviewer') AS review_id" % (q(s['scope']), q(s['key']))
    if op == 'heartbeat':
        return 'SELECT idempo.heartbeat(%s) AS lease_expires_at' % args_sql(
            [q(s['scope']), q(s['key']), qint(s['attempt'])],
            [('extend', None if s.get('extend') is None else qi(s['extend']))])
    if op == 'lookup':
        return ('SELECT status, attempt, fingerprint, result, target_ref, error, first_seen_at, '
                'lease_expires_at, completed_at, expires_at FROM idempo.lookup(%s, %s)' % (q(s['scope']), q(s['key'])))
    if op == 'stored_key':
        return 'SELECT idempo.stored_key(%s, %s)' % (q(s['scope']), q(s['key']))
    if op == 'resolve_conflict':
        # the conflict by what it is (ids differ between targets): the key's oldest open one
        return ("SELECT idempo.resolve_conflict((SELECT id FROM idempo.conflicts WHERE scope = %s AND "
                "key = idempo.stored_key(%s, %s) AND resolved_at IS NULL ORDER BY id LIMIT 1), %s, 'reviewer')"
                % (q(s['scope']), q(s['scope']), q(s['key']), q(s['resolution'])))
    if op == 'sweep':
        return 'SELECT * FROM idempo.sweep(%d)' % s['batch']
    if op == 'check':
        return 'SELECT scope, key, problem FROM idempo.check_consistency() ORDER BY 1, 2, 3'
    raise ValueError(op)


def reference_scope_arg(scope):
    """A batch call's scope argument is checked first, as every call's is (NULL, empty or only
    whitespace -- space and \\t to \\r, src/keys.c --, over 128 bytes), before its arrays and
    keys; an empty batch decides nothing else (not even whether the scope exists)."""
    if scope is None:
        raise StepError('22004', 'reference: scope must not be NULL')
    if all(ch == ' ' or '\t' <= ch <= '\r' for ch in scope):
        raise StepError('22023', 'reference: scope must not be empty or only whitespace')
    if len(scope.encode('utf-8')) > 128:
        raise StepError('22023', 'reference: scope name too long')


class Runner:
    """Runs one sequence on a set of targets, step by step, comparing as it goes."""

    def __init__(self, targets, pairs, pool):
        self.targets = targets
        self.pairs = pairs
        self.clock = 0              # minutes of idempo.clock_offset
        self.pool = pool

    # -- one statement as an answer --
    def answer_rows(self, t, sess, sql):
        cols, rows = sess.execute(sql)
        sess.snapshot = True
        return cols, [list(r) for r in rows]

    def finish_answer(self, t, sess, cols, rows, ans):
        """Ids replaced by what they name."""
        cids, rids = [], []
        for r in rows:
            for c, v in zip(cols, r):
                if c == 'conflict_id':
                    cids.append(v)
                elif c == 'review_id':
                    rids.append(v)
        labels = t.label_ids(cids, rids) if (cids or rids) else {}
        out = []
        for r in rows:
            row = {}
            for c, v in zip(cols, r):
                if c == 'conflict_id' and v is not None:
                    v = labels.get(('conflict', v), 'conflict id naming no row')
                elif c == 'review_id' and v is not None:
                    v = labels.get(('review', v), 'review id naming no row')
                elif isinstance(v, bytes):
                    v = '\\x' + v.hex()
                elif v is not None and not isinstance(v, (str, int, float, bool, TS)):
                    v = str(v)
                row[c] = v
            out.append(row)
        ans['rows'] = out
        return ans

    # -- the reference of a batch call (single targets) --
    def reference_batch(self, t, sess, s):
        keys = s['keys']
        n = len(keys)
        reference_scope_arg(s['scope'])        # the scope argument first, as every batch call
        for name in ('params', 'intents'):
            if s.get(name) is not None and len(s[name]) != n:
                raise StepError('22023', 'reference: %s has another length than keys' % name)
        if any(k is None for k in keys):
            raise StepError('22004', 'reference: a NULL key')
        if n == 0:
            return [], []
        # each key checked and in its stored form, in input order, before anything is claimed
        _, rows = sess.execute('SELECT idempo.stored_key(%s, k) FROM unnest(%s) WITH ORDINALITY AS u(k, i) ORDER BY i'
                               % (q(s['scope']), qarr(keys, 'text')), note='the reference: stored keys')
        stored = [r[0] for r in rows]
        first = {}
        firsts = []
        for i, st in enumerate(stored):
            firsts.append(first.get(st))
            first.setdefault(st, i)
        order = sorted(range(n), key=lambda i: (stored[i].encode('utf-8'), i))
        params = s.get('params') or [None] * n
        intents = s.get('intents') or [None] * n
        answers = [None] * n
        cols = None
        for i in order:
            c = {'op': 'claim', 'scope': s['scope'], 'key': keys[i], 'params': params[i],
                 'run_id': s.get('run_id'), 'intent': intents[i], 'wait': s.get('wait', True),
                 'coc': s.get('coc')}
            cols, rows = sess.execute(claim_sql(c), note='the reference: element %d' % (i + 1))
            answers[i] = list(rows[0])
        cols = CLAIM_COLS
        handed = {}
        out = []
        for i in range(n):
            a = list(answers[i])
            g = firsts[i] if firsts[i] is not None else i
            if a[0] in ('acquired', 'unknown'):
                if handed.get(g):
                    a[0] = 'busy'
                handed[g] = True
            out.append([i + 1, keys[i], None if firsts[i] is None else firsts[i] + 1] + a)
        return ['position', 'key', 'duplicate_of'] + cols, out

    def reference_finish_batch(self, t, sess, s):
        keys = s['keys']
        n = len(keys)
        reference_scope_arg(s['scope'])
        names = ('attempts', 'results', 'target_refs') if s['op'] == 'complete_batch' else ('attempts', 'errors')
        for name in names:
            if s.get(name) is not None and len(s[name]) != n:
                raise StepError('22023', 'reference: %s has another length than keys' % name)
        if any(k is None for k in keys):
            raise StepError('22004', 'reference: a NULL key')
        if n == 0:
            return [], []
        _, rows = sess.execute('SELECT idempo.stored_key(%s, k) FROM unnest(%s) WITH ORDINALITY AS u(k, i) ORDER BY i'
                               % (q(s['scope']), qarr(keys, 'text')), note='the reference: stored keys')
        stored = [r[0] for r in rows]
        if len(set(stored)) != n:
            raise StepError('22023', 'reference: a key given twice')
        order = sorted(range(n), key=lambda i: (stored[i].encode('utf-8'), i))
        statuses = [None] * n
        for i in order:
            e = {'op': 'complete' if s['op'] == 'complete_batch' else 'fail', 'scope': s['scope'], 'key': keys[i],
                 'attempt': (s.get('attempts') or [None] * n)[i]}
            if s['op'] == 'complete_batch':
                e['result'] = (s.get('results') or [None] * n)[i]
                e['target_ref'] = (s.get('target_refs') or [None] * n)[i]
            else:
                e['error'] = (s.get('errors') or [None] * n)[i]
                e['retryable'] = s.get('retryable', True)
            _, rows = sess.execute(finish_sql(e), note='the reference: element %d' % (i + 1))
            statuses[i] = rows[0][0]
        return ['position', 'key', 'status'], [[i + 1, keys[i], statuses[i]] for i in range(n)]

    # -- one step on one session --
    def run_on(self, t, sess, s):
        """The answer of step s on session sess of target t."""
        op = s['op']
        sess.notices.clear()
        ans = {}
        try:
            if op == 'begin':
                if sess.in_txn():
                    return {'skip': 'in a transaction'}
                sess.execute('BEGIN ISOLATION LEVEL %s%s' % (s['iso'].upper(), ' READ ONLY' if s.get('ro') else ''))
                sess.iso = s['iso']
                sess.savepoints = []
                sess.snapshot = False
                return {'ok': True}
            if op in ('commit', 'rollback'):
                if not sess.in_txn():
                    return {'skip': 'no transaction'}
                sess.savepoints = []
                sess.snapshot = False
                if op == 'rollback':
                    sess.offset = None
                sess.execute(op.upper())
                return {'ok': True, 'notices': list(sess.notices)}
            if op in ('savepoint', 'rollback_to', 'release_sp'):
                if not sess.in_txn():
                    return {'skip': 'no transaction'}
                if op == 'savepoint':
                    sess.execute('SAVEPOINT %s' % s['name'])
                    sess.savepoints.append(s['name'])
                    return {'ok': True}
                if s['name'] not in sess.savepoints:
                    return {'skip': 'no such savepoint'}
                if op == 'rollback_to':
                    sess.execute('ROLLBACK TO SAVEPOINT %s' % s['name'])
                    sess.savepoints = sess.savepoints[:sess.savepoints.index(s['name']) + 1]
                    sess.offset = None
                else:
                    sess.execute('RELEASE SAVEPOINT %s' % s['name'])
                    sess.savepoints = sess.savepoints[:sess.savepoints.index(s['name'])]
                return {'ok': True}
            if op == 'clock':
                return {'ok': True}
            sess.set_clock(self.clock)
            wrapped = False
            if t.single and op in ('batch', 'complete_batch', 'fail_batch'):
                if not sess.in_txn():
                    sess.execute('BEGIN', note='the reference: one transaction')
                    wrapped = True
                if op == 'batch':
                    cols, rows = self.reference_batch(t, sess, s)
                else:
                    cols, rows = self.reference_finish_batch(t, sess, s)
                if wrapped:
                    sess.execute('COMMIT', note='the reference: one transaction')
                    wrapped = False
                sess.snapshot = True
            else:
                cols, rows = self.answer_rows(t, sess, simple_sql(s))
            ans['notices'] = list(sess.notices)
            return self.finish_answer(t, sess, cols, rows, ans)
        except StepError as e:
            ans = {'error': e.sqlstate, 'message': e.message, 'notices': list(sess.notices)}
            if op == 'commit':
                return ans
            sess.recover()
            return ans

    # -- an episode: the holder in an open transaction, the main session against it --
    def run_episode(self, t, s):
        A, B = t.main, t.holder
        out = {'holder': [], 'main': []}
        B.set_clock(self.clock)
        B.execute('BEGIN')
        B.snapshot = False
        holder_failed = False
        for h in s['holder']:
            if holder_failed:
                out['holder'].append({'skip': 'the holder failed'})
                continue
            a = self.run_on(t, B, h)
            out['holder'].append(a)
            if 'error' in a:
                holder_failed = True        # run_on rolled its transaction back
        holder_open = B.in_txn()
        for m in s['main']:
            if not holder_open:
                out['main'].append(self.run_on(t, A, m))
                continue
            result = {}
            th = threading.Thread(target=lambda: result.setdefault('a', self.run_on(t, A, m)))
            th.start()
            blocked = self.wait_blocked_or_done(t, th, end_on_block=m.get('wait', True) or m['op'] not in ('claim', 'batch'))
            if blocked:
                t.log.append(('A', None, 'A waits here, blocked by B'))
                out['end'] = self.end_holder(t, s['end'])
                holder_open = False
            th.join(STATEMENT_TIMEOUT_MS / 1000 + 5)
            if th.is_alive():
                A.conn.cancel()
                th.join()
            a = result.get('a', {'error': 'no answer'})
            a['blocked'] = blocked
            out['main'].append(a)
        if holder_open:
            out['end'] = self.end_holder(t, s['end'])
        return out

    def end_holder(self, t, end):
        B = t.holder
        B.notices.clear()
        if not B.in_txn():
            return {'skip': 'no transaction'}
        B.offset = None
        try:
            B.execute(end.upper())
            return {'ok': True, 'notices': list(B.notices)}
        except StepError as e:
            return {'error': e.sqlstate, 'message': e.message}

    def wait_blocked_or_done(self, t, th, end_on_block):
        """True once the main session waits for a lock (pg_blocking_pids); False when its
        statement is done first.  A statement that may not wait (wait => false) is left to
        finish on its own: ending the holder at that moment would decide its answer."""
        deadline = time.time() + STATEMENT_TIMEOUT_MS / 1000 + 5
        pid = t.main.pid
        while th.is_alive() and time.time() < deadline:
            if end_on_block:
                n = t.monitor.execute('SELECT cardinality(pg_blocking_pids(%s))', (pid,)).fetchone()[0]
                if n and th.is_alive():
                    return True
            th.join(0.005)
        return False

    # -- a step on every target (each in a thread of its own: the servers work meanwhile) --
    def on_each(self, fn):
        if len(self.targets) == 1:
            return {self.targets[0].name: fn(self.targets[0])}
        futures = {t.name: self.pool.submit(fn, t) for t in self.targets}
        return {name: f.result() for name, f in futures.items()}

    def step(self, s):
        if s['op'] == 'clock':
            self.clock += s['minutes']

        def one(t):
            mark = len(t.log)
            if s['op'] == 'episode':
                a = self.run_episode(t, s)
            else:
                a = self.run_on(t, t.main, s)
            t.step_log = t.log[mark:]
            return a
        return self.on_each(one)

    def compare_answers(self, answers):
        diffs = []
        for a, b, kind in self.pairs:
            if a in answers and b in answers:
                d = first_diff(strip(answers[a]), strip(answers[b]))
                if d:
                    diffs.append((a, b, kind, 'answer', d))
        return diffs

    def compare_states(self, settle=True):
        states = self.on_each(lambda t: t.state())
        diffs = self._state_diffs(states)
        # the C edition hands a conflict its own transaction wrote to the sweeper when that
        # transaction rolls back, which records it within a moment: look again before calling
        # it a difference (a bounded wait for the rows, not for a time)
        tries = 0
        while diffs and settle and tries < 100:
            time.sleep(0.05)
            tries += 1
            states = self.on_each(lambda t: t.state())
            diffs = self._state_diffs(states)
        return diffs, states

    def _state_diffs(self, states):
        diffs = []
        for a, b, kind in self.pairs:
            if states.get(a) is None or states.get(b) is None:
                continue
            for table in TABLES:
                d = table_diff(table, states[a][table], states[b][table], kind)
                if d:
                    diffs.append((a, b, kind, 'rows', d))
                    break
        return diffs


TABLES = ['scopes', 'operations', 'conflicts', 'reviews', 'events']
PARSED = {}         # to_jsonb() text -> the row, times as TS
EVENT_KEYS = {}     # an event's text -> what a batch and its reference compare of it
ROW_EQUAL = {}      # (text, text) -> first_diff of the two rows


def row(text):
    r = PARSED.get(text)
    if r is None:
        if len(PARSED) > 200000:
            PARSED.clear()
        r = PARSED[text] = json_times(json.loads(text, parse_float=num, parse_int=num))
    return r


def event_key(text):
    k = EVENT_KEYS.get(text)
    if k is None:
        e = row(text)
        k = EVENT_KEYS[text] = tuple(json.dumps(e.get(f), default=repr, sort_keys=True) for f in
                                     ('scope', 'key', 'run_id', 'attempt', 'to_status', 'outcome', 'action', 'actor'))
    return k


def table_diff(table, x, y, kind):
    """None if two targets' rows of a table agree, else (path, value, value)."""
    if kind == 'batch' and table == 'events':
        # a batch against its reference: the set of distinct events (see NORMALISATIONS)
        sx, sy = sorted(set(map(event_key, x))), sorted(set(map(event_key, y)))
        return first_diff(sx, sy, table)
    if x == y:
        return None
    for i, (a, b) in enumerate(zip(x, y)):
        if a == b:
            continue
        k = (a, b)
        if k not in ROW_EQUAL:
            if len(ROW_EQUAL) > 200000:
                ROW_EQUAL.clear()
            ROW_EQUAL[k] = first_diff(row(a), row(b), '%s[%d]' % (table, i))
        if ROW_EQUAL[k]:
            return ROW_EQUAL[k]
    if len(x) != len(y):
        i = min(len(x), len(y))
        return ('%s.length' % table, '%d rows%s' % (len(x), (', then ' + short(row(x[i]))) if i < len(x) else ''),
                '%d rows%s' % (len(y), (', then ' + short(row(y[i]))) if i < len(y) else ''))
    return None


def strip(ans):
    """An answer without what is not compared: error messages (the SQLSTATE is)."""
    if isinstance(ans, dict):
        return {k: strip(v) for k, v in ans.items() if k != 'message'}
    if isinstance(ans, list):
        return [strip(v) for v in ans]
    return ans


# ---------------------------------------------------------------------------------------------
# Running sequences, shrinking, printing
# ---------------------------------------------------------------------------------------------

class Difference(Exception):
    def __init__(self, index, step, diffs, answers, targets):
        super().__init__('difference at step %d' % index)
        self.index = index
        self.step = step
        self.diffs = diffs
        self.answers = answers
        self.logs = {t.name: list(t.log) for t in targets}
        self.step_logs = {t.name: list(getattr(t, 'step_log', [])) for t in targets}


def tally(stats, s, a):
    """Counts what a step answered (--stats)."""
    if s['op'] == 'episode':
        for h, x in zip(s['holder'], a.get('holder', [])):
            tally(stats, dict(h, op='holder ' + h['op']), x)
        for m, x in zip(s['main'], a.get('main', [])):
            tally(stats, dict(m, op='episode ' + m['op'] + (' blocked' if x.get('blocked') else '')), x)
        return
    if 'error' in a:
        what = 'error ' + a['error']
    elif 'skip' in a:
        what = 'skipped'
    elif a.get('rows') and 'outcome' in a['rows'][0]:
        what = ','.join(sorted(set(r['outcome'] for r in a['rows'])))
    elif a.get('rows') and 'status' in a['rows'][0]:
        what = ','.join(sorted(set(str(r['status']) for r in a['rows'])))
    else:
        what = 'ok'
    k = '%s: %s' % (s['op'], what)
    stats[k] = stats.get(k, 0) + 1


def run_sequence(targets, pairs, seq, deadline=None, progress=None, stats=None):
    """Runs seq from empty databases; raises Difference; returns the number of steps run."""
    for t in targets:
        t.reset()
    TS.origin = time.time()
    pool = ThreadPoolExecutor(max_workers=len(targets))
    runner = Runner(targets, pairs, pool)
    try:
        for i, s in enumerate(seq):
            if deadline and time.time() > deadline:
                return i
            answers = runner.step(s)
            if stats is not None:
                tally(stats, s, answers[targets[0].name])
            diffs = runner.compare_answers(answers)
            if not diffs and s['op'] not in READ_ONLY_STEPS and not all('skip' in a for a in answers.values()):
                diffs, _ = runner.compare_states()
            if diffs:
                raise Difference(i, s, diffs, answers, targets)
            if progress and i % 500 == 499:
                progress(i + 1)
        return len(seq)
    finally:
        pool.shutdown()
        for t in targets:
            t.close()


# steps after which the stored rows cannot have changed
READ_ONLY_STEPS = ('clock', 'begin', 'savepoint', 'release_sp', 'lookup', 'stored_key', 'check')


def pair_key(d):
    return (d[0], d[1])


def shrink(targets_by_name, seq, found, budget):
    """Delta debugging (ddmin) over the steps, then over the parts of episodes: the shortest
    sequence found within the budget that still shows a difference between the same two
    targets.  Runs on those two targets only."""
    a, b = found.diffs[0][0], found.diffs[0][1]
    kind = found.diffs[0][2]
    targets = [targets_by_name[a], targets_by_name[b]]
    pairs = [(a, b, kind)]
    deadline = time.time() + budget
    best = seq[:found.index + 1]
    best_found = found
    tests = [0]

    def fails(candidate):
        if time.time() > deadline:
            return None
        tests[0] += 1
        try:
            run_sequence(targets, pairs, candidate)
        except Difference as d:
            return d
        return None

    d0 = fails(best)
    if d0 is None:
        print('  the difference does not show again on %s and %s alone: not shrunk' % (a, b))
        return best, found, tests[0]
    best, best_found = best[:d0.index + 1], d0
    n = 2
    while len(best) >= 2 and time.time() < deadline:
        chunk = max(1, len(best) // n)
        reduced = False
        for start in range(0, len(best), chunk):
            candidate = best[:start] + best[start + chunk:]
            if not candidate:
                continue
            d = fails(candidate)
            if d is not None:
                best, best_found = candidate[:d.index + 1], d
                n = max(n - 1, 2)
                reduced = True
                break
            if time.time() > deadline:
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(len(best), n * 2)
    # the parts of the episodes that remain, and optional arguments of steps
    changed = True
    while changed and time.time() < deadline:
        changed = False
        for i, s in enumerate(best):
            for simpler in simplifications(s):
                candidate = best[:i] + [simpler] + best[i + 1:]
                d = fails(candidate)
                if d is not None:
                    best, best_found = candidate[:d.index + 1], d
                    changed = True
                    break
            if changed:
                break
    return best, best_found, tests[0]


def simplifications(s):
    """Simpler variants of one step."""
    out = []
    if s['op'] == 'episode':
        for part in ('holder', 'main'):
            for j in range(len(s[part])):
                if len(s[part]) > 1:
                    e = dict(s)
                    e[part] = s[part][:j] + s[part][j + 1:]
                    out.append(e)
        if s['end'] != 'commit':
            out.append(dict(s, end='commit'))
    for k in ('run_id', 'intent', 'intents', 'lease', 'fingerprint', 'coc', 'result', 'target_ref',
              'error', 'errors', 'results', 'target_refs', 'attempts'):
        if s.get(k) is not None:
            e = dict(s)
            del e[k]
            out.append(e)
    if s['op'] in ('create_scope', 'alter_scope') and s['opts']:
        for k in list(s['opts']):
            e = dict(s, opts={x: v for x, v in s['opts'].items() if x != k})
            if s['op'] == 'create_scope' or e['opts']:
                out.append(e)
    if s['op'] == 'batch' and len(s['keys']) > 1:
        for j in range(len(s['keys'])):
            e = dict(s, keys=s['keys'][:j] + s['keys'][j + 1:])
            for k in ('params', 'intents'):
                if s.get(k) is not None:
                    e[k] = s[k][:j] + s[k][j + 1:]
            out.append(e)
    if s['op'] == 'begin' and (s.get('iso') != 'read committed' or s.get('ro')):
        out.append({'op': 'begin', 'iso': 'read committed', 'ro': False})
    return out


def describe(step):
    return json.dumps(step, ensure_ascii=True)


def print_difference(d, header):
    print(header)
    print('  step %d: %s' % (d.index, describe(d.step)))
    for a, b, kind, what, (path, x, y) in d.diffs:
        print('  %s differs between %s and %s (%s), at %s:' % (what, a, b,
              'a batch against its reference' if kind == 'batch' else 'C edition against managed', path or '(top)'))
        print('    %-9s %s' % (a + ':', short(x)))
        print('    %-9s %s' % (b + ':', short(y)))
    for name, ans in d.answers.items():
        print('  answer of %s: %s' % (name, short(strip(ans), 1500)))


def print_sql(d, names):
    """The sequence as the SQL each target ran, to paste into psql (session B, the holder, in a
    second psql where it appears)."""
    for name in names:
        log = d.logs.get(name)
        if log is None:
            continue
        print('-- ---- %s (%s) ----' % (name, 'C edition' if name.startswith('c') else
                                          'managed edition'))
        two = any(role == 'B' for role, _, _ in log)
        current = None
        for role, sql, note in log:
            if two and role != current:
                print('-- [session %s]' % role)
                current = role
            if sql is None:
                print('-- %s' % note)
                continue
            comment = '   -- %s' % note if note else ''
            print('%s;%s' % (sql, comment))


# ---------------------------------------------------------------------------------------------
# The known defects' scenarios, as sequences (see test/differential/README-like notes in
# docs/internals.md): each must show no difference once its defect is fixed
# ---------------------------------------------------------------------------------------------

SCENARIOS = {
    # claim_batch reads its scope before the lock claim() takes
    'batch-reads-scope-before-lock': [
        {'op': 'create_scope', 'name': 'h', 'opts': {}},
        {'op': 'episode', 'holder': [{'op': 'alter_scope', 'name': 'h', 'opts': {'hash_keys': True}}],
         'main': [{'op': 'batch', 'scope': 'h', 'keys': ['alice@example.com'], 'wait': True}],
         'end': 'commit'},
        {'op': 'claim', 'scope': 'h', 'key': 'alice@example.com', 'params': None, 'wait': True},
    ],
    # a repeated key compared with its first occurrence instead of the stored request
    'batch-duplicate-vs-stored': [
        {'op': 'create_scope', 'name': 's', 'opts': {}},
        {'op': 'claim', 'scope': 's', 'key': 'order-7', 'params': '{"amount": 10}', 'wait': True, 'coc': True},
        {'op': 'batch', 'scope': 's', 'keys': ['order-7', 'order-7'], 'params': [None, '{"amount": 99}'],
         'wait': True},
    ],
    # E' \t\n\r\f\v' (\v is the letter v in PostgreSQL) in the managed edition's blank checks
    'blank-key-v': [
        {'op': 'create_scope', 'name': 's', 'opts': {}},
        {'op': 'claim', 'scope': 's', 'key': 'v', 'params': None, 'wait': True},
        {'op': 'claim', 'scope': 's', 'key': '\x0b', 'params': None, 'wait': True},
    ],
    # the managed edition's advisory lock key is a 32-bit hash: a colliding key looks busy
    'advisory-lock-collision': [
        {'op': 'create_scope', 'name': 's1', 'opts': {}},
        {'op': 'episode', 'holder': [{'op': 'claim', 'scope': 's1', 'key': 'key-723', 'params': None, 'wait': True}],
         'main': [{'op': 'claim', 'scope': 's1', 'key': 'key-94668', 'params': None, 'wait': False}],
         'end': 'commit'},
    ],
}


# --without: sequences that do not touch a known defect, to look past it while it is fixed
BLANKISH = {'v', 'vv', '\x0b'}


def without(seq, what):
    """seq with the steps that reach the defects named in what changed so that they do not."""
    def fix(s):
        if isinstance(s, list):
            return [fix(x) for x in s]
        if not isinstance(s, dict):
            return s
        s = {k: fix(v) for k, v in s.items()}
        if 'blank-v' in what:
            for f in ('scope', 'name'):
                if s.get(f) in BLANKISH:
                    s[f] = 'nope'
            if s.get('key') in BLANKISH:
                s['key'] = 'k1'
            if isinstance(s.get('keys'), list):
                s['keys'] = ['k1' if k in BLANKISH else k for k in s['keys']]
        if 'collisions' in what:
            second = {b: 'k3' for pairs in COLLIDING.values() for _, b in pairs}
            if s.get('key') in second:
                s['key'] = second[s['key']]
            if isinstance(s.get('keys'), list):
                s['keys'] = [second.get(k, k) for k in s['keys']]
        if 'dup-params' in what and s.get('op') == 'batch' and s.get('params') and s.get('keys'):
            # a later occurrence of a key with params on one side only takes the first's params
            first = {}
            params = list(s['params'])
            for i, k in enumerate(s['keys']):
                if k in first and (params[i] is None) != (params[first[k]] is None):
                    params[i] = params[first[k]]
                first.setdefault(k, i)
            s['params'] = params
        if 'replay-lock' in what and s.get('op') == 'episode':
            # the holder claims one by one: a replay its batch answers leaves no row lock
            s['holder'] = [dict(h, op='claim', key=h['keys'][0], params=(h.get('params') or [None])[0])
                           if h.get('op') == 'batch' and h.get('keys') else h for h in s['holder']]
        if 'hash-race' in what and s.get('op') == 'episode':
            for h in s['holder']:
                if h.get('op') == 'alter_scope' and 'hash_keys' in h.get('opts', {}):
                    h['opts'] = dict(h['opts'])
                    del h['opts']['hash_keys']
                    h['opts'].setdefault('lease', '5 minutes')
        return s
    return [fix(s) for s in seq]


WITHOUT = ['blank-v', 'collisions', 'dup-params', 'hash-race', 'replay-lock']


# the --without that keeps the random runs away from what each scenario shows
SCENARIO_WITHOUT = {'batch-reads-scope-before-lock': 'hash-race', 'batch-duplicate-vs-stored': 'dup-params',
                    'blank-key-v': 'blank-v', 'advisory-lock-collision': 'collisions'}

# documented differences (see EXCLUDED in the module's doc): every generated sequence avoids them
DOCUMENTED = ['replay-lock']


def check_servers(host, port_c, port_m, c_dbs):
    """The C library is not in the managed server, and the C server's sweepers serve the test's
    C databases and nothing else (idempo.databases): they record those databases' conflicts.
    Returns what is wrong."""
    wrong = []
    conn = connect(host, port_m, 'postgres', 'differential check')
    loaded = conn.execute("SELECT current_setting('shared_preload_libraries'), "
                          "(SELECT count(*) FROM pg_settings WHERE name LIKE 'idempo.%')").fetchone()
    conn.close()
    if 'idempo' in loaded[0] or loaded[1]:
        wrong.append('the managed server has the C library loaded (%s)' % loaded[0])
    if not c_dbs:
        return wrong
    conn = connect(host, port_c, c_dbs[0], 'differential check')
    every = ['diff_' + n.replace('-', '_') for n in TARGETS if n.startswith('c')]
    served = None
    for _ in range(1200):           # the launcher starts a sweeper for a new database soon
        served = sorted(r[0] for r in conn.execute(
            "SELECT d.datname FROM idempo.workers() w JOIN pg_database d ON d.oid = w.database_id "
            "WHERE w.kind = 'sweeper'").fetchall())
        if set(c_dbs) <= set(served) <= set(every):
            break
        time.sleep(0.05)
    conn.close()
    if not set(c_dbs) <= set(served) <= set(every):
        wrong.append('the C server\'s sweepers serve %s, not the test\'s C databases %s' % (served, sorted(c_dbs)))
    return wrong


def check_collisions(host, port):
    conn = connect(host, port, 'postgres', 'differential check')
    bad = []
    for scope, pairs in COLLIDING.items():
        for k1, k2 in pairs:
            h1, h2 = conn.execute("SELECT hashtext(%s || E'\\x1f' || %s), hashtext(%s || E'\\x1f' || %s)",
                                  (scope, k1, scope, k2)).fetchone()
            if h1 != h2:
                bad.append('%s: %s %s' % (scope, k1, k2))
    conn.close()
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--host', required=True, help='the socket directory of both servers')
    ap.add_argument('--port-c', type=int, required=True, help="the C edition's server")
    ap.add_argument('--port-m', type=int, required=True, help="the managed edition's server")
    ap.add_argument('--seed', type=int, default=1, help='the first run\'s seed (the next runs: +1 each)')
    ap.add_argument('--steps', type=int, default=3000, help='steps per run')
    ap.add_argument('--runs', type=int, default=1, help='runs, of consecutive seeds')
    ap.add_argument('--targets', default=','.join(TARGETS),
                    help='comma-separated, of %s (default: all)' % ', '.join(TARGETS))
    ap.add_argument('--budget', type=float, default=300, help='seconds for all runs (a run in progress stops)')
    ap.add_argument('--shrink-budget', type=float, default=240, help='seconds for shrinking a difference')
    ap.add_argument('--scenario', default='all',
                    help='the known defects\' scenarios to run first: a name, "all" or "none" (%s)' % ', '.join(SCENARIOS))
    ap.add_argument('--keep-going', action='store_true', help='go on with the next run after a difference')
    ap.add_argument('--no-shrink', action='store_true')
    ap.add_argument('--without', default='',
                    help='comma-separated known defects the sequences keep away from, to look past them '
                         'while they are fixed: %s' % ', '.join(WITHOUT))
    ap.add_argument('--stats', action='store_true', help='print what the steps answered (of the first target)')
    ap.add_argument('--print-sequence', action='store_true', help='print the generated sequence and stop')
    args = ap.parse_args()

    names = [n.strip() for n in args.targets.split(',') if n.strip()]
    for n in names:
        if n not in TARGETS:
            ap.error('unknown target %s' % n)
    avoid = [w.strip() for w in args.without.split(',') if w.strip()]
    for w in avoid:
        if w not in WITHOUT:
            ap.error('unknown --without %s' % w)

    def generate(seed):
        seq = Gen(seed).sequence(args.steps)
        return without(seq, avoid + [w for w in DOCUMENTED if w not in avoid])

    if args.print_sequence:
        for s in generate(args.seed):
            print(describe(s))
        return 0
    targets = []
    for n in TARGETS:
        if n in names:
            port = args.port_c if n.startswith('c') else args.port_m
            targets.append(Target(n, args.host, port, 'diff_c_template' if n.startswith('c') else 'diff_m_template'))
    pairs = [p for p in PAIRS if p[0] in names and p[1] in names]
    if not pairs:
        ap.error('no pair of targets to compare: name at least two of one pair (%s)' %
                 ', '.join('%s/%s' % (a, b) for a, b, _ in PAIRS))
    for t in targets:
        t.create()
    by_name = {t.name: t for t in targets}
    wrong = check_servers(args.host, args.port_c, args.port_m, [t.db for t in targets if t.edition == 'c'])
    for w in wrong:
        print('FAILED: %s' % w)
    bad = check_collisions(args.host, args.port_m)
    if bad:
        print('warning: these key pairs do not collide in hashtext() here: %s' % ', '.join(bad))
    print('targets: %s; pairs compared: %s' % (', '.join(names), ', '.join('%s/%s' % (a, b) for a, b, _ in pairs)))

    passed, failed = (0, len(wrong)) if wrong else (1, 0)      # the servers' check counts as one
    start = time.time()
    deadline = start + args.budget

    def report(title, seq, d):
        print_difference(d, '\nDIFFERENCE: %s' % title)
        if args.no_shrink:
            return
        t0 = time.time()
        small, sd, tests = shrink(by_name, seq, d, args.shrink_budget)
        print('\nshrunk from %d to %d steps (%d runs, %.0f s); the short sequence:' %
              (d.index + 1, len(small), tests, time.time() - t0))
        for i, s in enumerate(small):
            print('  %d: %s' % (i, describe(s)))
        print_difference(sd, 'its difference:')
        print('\nas SQL (each target\'s own statements; "-- the reference" marks a batch replaced by '
              'its reference; session B is a second psql):')
        print_sql(sd, [sd.diffs[0][0], sd.diffs[0][1]])

    scenarios = [] if args.scenario == 'none' else (list(SCENARIOS) if args.scenario == 'all' else [args.scenario])
    for name in scenarios:
        if name not in SCENARIOS:
            ap.error('unknown scenario %s' % name)
        try:
            run_sequence(targets, pairs, SCENARIOS[name])
            print('scenario %s: no difference' % name)
            passed += 1
        except Difference as d:
            failed += 1
            report('scenario %s' % name, SCENARIOS[name], d)
            # the random runs look past it: they would find it again first
            if SCENARIO_WITHOUT[name] not in avoid:
                avoid.append(SCENARIO_WITHOUT[name])
    if failed:
        print('\nthe random runs keep away from what the failed scenarios show: --without %s' % ','.join(avoid))

    for run in range(args.runs):
        seed = args.seed + run
        if time.time() > deadline:
            print('time budget spent: %d of %d runs not started' % (args.runs - run, args.runs))
            break
        seq = generate(seed)
        t0 = time.time()
        stats = {} if args.stats else None
        try:
            done = run_sequence(targets, pairs, seq, deadline, stats=stats,
                                progress=lambda i: print('  seed %d: %d steps' % (seed, i), flush=True))
            print('seed %d: no difference in %d steps (%.0f s)%s' % (
                seed, done, time.time() - t0, '' if done == len(seq) else ', stopped by the time budget'))
            passed += 1
            for k in sorted(stats or {}):
                print('  %5d  %s' % (stats[k], k))
        except Difference as d:
            failed += 1
            report('seed %d (--seed %d --steps %d --targets %s%s), after %.0f s' %
                   (seed, seed, args.steps, ','.join(names), ' --without ' + ','.join(avoid) if avoid else '',
                    time.time() - t0), seq, d)
            if not args.keep_going:
                break
    print('%d passed, %d failed' % (passed, failed))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
