#!/usr/bin/env python3
"""The order -> warehouse story, with the faults the field sees.

An approved order must create exactly one outbound shipment in the warehouse, a separate system
(its own database and connection).  A workflow runner consumes "order approved" events and, for
each, claims the business action in the orders database (idempo), calls the warehouse, and
completes the claim with the shipment id.  It only uses idempo's SQL API.

    idempo_demo.py scenarios   the named scenarios, each checked (exit 1 if one fails)
    idempo_demo.py chaos       many orders, concurrent workers, random faults, a kill -9 of the
                               postmaster; checks the warehouse at the end (exit 1 on a violation)

Connection settings come from the environment (see test/demo/run): DEMO_HOST, DEMO_PORT,
DEMO_REPLICA_PORT, DEMO_PGDATA (for the chaos mode's kill -9), DEMO_PGBIN; DEMO_USER and DEMO_ORDERS_DB
(managed/run: the managed edition's chaos run as a role that is not a superuser).
"""
import argparse
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import psycopg

HOST = os.environ.get('DEMO_HOST', '/tmp')
PORT = os.environ.get('DEMO_PORT', '5432')
REPLICA_PORT = os.environ.get('DEMO_REPLICA_PORT', '5433')
USER = os.environ.get('DEMO_USER', 'postgres')              # managed/run: a role that is not a superuser
ORDERS_DB = os.environ.get('DEMO_ORDERS_DB', 'orders')      # managed/run: the database pg_cron serves
SCOPE = 'warehouse.outbound'            # the warehouse honours our idempotency key
LEGACY = 'warehouse.outbound.legacy'    # it does not; lookups go through a lagging replica
HOOKS = 'warehouse.outbound.hooks'      # webhooks with a delivery time inside; keys remembered a year


def connect(dbname, port=PORT, **kw):
    return psycopg.connect(host=HOST, port=port, user=USER, dbname=ORDERS_DB if dbname == 'orders' else dbname,
                           autocommit=True, connect_timeout=5, **kw)


def one(conn, sql, params=()):
    row = conn.execute(sql, params).fetchone()
    return row[0] if row and len(row) == 1 else row


@dataclass
class Event:
    """An "order approved" webhook delivery."""
    order_id: int
    sku: str
    qty: int
    delivery: str
    intent_at: str = None          # when the order was approved (ISO), None: now
    legacy: bool = False           # route to the warehouse API without keys
    delivered_at: str = None       # the sender's delivery time, inside the payload (HOOKS scope)

    @property
    def scope(self):
        return HOOKS if self.delivered_at else LEGACY if self.legacy else SCOPE

    @property
    def key(self):
        return f'order-{self.order_id}/shipment-1'

    @property
    def params(self):
        p = {'order_id': self.order_id, 'sku': self.sku, 'qty': self.qty}
        if self.delivered_at:
            p['delivered_at'] = self.delivered_at
        return json.dumps(p)


class LostReply(Exception):
    """The warehouse acted, but its reply never arrived (or the worker died before recording it)."""


@dataclass
class Faults:
    lose_reply: bool = False       # after the warehouse call, before complete()
    die_before_commit: bool = False  # in the claim's transaction, before it commits


@dataclass
class Outcome:
    handled: str                   # what the runner did
    shipment: int = None
    detail: str = ''


