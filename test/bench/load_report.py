#!/usr/bin/env python3
"""Writes docs/benchmarks-load.md from the result files of test/bench/load, and clients.dat for
load_plot.gp.

usage: load_report.py RESULTS_DIR OUT.md PLOT_FILE_NAME
Every mode interleaves its variants in one pgbench run per round, so a variant's added cost is its
average latency minus the baseline's in the same run; ratios are taken per round, then the median
over rounds is shown with the range in brackets.
"""
import os
import statistics
import sys
from collections import defaultdict

from results import reader, span

res, out, plot_name = sys.argv[1:4]


rows = reader(res)


def med(xs):
    return statistics.median(xs) if xs else None


meta = dict(rows("meta.tsv"))
# run[(section, mode)][round][variant] = dict(tps, avg, p99, n, p50, max)
run = defaultdict(lambda: defaultdict(dict))
for sec, mode, var, rnd, cl, tps, avg, p99, n, failed, p50, mx in rows("runs.tsv"):
    run[(sec, mode)][int(rnd)][var] = dict(clients=int(cl), tps=float(tps), avg=float(avg), p99=float(p99),
                                           n=int(n), p50=float(p50), max=float(mx))


def per_round(sec, mode, fn):
    vals = []
    for r, vs in sorted(run[(sec, mode)].items()):
        try:
            vals.append(fn(vs))
        except (KeyError, ZeroDivisionError):
            pass
    return vals


def added(v, base="baseline"):
    return lambda vs: vs[v]["avg"] - vs[base]["avg"]


def ratio(a, b, base="baseline"):
    return lambda vs: (vs[a]["avg"] - vs[base]["avg"]) / (vs[b]["avg"] - vs[base]["avg"])


# the same server's single-client report: benchmarks.md, or benchmarks-pgN.md beside benchmarks-load-pgN.md
MICRO = os.path.basename(sys.argv[2]).replace("benchmarks-load", "benchmarks")
lines = []
w = lines.append
w("# Benchmarks under load\n")
w("What a service sees: many clients, durable commits, hot keys, and the cost of each scope option. "
  "Written by `test/bench/load`; every full run rewrites this file. Each mode is one pgbench "
  "run per round with the variants' transactions interleaved (each transaction picks a script at "
  "random), so that whatever the shared machine does meanwhile hits every variant alike; figures are "
  "medians over rounds with the range in brackets. The single-client microscope (pinned, "
  "`synchronous_commit = off`) and the scale, sweep and space sections are in "
  f"[{MICRO}]({MICRO}).\n")
w(f"- Date: {meta.get('date', '?')}; command: `{meta.get('command', '?')}` (as root, from the clone); "
  f"wall time {int(meta.get('wall_s', 0)) // 60} min {int(meta.get('wall_s', 0)) % 60} s")
w(f"- Machine: {meta.get('cpu', '?')}, {meta.get('nproc', '?')} cores; {meta.get('os', '?')}")
w(f"- PostgreSQL {meta.get('postgres', '?')}; idempo {meta.get('idempo', '?')}")
w(f"- Cluster: {meta.get('settings', '?')}")
w(f"- Runs: `pgbench -M prepared`, {meta.get('rounds', '?')} rounds of `{meta.get('length', '?')}` per "
  f"mode, a thread per client up to 4; pgbench runs failed: {meta.get('failed', '?')}\n")

# ---- targets
modes = sorted({m for (s, m) in run if s == "clients"}, key=lambda m: (m.split("cli-")[1], int(m.split("cli")[0])))
w("## Targets\n")
w("Added cost = the variant's average latency minus the business insert's (baseline), in the same run. "
  "Targets: one-call ≤ 1.3 × the bare dedup insert's (floor) added cost, two-call ≤ 0.9 × "
  "plain SQL's, at 1 and 8 clients, `synchronous_commit` off and on.\n")
w("| clients | synchronous_commit | one-call / floor | | two-call / plain SQL | |")
w("|--:|---|--:|---|--:|---|")
for m in modes:
    c, s = m.split("cli-")
    if c not in ("1", "8"):
        continue
    a = per_round("clients", m, ratio("idempo_one_call", "floor"))
    b = per_round("clients", m, ratio("idempo_two_call", "plain_sql"))
    va = "**met**" if a and med(a) <= 1.3 else "**missed**"
    vb = "**met**" if b and med(b) <= 0.9 else "**missed**"
    w(f"| {c} | {s} | {span(a, '.2f')} | {va} | {span(b, '.2f')} | {vb} |")
w("")

# ---- clients
variants = ["baseline", "floor", "plain_sql", "idempo_two_call", "idempo_one_call"]
w("## Clients and durable commits\n")
w("Per variant: throughput it would have alone at the measured latency (clients × 10⁶ / average µs, "
  "Little's law), latency p50 and p99 (µs), and added µs over the baseline. fsync is on; with "
  "`synchronous_commit = on` every committing transaction waits for its WAL flush, which concurrent "
  "commits share (group commit).\n")
for sync in ("off", "on"):
    ms = [m for m in modes if m.endswith("-" + sync)]
    if not ms:
        continue
    w(f"### synchronous_commit {sync}\n")
    w("| variant | " + " | ".join(f"{m.split('cli')[0]} cl.: TPS | p50 | p99 | added" for m in ms) + " |")
    w("|---|" + "--:|--:|--:|--:|" * len(ms))
    for v in variants:
        cells = []
        for m in ms:
            cells.append(span(per_round("clients", m, lambda vs, v=v: vs[v]["tps"])))
            cells.append(span(per_round("clients", m, lambda vs, v=v: vs[v]["p50"])))
            cells.append(span(per_round("clients", m, lambda vs, v=v: vs[v]["p99"])))
            cells.append("" if v == "baseline" else span(per_round("clients", m, added(v))))
        w(f"| `{v}` | " + " | ".join(cells) + " |")
    w("")
