#!/usr/bin/env python3
"""The demo's chaos run against a Patroni cluster, with failovers that Patroni decides.

The workflow runner of test/demo/idempo_demo.py (claim in the orders database, call the
warehouse, complete) runs with its orders connection on a libpq multi-host connection string
(target_session_attrs=read-write) and the warehouse on a separate server that never fails over.
While it runs, faults hit the current leader:

    kill9       kill -9 of the leader's postmaster (Patroni fails over: primary_start_timeout 0);
                with --replication-stall S its walsenders are stopped S seconds first, so the
                commits of those seconds reached no standby (the window asynchronous
                replication loses)
    switchover  patronictl switchover
    stall       SIGSTOP of the leader's Patroni and PostgreSQL (a node cut off) until another
                node leads and the TTL has passed, then SIGCONT

Measured per fault: time to a new leader (REST /leader), until the new leader's sweeper has
done a round (idempo.workers()), until the old leader is back as a streaming replica (and
whether Patroni rewound it).  Watched all the time: no node in recovery runs an idempo
launcher or sweeper.  At the end, on the final leader and a replica: the demo's verdict, lost
writes the client saw acknowledged, check_consistency(), lookup and read-only claims on a
replica.

Prints "check: ok <what>" / "check: FAILED <what>" lines, the figures, and a last line
"figures: {json}".  Environment: see test/ha/run.
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
import urllib.request

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import idempo_demo as demo  # noqa: E402  (copied next to this file by test/ha/run)

ORDERS_DSN = os.environ['HA_ORDERS_DSN']          # multi-host, target_session_attrs=read-write
ORDERS_DB = psycopg.conninfo.conninfo_to_dict(ORDERS_DSN)['dbname']
WAREHOUSE_DSN = os.environ['HA_WAREHOUSE_DSN']
WORK = os.environ['HA_WORK']
NODES = os.environ.get('HA_NODES', 'node1 node2 node3').split()
PG_PORTS = [int(p) for p in os.environ['HA_NODE_PORTS'].split()]
REST_PORTS = [int(p) for p in os.environ['HA_REST_PORTS'].split()]
SYNC = os.environ.get('HA_SYNC', '1') == '1'
TTL = int(os.environ.get('HA_TTL', '12'))
PREPARE = os.environ.get('HA_PREPARE_THRESHOLD', '5')
PREPARE = None if PREPARE in ('', 'none') else int(PREPARE)
SCOPES = (demo.SCOPE, demo.LEGACY)

checks = []


def check(ok, what):
    checks.append((ok, what))
    print(f'check: {"ok" if ok else "FAILED"} {what}', flush=True)


def node_dsn(i, db=ORDERS_DB, timeout=2):
    return f'host=127.0.0.1 port={PG_PORTS[i]} user=postgres dbname={db} connect_timeout={timeout}'


def rest(i, endpoint):
    try:
        with urllib.request.urlopen(f'http://127.0.0.1:{REST_PORTS[i]}/{endpoint}', timeout=1) as r:
            return r.status
    except Exception as e:  # HTTPError carries the status; anything else: no answer
        return getattr(e, 'code', None)


def leader():
    for i in range(len(NODES)):
        if rest(i, 'leader') == 200:
            return i
    return None


def healthy():
    """A leader, both others streaming replicas, and (sync) a synchronous standby."""
    ld = leader()
    if ld is None:
        return False
    if any(rest(i, 'replica') != 200 for i in range(len(NODES)) if i != ld):
        return False
    if SYNC and not any(rest(i, 'sync') == 200 for i in range(len(NODES))):
        return False
    try:
        with psycopg.connect(node_dsn(ld, 'postgres'), autocommit=True) as c:
            return c.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").fetchone()[0] == 2
    except psycopg.Error:
        return False


def wait(cond, timeout, what, step=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v is not None and v is not False:   # a node index 0 is an answer
            return v
        time.sleep(step)
    raise TimeoutError(f'timed out after {timeout}s waiting for {what}')


def postmaster_pid(i):
    with open(os.path.join(WORK, NODES[i], 'data', 'postmaster.pid')) as f:
        return int(f.readline())


def children(pid):
    out = subprocess.run(['pgrep', '-P', str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def cmdline(pid):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().replace(b'\0', b' ').decode(errors='replace')
    except OSError:
        return ''


def signal_all(pids, sig):
    """Signals each process; one that has exited meanwhile is skipped."""
    for p in pids:
        try:
            if p:
                os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def parent(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def patroni_pid(i):
    with open(os.path.join(WORK, f'node{i + 1}.pid')) as f:
        return int(f.read().strip())


def sweeper_round_done(i):
    """The node is a primary and its sweeper of 'orders' has finished a round."""
    try:
        with psycopg.connect(node_dsn(i), autocommit=True) as c:
            return c.execute("SELECT NOT pg_is_in_recovery() AND EXISTS (SELECT FROM idempo.workers() "
                             "WHERE kind = 'sweeper' AND database_id = (SELECT oid FROM pg_database "
                             "WHERE datname = current_database()) AND rounds > 0)").fetchone()[0]
    except psycopg.Error:
        return False


def streaming_replica_workers(i):
    """(idempo workers,) on node i once it is in recovery and streaming; None before."""
    try:
        with psycopg.connect(node_dsn(i, 'postgres', 2), autocommit=True) as c:
            rec, streaming, n = c.execute(
                "SELECT pg_is_in_recovery(), EXISTS (SELECT FROM pg_stat_wal_receiver WHERE status = 'streaming'), "
                "(SELECT count(*) FROM pg_stat_activity WHERE backend_type IN ('idempo launcher', 'idempo sweeper'))"
            ).fetchone()
            return (n,) if rec and streaming else None
    except psycopg.Error:
        return None


def writable(i):
    try:
        with psycopg.connect(node_dsn(i), autocommit=True) as c:
            return not c.execute('SELECT pg_is_in_recovery()').fetchone()[0]
    except psycopg.Error:
        return False


# ---------------------------------------------------------------------------------------------
# The watch: no idempo worker on a node in recovery; how often two nodes swept at once
# ---------------------------------------------------------------------------------------------

class Watch:
    def __init__(self):
        self.stop = threading.Event()
        self.samples = 0
        self.worker_on_replica = []        # (node, time, what)
        self.state = {}                    # node -> (in_recovery, sweepers, at)
        self.two_primaries_sweeping = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(len(NODES))]

    def start(self):
        for t in self.threads:
            t.start()

    def run(self, i):
        while not self.stop.is_set():
            try:
                with psycopg.connect(node_dsn(i, 'postgres', 1), autocommit=True) as c:
                    rec, n = c.execute("SELECT pg_is_in_recovery(), count(*) FILTER (WHERE backend_type IN "
                                       "('idempo launcher', 'idempo sweeper')) FROM pg_stat_activity").fetchone()
                with self.lock:
                    self.samples += 1
                    self.state[i] = (rec, n, time.time())
                    if rec and n:
                        self.worker_on_replica.append((NODES[i], time.strftime('%H:%M:%S'), n))
                    now = time.time()
                    sweeping = [k for k, (r, m, at) in self.state.items() if not r and m and now - at < 1.5]
                    if len(sweeping) > 1:
                        self.two_primaries_sweeping += 1
            except psycopg.Error:
                pass
            self.stop.wait(0.5)

    def end(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)


# ---------------------------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------------------------

class Faults:
    def __init__(self, args):
        self.args = args
        self.log = []                      # one dict per fault

    def inject(self, kind):
        wait(healthy, 300, 'a healthy cluster before the fault', step=0.5)
        old = leader()
        rec = {'kind': kind, 'old_leader': NODES[old]}
        rewinds_before = self.rewinds(old)
        stopped = []
        try:
            t0 = self.fault(kind, old, rec, stopped)
            self.measure(kind, old, rec, stopped, t0)
        finally:
            signal_all(stopped, signal.SIGCONT)     # never leave a node stopped
            signal_all([parent(patroni_pid(old))], signal.SIGCONT)
        # the old leader rejoins as a replica (Patroni restarts it, rewinds it if it diverged)
        workers = wait(lambda: rest(old, 'replica') == 200 and streaming_replica_workers(old), 300,
                       f'{NODES[old]} to rejoin as a streaming replica', step=0.2)
        rec['old_leader_rejoined_s'] = round(time.time() - t0, 1)
        rec['rewound'] = self.rewinds(old) > rewinds_before
        rec['old_leader_idempo_workers'] = workers[0]
        self.log.append(rec)
        print(f'   fault: {json.dumps(rec)}', flush=True)

    def fault(self, kind, old, rec, stopped):
        """Injects the fault; returns its time."""
        if kind == 'kill9':
            pm = postmaster_pid(old)
            if self.args.replication_stall > 0:
                senders = [c for c in children(pm) if 'walsender' in cmdline(c)]
                signal_all(senders, signal.SIGSTOP)
                rec['walsenders_stopped'] = len(senders)
                time.sleep(self.args.replication_stall)   # the window: commits reach no standby
                t0 = time.time()
                os.kill(pm, signal.SIGKILL)
                signal_all(senders, signal.SIGKILL)
                return t0
            t0 = time.time()
            os.kill(pm, signal.SIGKILL)
            return t0
        if kind == 'switchover':
            t0 = time.time()
            r = subprocess.run(['patronictl', '-c', os.path.join(WORK, 'node1.yml'), 'switchover',
                                '--leader', NODES[old], '--force'], capture_output=True, text=True)
            rec['patronictl'] = next((line.strip() for line in (r.stdout + r.stderr).splitlines()
                                      if 'witch' in line), f'exit {r.returncode}')
            return t0
        if kind == 'stall':
            pp, pm = patroni_pid(old), postmaster_pid(old)
            t0 = time.time()
            os.kill(pp, signal.SIGSTOP)
            stopped.append(pp)
            os.kill(pm, signal.SIGSTOP)
            stopped.append(pm)
            kids = children(pm)
            signal_all(kids, signal.SIGSTOP)
            stopped.extend(kids)
            return t0
        raise ValueError(f'unknown fault {kind}')

    def measure(self, kind, old, rec, stopped, t0):
        new = wait(lambda: next((i for i in range(len(NODES)) if i != old and rest(i, 'leader') == 200), None),
                   300, 'a new leader')
        rec['new_leader'] = NODES[new]
        rec['to_new_leader_s'] = round(time.time() - t0, 2)
        wait(lambda: writable(new), 120, 'the new leader to accept writes', step=0.05)
        rec['to_writable_s'] = round(time.time() - t0, 2)
        t_writable = time.time()
        wait(lambda: sweeper_round_done(new), 120, "the new leader's sweeper", step=0.05)
        rec['to_sweeper_s'] = round(time.time() - t0, 2)
        rec['sweeper_after_promotion_s'] = round(time.time() - t_writable, 2)
        if kind == 'stall':
            # cut off for longer than the TTL, then back
            rest_of_ttl = TTL + 2 - (time.time() - t0)
            if rest_of_ttl > 0:
                time.sleep(rest_of_ttl)
            rec['stalled_s'] = round(time.time() - t0, 1)
            signal_all(stopped, signal.SIGCONT)
            stopped.clear()
            # runuser, Patroni's parent, stops itself when its child stops: continue it too
            signal_all([parent(patroni_pid(old))], signal.SIGCONT)

    @staticmethod
    def rewinds(i):
        try:
            with open(os.path.join(WORK, f'node{i + 1}.log'), errors='replace') as f:
                return sum(1 for line in f if 'running pg_rewind' in line)
        except OSError:
            return 0


# ---------------------------------------------------------------------------------------------
# The runner, with what the client saw acknowledged
# ---------------------------------------------------------------------------------------------

class Acks:
    """What the client saw acknowledged, to find acknowledged writes that a failover lost."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acquired = set()              # (scope, key, attempt)
        self.completed = {}                # (scope, key) -> when its completion was acknowledged
        self.lost_claims = []              # an acknowledged acquisition answered acquired again
        self.lost_completions = set()      # a claim sent after an acknowledged completion did not replay

    def saw(self, ev, outcome, attempt, sent_at):
        with self.lock:
            k = (ev.scope, ev.key)
            if outcome == 'acquired':
                if k + (attempt,) in self.acquired:
                    self.lost_claims.append(k + (attempt,))
                self.acquired.add(k + (attempt,))
            # only a claim sent after the acknowledgement (one sent before may have overtaken it)
            if outcome in ('acquired', 'unknown') and self.completed.get(k, sent_at) < sent_at:
                self.lost_completions.add(k)

    def done(self, ev):
        with self.lock:
            self.completed.setdefault((ev.scope, ev.key), time.monotonic())