class Runner:
    """The workflow runner: one per worker, with its own connections."""

    def __init__(self, name):
        self.name = name
        self.orders = connect('orders', application_name=f'runner {name}')
        self.warehouse = connect('warehouse', application_name=f'runner {name}')
        self.replica = connect('warehouse', port=REPLICA_PORT, application_name=f'runner {name}')

    def close(self):
        for c in (self.orders, self.warehouse, self.replica):
            c.close()

    # -- the warehouse, as seen from the workflow --
    def call_warehouse(self, ev):
        if ev.legacy or ev.delivered_at:
            return one(self.warehouse, 'SELECT create_shipment(%s, %s, %s)', (ev.order_id, ev.sku, ev.qty))
        return one(self.warehouse, 'SELECT create_shipment_idempotent(%s, %s, %s, %s)',
                   (ev.key, ev.order_id, ev.sku, ev.qty))

    def look_up_shipment(self, ev):
        """Mode (a): by idempotency key on the warehouse; mode (b): by order on a lagging replica."""
        if ev.legacy:
            return one(self.replica, 'SELECT min(id) FROM shipments WHERE order_id = %s', (ev.order_id,))
        return one(self.warehouse, 'SELECT id FROM shipments WHERE idempotency_key = %s', (ev.key,))

    # -- one delivery --
    def handle(self, ev, faults=Faults()):
        claim = self.orders.execute(
            'SELECT outcome::text, attempt, result, target_ref FROM idempo.claim(%s, %s, %s::jsonb, '
            'run_id => %s, intent_at => %s)', (ev.scope, ev.key, ev.params, ev.delivery, ev.intent_at)).fetchone()
        outcome, attempt, result, target_ref = claim
        if outcome == 'acquired':
            shipment = self.call_warehouse(ev)
            if faults.lose_reply:
                raise LostReply(f'shipment {shipment} created, reply lost')
            self.orders.execute('SELECT idempo.complete(%s, %s, %s, %s::jsonb, %s)',
                                (ev.scope, ev.key, attempt, json.dumps({'shipment_id': shipment}), str(shipment)))
            return Outcome('shipped', shipment)
        if outcome == 'replay':
            return Outcome('replayed', int(target_ref) if target_ref else None)
        if outcome == 'expired':
            # it finished long ago, its stored result is gone: do not execute again
            return Outcome('expired', int(target_ref) if target_ref else None,
                           f'(shipment {target_ref}, result no longer stored)')
        if outcome == 'unknown':
            # "I did not hear success" is not "it did not happen": look it up first
            found = self.look_up_shipment(ev)
            # the lookup was made for this attempt: verify names it (a later attempt is fenced off)
            status = one(self.orders, 'SELECT idempo.verify(%s, %s, %s, %s, %s)::text',
                         (ev.scope, ev.key, attempt, found is not None, str(found) if found else None))
            return Outcome(f'verified ({status})', found,
                           'found in the warehouse' if found else 'lookup empty')
        # busy: another worker has it; conflict / in_review / stale: a person decides
        return Outcome(outcome)

    def handle_in_one_transaction(self, ev, faults=Faults()):
        """The in-transaction pattern: reserve stock in the orders database, claimed in the same transaction."""
        with self.orders.transaction():
            outcome = one(self.orders, "SELECT outcome::text FROM idempo.claim('stock.reserve', %s, %s::jsonb, "
                          "run_id => %s, complete_on_commit => true)",
                          (f'order-{ev.order_id}/reserve', ev.params, ev.delivery))
            if outcome == 'acquired':
                self.orders.execute('UPDATE stock SET reserved = reserved + %s WHERE sku = %s', (ev.qty, ev.sku))
            if faults.die_before_commit:
                raise LostReply('worker died before the commit')
        return outcome


# ---------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------

def shipments_of(conn, order_id):
    return one(conn, 'SELECT count(*) FROM shipments WHERE order_id = %s', (order_id,))


def wait_until(conn, sql, params=(), timeout=30, what='condition'):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if one(conn, sql, params):
            return
        time.sleep(0.05)
    raise AssertionError(f'timed out waiting for {what}')


def wait_lease(conn, scope, key):
    # the background worker may already have made it unknown (and cleared the lease)
    wait_until(conn, "SELECT status <> 'in_progress' OR lease_expires_at <= idempo.now() "
                     "FROM idempo.lookup(%s, %s)", (scope, key), what='the lease to run out')


class Report:
    def __init__(self):
        self.failed = []
        self.faults = 0
        self.deliveries = 0

    def step(self, number, title):
        print(f'\n\033[1m{number}. {title}\033[0m')

    def line(self, what, value=''):
        print(f'   {what:<58} {value}')

    def check(self, ok, claim):
        print(f'   {"✓" if ok else "✗ FAILED:"} {claim}')
        if not ok:
            self.failed.append(claim)