w(f"![throughput against clients](../test/bench/{plot_name})\n")

# plot data: clients, then per variant the median TPS with sync off, then with sync on
counts = sorted({int(m.split("cli")[0]) for m in modes})
with open(os.path.join(res, "clients.dat"), "w") as f:
    f.write("clients " + " ".join(f"{v}_off" for v in variants) + " " + " ".join(f"{v}_on" for v in variants) + "\n")
    for c in counts:
        vals = []
        for sync in ("off", "on"):
            for v in variants:
                x = med(per_round("clients", f"{c}cli-{sync}", lambda vs, v=v: vs[v]["tps"]))
                vals.append(f"{x:.1f}" if x is not None else "NaN")
        f.write(f"{c} " + " ".join(vals) + "\n")

# ---- hot keys
hot_out = defaultdict(lambda: defaultdict(int))
for script, c, r, outcome, n in rows("hot_outcomes.tsv"):
    hot_out[(script, int(c))][outcome] += int(n)
hot_cl = defaultdict(list)
for script, c, r, client, n, mx in rows("hot_clients.tsv"):
    hot_cl[(script, int(c), int(r))].append((int(n), int(mx)))
if hot_out:
    w("## Hot keys\n")
    w("`hot_nowait`: every client redelivers one of 200 events (`wait => false`, one-call form; the "
      "event ids are reused for 2 s, then a new generation): most claims replay. `hot_wait`: every "
      "client claims the key of the current 100 ms with `wait => true`; the first holds it for 5 ms "
      "of business work, the others queue on its row lock and then replay. `synchronous_commit = on`. "
      "Outcomes are summed over rounds; a client's count is its transactions in one round.\n")
    w("| script | clients | transactions/s | p50 µs | p99 µs | worst µs | acquired | replay | busy | other | "
      "per-client transactions, fewest–most (median round) |")
    w("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    for (script, c) in sorted(hot_out):
        md = f"{c}cli-on"
        vs = [vs[script] for r, vs in sorted(run[("hot", md)].items()) if script in vs]
        o = hot_out[(script, c)]
        total = sum(o.values()) or 1
        other = total - o["acquired"] - o["replay"] - o["busy"]
        spreads = []
        for (s2, c2, r), cl in sorted(hot_cl.items()):
            if s2 == script and c2 == c:
                ns = [n for n, _ in cl]
                spreads.append((min(ns), max(ns)))
        spreads.sort(key=lambda x: x[0])
        sp = spreads[len(spreads) // 2] if spreads else ("-", "-")
        w(f"| `{script}` | {c} | {span([x['tps'] for x in vs])} | {span([x['p50'] for x in vs])} | "
          f"{span([x['p99'] for x in vs])} | {max((x['max'] for x in vs), default=0):.0f} | "
          f"{100 * o['acquired'] / total:.1f} % | {100 * o['replay'] / total:.1f} % | "
          f"{100 * o['busy'] / total:.1f} % | {100 * other / total:.1f} % | {sp[0]}–{sp[1]} |")
    w("")

# ---- features
feat = [v for v in ("f_plain", "f_audit", "f_store_params", "f_hash_keys", "f_require_fingerprint",
                    "f_remember", "f_fingerprint_ignore", "replay", "conflict")
        if any(v in vs for vs in run[("features", "1pin-off")].values())]
if feat:
    w("## Cost of each option\n")
    w("The one-call claim with the business write in a scope with one option on, against the same in a "
      "scope with none (`f_plain`), interleaved, 1 client, pinned, `synchronous_commit = off`. `replay` "
      "and `conflict` are the claim alone on a finished key (same / other parameters; the conflict is "
      "recorded by the database's sweeper in its own transaction, and the claim waits for it).\n")
    w("| variant | avg µs | p99 µs | added µs over `f_plain` |")
    w("|---|--:|--:|--:|")
    for v in feat:
        w(f"| `{v}` | {span(per_round('features', '1pin-off', lambda vs, v=v: vs[v]['avg']))} | "
          f"{span(per_round('features', '1pin-off', lambda vs, v=v: vs[v]['p99']))} | "
          f"{'' if v == 'f_plain' else span(per_round('features', '1pin-off', lambda vs, v=v: vs[v]['avg'] - vs['f_plain']['avg']))} |")
    w("")

w("## How it is measured\n")
w("- `test/bench/load` starts its own throwaway cluster (Unix socket, stock settings but "
  "`shared_buffers = 1GB`, `max_wal_size = 8GB`, `checkpoint_timeout = 1h`), creates the tables of "
  "`setup.sql` and the scopes of `load_setup.sql`, and runs the scripts in `test/bench/pgbench/`.")
w("- Throughput per variant in an interleaved run is derived from its latency (Little's law); the "
  "run's total throughput is shared by all its variants.")
w("- The machine has 2 cores: at 64 clients, 64 backends and pgbench's 4 threads share them, so "
  "the fall from 8 to 64 clients is mostly queueing for CPU; the ratios between the variants are "
  "what carries over to a bigger machine.")
w("- `test/bench/load --short` (one round of 1 s, 1 and 8 clients) proves the scripts work; it asserts "
  "nothing about speed.")

with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