class Runner(demo.Runner):
    def __init__(self, name, acks):
        self.name = name
        self.acks = acks
        self.orders = psycopg.connect(ORDERS_DSN, autocommit=True, application_name=f'runner {name}')
        self.orders.prepare_threshold = PREPARE
        self.warehouse = psycopg.connect(WAREHOUSE_DSN, autocommit=True, application_name=f'runner {name}')
        self.replica = self.warehouse      # lookups go to the warehouse itself

    def close(self):
        for c in (self.orders, self.warehouse):
            c.close()

    def handle(self, ev, faults=demo.Faults()):
        sent_at = time.monotonic()
        outcome, attempt, result, target_ref = self.orders.execute(
            'SELECT outcome::text, attempt, result, target_ref FROM idempo.claim(%s, %s, %s::jsonb, run_id => %s)',
            (ev.scope, ev.key, ev.params, ev.delivery)).fetchone()
        self.acks.saw(ev, outcome, attempt, sent_at)
        if outcome == 'acquired':
            shipment = self.call_warehouse(ev)
            if faults.lose_reply:
                raise demo.LostReply(f'shipment {shipment} created, reply lost')
            self.orders.execute('SELECT idempo.complete(%s, %s, %s, %s::jsonb, %s)',
                                (ev.scope, ev.key, attempt, json.dumps({'shipment_id': shipment}), str(shipment)))
            self.acks.done(ev)
            return demo.Outcome('shipped', shipment)
        if outcome == 'replay':
            return demo.Outcome('replayed')
        if outcome == 'unknown':
            found = self.look_up_shipment(ev)
            status = demo.one(self.orders, 'SELECT idempo.verify(%s, %s, %s, %s, %s)::text',
                              (ev.scope, ev.key, attempt, found is not None, str(found) if found else None))
            if status == 'succeeded':
                self.acks.done(ev)
            return demo.Outcome(f'verified ({status})', found)
        return demo.Outcome(outcome)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