def scenarios():
    rep = Report()
    a, b = Runner('A'), Runner('B')
    wh = connect('warehouse')
    orders = connect('orders')

    def deliver(runner, ev, faults=Faults()):
        rep.deliveries += 1
        try:
            out = runner.handle(ev, faults)
        except LostReply as e:
            rep.faults += 1
            out = Outcome('(fault) ' + str(e))
        rep.line(f'{ev.delivery} on runner {runner.name}', f'{out.handled} {out.detail}'.strip())
        return out

    rep.step(1, 'Webhook redelivered twice, concurrently on two workers')
    ev = Event(1001, 'SKU-1', 2, 'delivery-1')
    results = {}
    threads = [threading.Thread(target=lambda r=r, d=d: results.__setitem__(d, r.handle(Event(1001, 'SKU-1', 2, d))))
               for r, d in ((a, 'delivery-1'), (b, 'delivery-2'))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rep.deliveries += 2
    for d, out in sorted(results.items()):
        rep.line(d, out.handled)
    deliver(a, Event(1001, 'SKU-1', 2, 'delivery-3'))
    rep.check(shipments_of(wh, 1001) == 1, 'the warehouse has exactly one shipment for order 1001')
    rep.check(sorted(o.handled for o in results.values()) in (['replayed', 'shipped'], ['busy', 'shipped']),
              'one delivery shipped, the concurrent one was recognised (replay, or busy while in flight)')
    for row in orders.execute("SELECT run_id, outcome::text, coalesce(from_status::text, '-'), to_status::text "
                              "FROM idempo.events WHERE key = 'order-1001/shipment-1' AND action = 'claim' ORDER BY id"):
        rep.line(f'   event: {row[0]}', f'{row[1]} ({row[2]} -> {row[3]})')

    rep.step(2, 'The warehouse created the shipment, the reply was lost, the worker died before complete()')
    ev = Event(1002, 'SKU-2', 1, 'delivery-1')
    deliver(a, ev, Faults(lose_reply=True))
    rep.line('warehouse shipments for order 1002', shipments_of(wh, 1002))
    rep.line('waiting for the lease (2 s) to run out ...')
    wait_lease(orders, SCOPE, ev.key)
    out = deliver(b, Event(1002, 'SKU-2', 1, 'delivery-2'))
    rep.check(out.handled.startswith('verified (succeeded)'), 'the redelivery got unknown, looked it up and verified it')
    out = deliver(a, Event(1002, 'SKU-2', 1, 'delivery-3'))
    rep.check(out.handled == 'replayed', 'a later delivery replays the shipment id')
    rep.check(shipments_of(wh, 1002) == 1, 'no second shipment for order 1002')

    rep.step(3, 'The same against the warehouse without keys, looked up on a lagging replica')
    ev = Event(1003, 'SKU-3', 1, 'delivery-1', legacy=True)
    deliver(a, ev, Faults(lose_reply=True))
    wait_lease(orders, LEGACY, ev.key)
    out = deliver(b, Event(1003, 'SKU-3', 1, 'delivery-2', legacy=True))
    lag_hidden = out.detail == 'lookup empty'
    rep.line('replica lookup right after the lease', out.detail)
    rep.check(one(orders, "SELECT status::text FROM idempo.lookup(%s, 'order-1003/shipment-1')", (LEGACY,))
              in ('unknown', 'succeeded'), 'an empty lookup inside the settle window did not make it retryable')
    out = deliver(a, Event(1003, 'SKU-3', 1, 'delivery-3', legacy=True))
    rep.line('status after that delivery', one(orders, "SELECT status::text FROM idempo.lookup(%s, 'order-1003/shipment-1')", (LEGACY,)))
    wait_until(wh_replica := connect('warehouse', port=REPLICA_PORT),
               'SELECT count(*) > 0 FROM shipments WHERE order_id = 1003', what='the replica to catch up')
    wh_replica.close()
    out = deliver(b, Event(1003, 'SKU-3', 1, 'delivery-4', legacy=True))
    rep.check(out.handled in ('verified (succeeded)', 'replayed'), 'once the replica caught up, it was verified')
    rep.check(shipments_of(wh, 1003) == 1, 'no second shipment for order 1003' + (' (the lag was real)' if lag_hidden else ''))

    rep.step(4, 'A worker crashed before the claim committed')
    ev = Event(1004, 'SKU-4', 3, 'delivery-1')
    victim = connect('orders', application_name='doomed worker')
    victim.execute('BEGIN')
    victim.execute("SELECT idempo.claim(%s, %s, %s::jsonb, run_id => 'delivery-1')", (ev.scope, ev.key, ev.params))
    orders.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'doomed worker'")
    rep.faults += 1
    rep.deliveries += 1
    rep.line('delivery-1 on a doomed worker', 'claimed, then its backend was terminated')
    out = deliver(a, Event(1004, 'SKU-4', 3, 'delivery-2'))
    rep.check(out.handled == 'shipped', 'the next delivery acquired the key and shipped')
    rep.check(shipments_of(wh, 1004) == 1, 'exactly one shipment for order 1004')

    rep.step(5, 'The same order redelivered with a changed quantity')
    deliver(a, Event(1005, 'SKU-5', 1, 'delivery-1'))
    out = deliver(b, Event(1005, 'SKU-5', 4, 'delivery-2'))
    rep.check(out.handled == 'conflict', 'the changed request is a conflict, not a second shipment')
    row = orders.execute("SELECT occurrences, changed_fields::text FROM idempo.conflict_queue "
                         "WHERE key = 'order-1005/shipment-1'").fetchone()
    rep.line('the reviewer sees what changed', row[1] if row else '-')
    rep.check(row is not None and '"qty"' in row[1], 'the conflict is recorded with both versions')
    rep.check(shipments_of(wh, 1005) == 1, 'nothing shipped twice')

    rep.step(6, 'A redelivery days later, after its record may have been purged')
    out = deliver(a, Event(1006, 'SKU-6', 1, 'delivery-1', intent_at='2026-01-01T10:00:00Z'))
    rep.check(out.handled == 'stale', 'stale: not executed')
    rep.check(one(orders, "SELECT count(*) FROM idempo.review_queue WHERE key = 'order-1006/shipment-1' "
                          "AND reason = 'stale_retry'") == 1, 'a review is open for a person')
    rep.check(shipments_of(wh, 1006) == 0, 'nothing shipped')

    rep.step(7, 'Work left unfinished past retention reaches a person without anyone calling sweep()')
    orders.execute("SELECT idempo.claim('warehouse.returns', 'return-77', run_id => 'delivery-1')")
    rep.line('return-77 claimed, then the worker vanished')
    wait_until(orders, "SELECT count(*) > 0 FROM idempo.review_queue WHERE key = 'return-77'", timeout=30,
               what='the background worker to move return-77 to review')
    waited = one(orders, "SELECT reason || ', waiting ' || date_trunc('second', waiting)::text "
                         "FROM idempo.review_queue WHERE key = 'return-77'")
    rep.check(True, f'the background worker moved it to review_queue ({waited})')
    status = one(orders, "SELECT idempo.resolve('warehouse.returns', 'return-77', 'not_executed', 'rita', "
                         "note => 'no return label was printed')::text")
    rep.check(status == 'retryable', "the reviewer resolved it: not executed, may run again")

    rep.step(8, 'An old copy of the flow still running against a retired scope')
    try:
        a.orders.execute("SELECT idempo.claim('warehouse.outbound.v1', 'order-1008/shipment-1')")
        rep.check(False, 'refused')
    except psycopg.Error as e:
        rep.line('refused', f'{e.sqlstate}: {e.diag.message_primary}')
        rep.check('team-logistics' in e.diag.message_primary, "refused, naming the scope's owner")

    rep.step(9, 'The in-transaction pattern: reserve stock and claim it in one transaction')
    ev = Event(1009, 'SKU-9', 5, 'delivery-1')
    try:
        a.handle_in_one_transaction(ev, Faults(die_before_commit=True))
    except LostReply:
        rep.faults += 1
    rep.line('delivery-1', 'died before the commit: claim and reservation both rolled back')
    rep.line('delivery-2', a.handle_in_one_transaction(Event(1009, 'SKU-9', 5, 'delivery-2')))
    rep.line('delivery-3', a.handle_in_one_transaction(Event(1009, 'SKU-9', 5, 'delivery-3')))
    rep.deliveries += 3
    rep.check(one(orders, "SELECT reserved FROM stock WHERE sku = 'SKU-9'") == 5, 'stock reserved exactly once')

    rep.step(10, 'A webhook redelivered with a new delivered_at, then again a month after its result expired')
    # the sender puts its delivery time in the payload: the scope leaves it out of the fingerprint
    # (fingerprint_ignore), and remembers the key for a year after the result expires (remember);
    # the warehouse API here has no keys, so a second execution would be a second shipment
    deliver(a, Event(1010, 'SKU-10', 2, 'delivery-1', delivered_at='2026-11-30T10:00:00Z'))
    out = deliver(b, Event(1010, 'SKU-10', 2, 'delivery-2', delivered_at='2026-11-30T10:05:00Z'))
    rep.check(out.handled == 'replayed', 'only delivered_at changed: replayed, not a conflict')
    a.orders.execute("SET idempo.clock_offset = '38 days'")   # time travel: the result expired after 7 days
    rep.line('a month later (idempo.clock_offset = 38 days)')
    out = deliver(a, Event(1010, 'SKU-10', 2, 'delivery-3', delivered_at='2027-01-07T09:00:00Z'))
    row = one(a.orders, "SELECT status || ', target_ref ' || target_ref || ', result ' "
                        "|| coalesce(result::text, 'gone') FROM idempo.lookup(%s, 'order-1010/shipment-1')", (HOOKS,))
    a.orders.execute('RESET idempo.clock_offset')
    rep.line('idempo.lookup shows the remembered key', row)
    rep.check(out.handled == 'expired', "the redelivery answers 'expired': it finished, do not execute again")
    rep.check(shipments_of(wh, 1010) == 1, 'nothing shipped again for order 1010')

    summary(rep, orders, wh)
    a.close()
    b.close()
    if rep.failed:
        print(f'\nverdict: {len(rep.failed)} scenario check(s) FAILED')
        return 1
    print('\nverdict: every order shipped at most once; doubt and conflicts are waiting for a person')
    return 0


def summary(rep, orders, wh):
    print('\n\033[1mSummary\033[0m')
    rep.line('deliveries', rep.deliveries)
    rep.line('faults injected', rep.faults)
    per_order = wh.execute('SELECT order_id, count(*) FROM shipments GROUP BY order_id ORDER BY order_id').fetchall()
    rep.line('orders with a shipment', len(per_order))
    rep.line('orders with more than one shipment', sum(1 for _, n in per_order if n > 1))
    print('   open reviews:')
    for row in orders.execute("SELECT scope, key, reason, date_trunc('second', waiting)::text FROM idempo.review_queue"):
        print(f'     {row[0]:<28} {row[1]:<28} {row[2]:<20} waiting {row[3]}')
    print('   open conflicts:')
    for row in orders.execute('SELECT scope, key, occurrences FROM idempo.conflict_queue'):
        print(f'     {row[0]:<28} {row[1]:<28} seen {row[2]} time(s)')


# ---------------------------------------------------------------------------------------------
# Chaos
# ---------------------------------------------------------------------------------------------

def kill_postmaster_and_restart():
    """kill -9 of the postmaster, then start it again once its children are gone."""
    pgdata = os.environ['DEMO_PGDATA']
    pgbin = os.environ['DEMO_PGBIN']  # test/demo/run: the server under test's bindir
    pid = int(open(os.path.join(pgdata, 'postmaster.pid')).readline())
    children = subprocess.run(['pgrep', '-P', str(pid)], capture_output=True, text=True).stdout.split()
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 60
    while time.time() < deadline and any(os.path.exists(f'/proc/{c}') for c in children):
        time.sleep(0.05)
    subprocess.run([f'{pgbin}/pg_ctl', '-D', pgdata, '-l', os.path.join(pgdata, '..', 'server.log'),
                    '-w', '-t', '120', 'start'], check=True, stdout=subprocess.DEVNULL)


def chaos(args):
    rnd = random.Random(args.seed)
    orders_n = args.orders
    events = queue.Queue()
    stats = {'deliveries': 0, 'lost_replies': 0, 'terminated_sessions': 0,
             'duplicates': 0, 'changed': 0, 'reconnects': 0, 'outcomes': {}}
    lock = threading.Lock()
    changed_deliveries = []   # (scope, key, params) that differ from the first version

    setup = connect('orders')
    setup.execute('INSERT INTO orders SELECT i, %s || (1 + i %% 20), 1 + i %% 5 FROM generate_series(1, %s) i',
                  ('SKU-', orders_n))

    # the stream: every order at least once, plus duplicates, changed copies, in shuffled order
    stream = []
    for i in range(1, orders_n + 1):
        legacy = i % 3 == 0
        sku, qty = f'SKU-{1 + i % 20}', 1 + i % 5
        copies = 1 + (rnd.random() < args.duplicates) + (rnd.random() < args.duplicates / 2)
        for c in range(copies):
            stream.append(Event(i, sku, qty, f'd{i}-{c}', legacy=legacy))
        if rnd.random() < 0.01:
            ev = Event(i, sku, qty + 1, f'd{i}-changed', legacy=legacy)
            stream.append(ev)
            changed_deliveries.append(ev)
    rnd.shuffle(stream)
    for ev in stream:
        events.put(ev)
    total = len(stream)
    stats['duplicates'] = total - orders_n - len(changed_deliveries)
    stats['changed'] = len(changed_deliveries)
    crash_at = total // 2 if args.kill_postmaster else None
    crashed = threading.Event()
    stop = threading.Event()

    def again(ev):
        """The event source redelivers a delivery that did not finish."""
        time.sleep(0.05)
        events.put(Event(ev.order_id, ev.sku, ev.qty, ev.delivery + "'", legacy=ev.legacy))

    def worker(n):
        runner = None
        while not stop.is_set():
            try:
                ev = events.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                if runner is None:
                    runner = Runner(f'w{n}')
                if rnd.random() < args.fault_rate / 4:
                    # an operator terminates this worker's session
                    with lock:
                        stats['terminated_sessions'] += 1
                    runner.orders.execute('SELECT pg_terminate_backend(pg_backend_pid())')
                out = runner.handle(ev, Faults(lose_reply=rnd.random() < args.fault_rate))
                kind = out.handled.split(' ')[0]
                with lock:
                    stats['outcomes'][kind] = stats['outcomes'].get(kind, 0) + 1
                if kind == 'busy' or out.handled == 'verified (unknown)':
                    again(ev)
            except LostReply:
                with lock:
                    stats['lost_replies'] += 1
                again(ev)
            except (psycopg.OperationalError, psycopg.InterfaceError):
                with lock:
                    stats['reconnects'] += 1
                if runner:
                    try:
                        runner.close()
                    except psycopg.Error:
                        pass
                runner = None
                time.sleep(0.2)
                again(ev)
            finally:
                with lock:
                    stats['deliveries'] += 1
                    d = stats['deliveries']
                events.task_done()
            if crash_at and d >= crash_at and not crashed.is_set():
                crashed.set()
                print(f'   ... kill -9 of the postmaster after {d} deliveries', flush=True)
                kill_postmaster_and_restart()
            if d % max(1, total // 10) == 0:
                print(f'   progress: {d} deliveries, {stats["lost_replies"]} replies lost, '
                      f'{stats["reconnects"]} reconnects', flush=True)
        if runner:
            runner.close()

    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.workers)]
    for t in threads:
        t.start()
    events.join()
    stop.set()
    for t in threads:
        t.join()

    # what a real event source does in the end: redeliver everything that is not finished,
    # after the leases ran out, until nothing changes (doubtful ones end in verify or review)
    check = connect('orders')
    for round_ in range(10):
        wait_until(check, "SELECT count(*) = 0 FROM idempo.operations WHERE scope IN (%s, %s) "
                   "AND (status = 'in_progress' AND lease_expires_at > idempo.now() "
                   "     OR status = 'unknown' AND last_attempt_at > idempo.now() - interval '10 seconds')",
                   (SCOPE, LEGACY), timeout=60, what='leases and settle windows to pass')
        pending = check.execute(
            "SELECT scope, key FROM idempo.operations WHERE scope IN (%s, %s) "
            "AND status IN ('in_progress', 'retryable', 'unknown')", (SCOPE, LEGACY)).fetchall()
        if not pending:
            break
        runner = Runner('drain')
        for scope, key in pending:
            order_id = int(key.split('-')[1].split('/')[0])
            row = check.execute('SELECT sku, qty FROM orders WHERE id = %s', (order_id,)).fetchone()
            runner.handle(Event(order_id, row[0], row[1], f'drain-{round_}', legacy=scope == LEGACY))
            stats['deliveries'] += 1
        runner.close()
    elapsed = time.time() - t0

    # the verdict, from the warehouse's own tables
    wh = connect('warehouse')
    per_order = dict(wh.execute('SELECT order_id, count(*) FROM shipments GROUP BY order_id').fetchall())
    ops = {int(k.split('-')[1].split('/')[0]): s for k, s in check.execute(
        "SELECT key, status::text FROM idempo.operations WHERE scope IN (%s, %s)", (SCOPE, LEGACY)).fetchall()}
    doubled = [o for o, n in per_order.items() if n > 1]
    lost = [o for o in range(1, orders_n + 1)
            if per_order.get(o, 0) == 0 and ops.get(o) not in ('in_review', 'unknown', 'in_progress', 'retryable')]
    # whichever version arrived first was executed; the other one must be a recorded conflict
    unrecorded = [ev.key for ev in changed_deliveries
                  if one(check, "SELECT count(*) FROM idempo.conflicts c JOIN idempo.operations o USING (scope, key) "
                                "WHERE c.scope = %s AND c.key = %s AND c.incoming_fingerprint <> o.fingerprint "
                                "AND idempo.fingerprint(%s::jsonb) IN (c.incoming_fingerprint, o.fingerprint)",
                         (ev.scope, ev.key, ev.params)) == 0]
    inconsistent = one(check, 'SELECT count(*) FROM idempo.check_consistency()')
    in_doubt = sum(1 for o in range(1, orders_n + 1) if per_order.get(o, 0) == 0)
    print('\n\033[1mChaos run\033[0m')
    for k in ('deliveries', 'duplicates', 'changed', 'lost_replies', 'terminated_sessions', 'reconnects'):
        print(f'   {k:<40} {stats[k]}')
    print(f'   {"kill -9 of the postmaster":<40} {1 if crash_at else 0}')
    print(f'   {"outcomes":<40} {json.dumps(stats["outcomes"], sort_keys=True)}')
    print(f'   {"orders":<40} {orders_n}')
    print(f'   {"orders shipped exactly once":<40} {sum(1 for n in per_order.values() if n == 1)}')
    print(f'   {"orders not shipped (in review or doubt)":<40} {in_doubt}')
    print(f'   {"orders shipped twice":<40} {len(doubled)}')
    print(f'   {"orders lost (neither shipped nor visible)":<40} {len(lost)}')
    print(f'   {"changed deliveries not in idempo.conflicts":<40} {len(unrecorded)}')
    print(f'   {"consistency problems":<40} {inconsistent}')
    print(f'   {"time":<40} {elapsed:.1f} s')
    ok = not doubled and not lost and not unrecorded and inconsistent == 0
    print(f'\nverdict: {"OK" if ok else "VIOLATION"}: {len(doubled)} doubled, {len(lost)} lost, '
          f'{len(unrecorded)} unrecorded conflicts in {stats["deliveries"]} deliveries')
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = p.add_subparsers(dest='mode', required=True)
    sub.add_parser('scenarios')
    c = sub.add_parser('chaos')
    c.add_argument('--orders', type=int, default=300)
    c.add_argument('--workers', type=int, default=6)
    c.add_argument('--duplicates', type=float, default=0.5, help='chance of a redelivery per order')
    c.add_argument('--fault-rate', type=float, default=0.05, help='chance of a lost reply per delivery')
    c.add_argument('--seed', type=int, default=1)
    c.add_argument('--no-kill-postmaster', dest='kill_postmaster', action='store_false')
    args = p.parse_args()
    return scenarios() if args.mode == 'scenarios' else chaos(args)


if __name__ == '__main__':
    sys.exit(main())