def chaos(args):
    rnd = random.Random(args.seed)
    acks = Acks()
    events = queue.Queue()
    stats = {'unexpected_errors': [], 'deliveries': 0, 'lost_replies': 0, 'terminated_sessions': 0, 'reconnects': 0,
             'refused_not_replicated': 0, 'outcomes': {}}
    lock = threading.Lock()
    changed = []

    with psycopg.connect(ORDERS_DSN, autocommit=True) as c:
        c.execute('INSERT INTO orders SELECT i, %s || (1 + i %% 20), 1 + i %% 5 FROM generate_series(1, %s) i',
                  ('SKU-', args.orders))
    stream = []
    for i in range(1, args.orders + 1):
        legacy = i % 3 == 0
        sku, qty = f'SKU-{1 + i % 20}', 1 + i % 5
        copies = 1 + (rnd.random() < args.duplicates) + (rnd.random() < args.duplicates / 2)
        for n in range(copies):
            stream.append(demo.Event(i, sku, qty, f'd{i}-{n}', legacy=legacy))
        if rnd.random() < 0.01:
            ev = demo.Event(i, sku, qty + 1, f'd{i}-changed', legacy=legacy)
            stream.append(ev)
            changed.append(ev)
    rnd.shuffle(stream)
    for ev in stream:
        events.put(ev)
    total = len(stream)
    plan = args.faults.split(',') if args.faults else []
    # fault k is injected after (k+1)/(len+1) of the stream
    due = [total * (k + 1) // (len(plan) + 1) for k in range(len(plan))]
    faults = Faults(args)
    watch = Watch()
    watch.start()
    stop = threading.Event()
    fault_error = []

    def again(ev):
        time.sleep(0.05)
        events.put(demo.Event(ev.order_id, ev.sku, ev.qty, ev.delivery + "'", legacy=ev.legacy))

    def worker(n):
        runner = None
        while not stop.is_set():
            try:
                ev = events.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                if runner is None:
                    runner = Runner(f'w{n}', acks)
                if rnd.random() < args.fault_rate / 4:
                    with lock:
                        stats['terminated_sessions'] += 1
                    runner.orders.execute('SELECT pg_terminate_backend(pg_backend_pid())')
                out = runner.handle(ev, demo.Faults(lose_reply=rnd.random() < args.fault_rate))
                kind = out.handled.split(' ')[0]
                with lock:
                    stats['outcomes'][kind] = stats['outcomes'].get(kind, 0) + 1
                if kind == 'busy' or out.handled == 'verified (unknown)':
                    again(ev)
            except demo.LostReply:
                with lock:
                    stats['lost_replies'] += 1
                again(ev)
            except (psycopg.OperationalError, psycopg.InterfaceError, psycopg.errors.ReadOnlySqlTransaction,
                    psycopg.errors.AdminShutdown):
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
            except psycopg.DatabaseError as e:
                # durability => 'replicated': the claim's commit would not have waited for a
                # synchronous standby (none configured for a moment), so it was refused
                if e.sqlstate != 'ID001':
                    # any other error is a failure of the run, counted and shown: a worker that
                    # died here would leave the run passing with fewer workers
                    with lock:
                        stats['unexpected_errors'].append(f'{e.sqlstate}: {e}'.splitlines()[0])
                    if runner:
                        try:
                            runner.close()
                        except psycopg.Error:
                            pass
                    runner = None
                else:
                    with lock:
                        stats['refused_not_replicated'] += 1
                again(ev)
            finally:
                with lock:
                    stats['deliveries'] += 1
                    d = stats['deliveries']
                events.task_done()
            if d % max(1, total // 10) == 0:
                print(f'   progress: {d} deliveries, {stats["reconnects"]} reconnects', flush=True)
        if runner:
            runner.close()

    def injector():
        try:
            for kind, at in zip(plan, due):
                while stats['deliveries'] < at and not stop.is_set():
                    time.sleep(0.1)
                if stop.is_set():
                    return
                print(f'   ... {kind} of the leader after {stats["deliveries"]} deliveries', flush=True)
                before = stats['deliveries']
                faults.inject(kind)
                faults.log[-1]['deliveries_during'] = stats['deliveries'] - before
        except Exception as e:  # reported as a failed check; the run goes on
            fault_error.append(repr(e))
            print(f'   fault error: {e!r}', flush=True)

    t0 = time.time()
    threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.workers)]
    for t in threads:
        t.start()
    inj = threading.Thread(target=injector)
    inj.start()
    events.join()
    inj.join()             # a fault late in the stream: its measurements end first
    events.join()
    stop.set()
    for t in threads:
        t.join()

    # the event source's last word: redeliver what is unfinished, after leases and settle windows
    wait(healthy, 300, 'a healthy cluster for the drain', step=0.5)
    check_conn = psycopg.connect(ORDERS_DSN, autocommit=True)
    for round_ in range(10):
        wait(lambda: demo.one(check_conn,
             "SELECT count(*) = 0 FROM idempo.operations WHERE scope IN (%s, %s) "
             "AND (status = 'in_progress' AND lease_expires_at > idempo.now() "
             "     OR status = 'unknown' AND last_attempt_at > idempo.now() - interval '10 seconds')", SCOPES),
             90, 'leases and settle windows to pass', step=0.2)
        pending = check_conn.execute(
            "SELECT scope, key FROM idempo.operations WHERE scope IN (%s, %s) "
            "AND status IN ('in_progress', 'retryable', 'unknown')", SCOPES).fetchall()
        if not pending:
            break
        runner = Runner('drain', acks)
        for scope, key in pending:
            order_id = int(key.split('-')[1].split('/')[0])
            sku, qty = check_conn.execute('SELECT sku, qty FROM orders WHERE id = %s', (order_id,)).fetchone()
            runner.handle(demo.Event(order_id, sku, qty, f'drain-{round_}', legacy=scope == demo.LEGACY))
            stats['deliveries'] += 1
        runner.close()
    elapsed = time.time() - t0
    watch.end()

    # -- the verdict, from the warehouse's own tables and the final leader --
    ld = leader()
    wh = psycopg.connect(WAREHOUSE_DSN, autocommit=True)
    per_order = dict(wh.execute('SELECT order_id, count(*) FROM shipments GROUP BY order_id').fetchall())
    ops = {int(k.split('-')[1].split('/')[0]): s for k, s in check_conn.execute(
        'SELECT key, status::text FROM idempo.operations WHERE scope IN (%s, %s)', SCOPES).fetchall()}
    doubled = [o for o, n in per_order.items() if n > 1]
    lost = [o for o in range(1, args.orders + 1)
            if per_order.get(o, 0) == 0 and ops.get(o) not in ('in_review', 'unknown', 'in_progress', 'retryable')]
    shipped_no_record = [o for o in per_order if o not in ops]
    unrecorded = [ev.key for ev in changed
                  if demo.one(check_conn, "SELECT count(*) FROM idempo.conflicts c JOIN idempo.operations o "
                              "USING (scope, key) WHERE c.scope = %s AND c.key = %s "
                              "AND c.incoming_fingerprint <> o.fingerprint "
                              "AND idempo.fingerprint(%s::jsonb) IN (c.incoming_fingerprint, o.fingerprint)",
                              (ev.scope, ev.key, ev.params)) == 0]
    # a changed copy that arrived first was executed; the first version is then the conflict
    inconsistent = demo.one(check_conn, 'SELECT count(*) FROM idempo.check_consistency()')
    standby_answers = replica_checks(ld, check_conn) + guard_checks(check_conn)

    fig = {
        'mode': 'sync' if SYNC else 'async', 'orders': args.orders, 'deliveries': stats['deliveries'],
        'changed_deliveries': len(changed), 'faults': faults.log, 'fault_errors': fault_error,
        'lost_replies': stats['lost_replies'], 'terminated_sessions': stats['terminated_sessions'],
        'reconnects': stats['reconnects'], 'refused_not_replicated': stats['refused_not_replicated'],
        'outcomes': stats['outcomes'],
        'shipped_twice': len(doubled), 'lost_orders': len(lost),
        'lost_claims': len(acks.lost_claims), 'lost_completions': len(acks.lost_completions),
        'shipped_without_record': len(shipped_no_record),
        'conflicts_not_recorded': len(unrecorded), 'consistency_problems': inconsistent,
        'worker_on_replica_samples': len(watch.worker_on_replica), 'watch_samples': watch.samples,
        'two_primaries_sweeping_samples': watch.two_primaries_sweeping,
        'final_leader': NODES[ld] if ld is not None else None, 'seconds': round(elapsed, 1),
    }
    print('\nHA chaos run (%s replication)' % fig['mode'])
    for k in ('orders', 'deliveries', 'changed_deliveries', 'lost_replies', 'terminated_sessions', 'reconnects',
              'refused_not_replicated',
              'shipped_twice', 'lost_orders', 'lost_claims', 'lost_completions', 'shipped_without_record',
              'conflicts_not_recorded', 'consistency_problems', 'worker_on_replica_samples',
              'two_primaries_sweeping_samples', 'seconds'):
        print(f'   {k:<40} {fig[k]}')
    for f in faults.log:
        print(f"   {f['kind']:<11} {f['old_leader']} -> {f['new_leader']}: new leader {f['to_new_leader_s']} s, "
              f"writable {f['to_writable_s']} s, sweeper round {f['to_sweeper_s']} s "
              f"({f['sweeper_after_promotion_s']} s after promotion), old leader back as replica "
              f"{f['old_leader_rejoined_s']} s{' (pg_rewind)' if f['rewound'] else ''}, "
              f"{f.get('deliveries_during', 0)} deliveries meanwhile")

    check(not fault_error and len(faults.log) == len(plan), f'{len(plan)} fault(s) injected, a new leader each time')
    check(all(f['old_leader_idempo_workers'] == 0 for f in faults.log),
          'every old leader, back as a replica, runs no idempo launcher or sweeper')
    check(not watch.worker_on_replica, f'no idempo worker on a node in recovery ({watch.samples} samples)'
          + (f': {watch.worker_on_replica[:3]}' if watch.worker_on_replica else ''))
    check(inconsistent == 0, 'check_consistency() is clean on the final leader')
    check(not stats['unexpected_errors'],
          f"no unexpected database error in the workers ({len(stats['unexpected_errors'])}: "
          f"{'; '.join(sorted(set(stats['unexpected_errors']))[:5])})")
    for ok, what in standby_answers:
        check(ok, what)
    safety = [('shipped_twice', doubled), ('lost_orders', lost), ('lost_claims', acks.lost_claims),
              ('lost_completions', acks.lost_completions), ('shipped_without_record', shipped_no_record),
              ('conflicts_not_recorded', unrecorded)]
    for name, items in safety:
        if SYNC:
            check(not items, f'{name}: {len(items)}' + (f' e.g. {sorted(items)[:5]}' if items else ''))
        else:
            print(f'measured (async, not a check): {name} = {len(items)}' + (f' e.g. {sorted(items)[:5]}' if items else ''))
    print('figures: ' + json.dumps(fig, sort_keys=True), flush=True)
    return 0


def replica_checks(ld, primary):
    """lookup and the read-only claim answers on a Patroni replica."""
    out = []
    rep = next(i for i in range(len(NODES)) if i != ld)
    key = primary.execute("SELECT key FROM idempo.operations WHERE scope = %s AND status = 'succeeded' LIMIT 1",
                          (demo.SCOPE,)).fetchone()[0]
    params = primary.execute('SELECT params FROM idempo.operations WHERE scope = %s AND key = %s',
                             (demo.SCOPE, key)).fetchone()[0]
    primary.execute("SELECT idempo.claim(%s, 'ha-in-flight', run_id => 'ha')", (demo.SCOPE,))
    lsn = primary.execute('SELECT pg_current_wal_lsn()').fetchone()[0]
    with psycopg.connect(node_dsn(rep, timeout=5), autocommit=True) as c:
        wait(lambda: c.execute('SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn', (lsn,)).fetchone()[0], 60,
             'the replica to replay')
        st = c.execute('SELECT status::text FROM idempo.lookup(%s, %s)', (demo.SCOPE, key)).fetchone()
        out.append((st == ('succeeded',), f'lookup on replica {NODES[rep]}: {st}'))
        oc = c.execute('SELECT outcome::text FROM idempo.claim(%s, %s, %s::jsonb)',
                       (demo.SCOPE, key, json.dumps(params))).fetchone()
        out.append((oc == ('replay',), f'claim of a finished key on the replica answers replay: {oc}'))
        oc = c.execute("SELECT outcome::text FROM idempo.claim(%s, 'ha-in-flight')", (demo.SCOPE,)).fetchone()
        out.append((oc == ('busy',), f'claim of an in-flight key on the replica answers busy: {oc}'))
        try:
            c.execute("SELECT idempo.claim(%s, 'ha-new-key')", (demo.SCOPE,))
            out.append((False, 'claim of a new key on the replica is refused'))
        except psycopg.errors.ReadOnlySqlTransaction as e:
            out.append(('standby' in (e.diag.message_hint or ''),
                        f'claim of a new key on the replica is refused: 25006, hint "{e.diag.message_hint}"'))
    primary.execute("SELECT idempo.fail(%s, 'ha-in-flight', 1, 'harness')", (demo.SCOPE,))
    return out


def guard_checks(primary):
    """durability => 'replicated' on the cluster: accepted with a synchronous standby, refused without."""
    try:
        primary.execute("SELECT idempo.create_scope('ha.guard', durability => 'replicated')")
    except psycopg.Error as e:
        if e.sqlstate == '42883' or 'durability' in str(e):   # a build without the guard
            return [(False, f'durability => replicated: {e.sqlstate} {e.diag.message_primary}')]
        raise
    try:
        oc = demo.one(primary, "SELECT outcome::text FROM idempo.claim('ha.guard', 'g-1')")
        got = f'claim committed: {oc}'
        ok = SYNC and oc == 'acquired'
    except psycopg.DatabaseError as e:
        got = f'{e.sqlstate}: {e.diag.message_primary}'
        ok = not SYNC and e.sqlstate == 'ID001'
    want = 'commits (synchronous standby)' if SYNC else 'is refused with ID001 (no synchronous standby)'
    return [(ok, f"a claim in a durability => 'replicated' scope {want}: {got}")]


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--orders', type=int, default=2000)
    p.add_argument('--workers', type=int, default=6)
    p.add_argument('--duplicates', type=float, default=0.5)
    p.add_argument('--fault-rate', type=float, default=0.02)
    p.add_argument('--faults', default='kill9', help='comma-separated: kill9, switchover, stall')
    p.add_argument('--replication-stall', type=float, default=0.0,
                   help='kill9: stop the walsenders this many seconds first')
    p.add_argument('--seed', type=int, default=1)
    args = p.parse_args()
    chaos(args)
    failed = sum(1 for ok, _ in checks if not ok)
    print(f'{len(checks) - failed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
