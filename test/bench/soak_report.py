#!/usr/bin/env python3
"""Writes docs/benchmarks-soak.md from the result files of test/bench/soak, and soak.dat (one line
per sample period) for the soak_*.gp plots.

usage: soak_report.py RESULTS_DIR PGBENCH_LOG_DIR OUT.md
Latency per period comes from pgbench's per-transaction log (-R: column 3 is measured from the
scheduled start, column 7 the schedule lag; the service time is their difference).  The targets
(table size and claim p99 at most 1.2x and 1.5x, workers' memory at most 1 MB more an hour)
compare minute 60 with minute 10 (for a run of another length: the last period with the one at
a sixth of it); the report also shows the medians of five periods around each, which
a noisy shared machine moves less.
"""
import glob
import os
import statistics
import sys
from collections import defaultdict

from results import reader

res, logs, out = sys.argv[1:4]
rows = reader(res)
meta = dict(rows("meta.tsv"))
short = meta.get("short") == "1"
period = int(meta["period"])
t0 = float(meta["t0"])
mix = [m.split(":")[0] for m in meta["mix"].split()]
weights = [int(m.split(":")[1]) for m in meta["mix"].split()]

head, *data = rows("samples.tsv")
S = [dict(zip(head, map(float, r))) for r in data]
n_samples = len(S)

# ---- pgbench log: per period and script, service latencies (µs) and counts
lat = defaultdict(list)          # (period, script) -> [µs]
lagged = defaultdict(list)       # period -> [schedule lag µs], all scripts
count = defaultdict(int)         # (period, script) -> transactions
skipped = defaultdict(int)       # period -> transactions skipped for being 1 s late (-L)
for path in glob.glob(os.path.join(logs, "soak.*")):
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) < 7 or not p[2].isdigit():     # "skipped" (-L): counted apart
                if len(p) >= 7:
                    skipped[int((int(p[4]) + int(p[5]) / 1e6 - t0) // period)] += 1
                continue
            t = int(p[4]) + int(p[5]) / 1e6
            k = int((t - t0) // period)      # period k: (t0 + k p, t0 + (k + 1) p]; its sample is k + 1
            s = int(p[3])
            service = int(p[2]) - int(p[6])
            lat[(k, s)].append(service)
            lagged[k].append(int(p[6]))
            count[(k, s)] += 1


def q(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    i = max(0, min(len(xs) - 1, int(round(p * len(xs) + 0.5)) - 1))
    return xs[i]


periods = n_samples - 1              # periods 0 .. periods-1 end at samples 1 .. periods
per = []
for k in range(periods):
    new = lat.get((k, 0), [])
    allt = [x for s in range(len(mix)) for x in lat.get((k, s), [])]
    a, b = S[k], S[k + 1]
    per.append(dict(
        minute=(k + 1) * period / 60,
        tps=sum(count[(k, s)] for s in range(len(mix))) / period, skipped=skipped[k],
        p50=q(new, 0.5), p99=q(new, 0.99), all_p99=q(allt, 0.99), lag_p99=q(lagged[k], 0.99),
        total_mb=(b["heap_bytes"] + b["index_bytes"]) / 2**20, heap_mb=b["heap_bytes"] / 2**20,
        index_mb=b["index_bytes"] / 2**20, sweep_idx_mb=b.get("sweep_index_bytes", 0) / 2**20,
        in_review=b.get("in_review_rows", 0), dead=b["dead_tup"], live=b["live_tup"], rows=b["rows"],
        lag=b["lag_s"], due=b["due_rows"], av=b["autovacuums"] - a["autovacuums"],
        sweeps=b["sweeps"] - a["sweeps"], purged=b["purged"] - a["purged"],
        expired=b["lease_expired"] - a["lease_expired"], reviewed=b["moved_to_review"] - a["moved_to_review"],
        l_rss=b["launcher_rss_kb"], l_anon=b["launcher_anon_kb"], l_pss=b["launcher_pss_kb"],
        l_pd=b["launcher_private_dirty_kb"],
        s_rss=b["sweeper_rss_kb"], s_anon=b["sweeper_anon_kb"], s_pss=b["sweeper_pss_kb"],
        s_pd=b["sweeper_private_dirty_kb"], load=b["load1"],
        open_reviews=b["open_reviews"], open_conflicts=b["open_conflicts"],
        reviews_mb=b["reviews_bytes"] / 2**20, conflicts_mb=b["conflicts_bytes"] / 2**20))

cols = ["minute", "tps", "p50", "p99", "all_p99", "lag_p99", "total_mb", "heap_mb", "index_mb", "dead",
        "live", "sweep_idx_mb", "in_review", "lag", "due", "av", "sweeps", "purged", "l_rss", "l_anon", "l_pss", "l_pd",
        "s_rss", "s_anon", "s_pss", "s_pd", "load", "rows"]
with open(os.path.join(res, "soak.dat"), "w") as f:
    f.write(" ".join(cols) + "\n")
    for r in per:
        f.write(" ".join("NaN" if r[c] is None else f"{r[c]:.3f}" for c in cols) + "\n")

# ---- targets: the last period against the one at a sixth of the run (minute 10 of 60)
last = periods - 1
ref = max(0, round(periods / 6) - 1)


def window(k, key):
    xs = [per[j][key] for j in range(max(0, k - 2), min(periods, k + 3)) if per[j][key] is not None]
    return statistics.median(xs) if xs else None


def fmt(x, f=".0f"):
    return "-" if x is None else f"{x:{f}}"


def verdict(ok):
    return "**met**" if ok else "**missed**"


lines = []
w = lines.append
w("# Soak test\n")
w("Does `idempo.operations` stay the same size once retention turns over, does the sweeper keep up, "
  "does latency drift, do the workers leak? Written by `test/bench/soak`; every full run "
  "rewrites this file. Sustained load at half of the throughput the machine reached with the same "
  "mix in a short ramp at start, retention of one minute so that the sweeper works the whole run, "
  "stock settings.\n")
wall = int(float(meta.get("wall_s", 0)))
w(f"- Date: {meta.get('date', '?')}; command: `{meta.get('command', '?')}` (as root, from the clone); "
  f"wall time {wall // 60} min {wall % 60} s")
w(f"- Machine: {meta.get('cpu', '?')}, {meta.get('nproc', '?')} cores, shared with other work "
  f"(load average in every table and plot); {meta.get('os', '?')}")
w(f"- PostgreSQL {meta.get('postgres', '?')}; idempo {meta.get('idempo', '?')}")
w(f"- Cluster: {meta.get('settings', '?')}; reloptions of `idempo.operations`: {meta.get('reloptions', '?')}")
ramp = rows("ramp.tsv")
w(f"- Ramp (the mix unthrottled): " + ", ".join(f"{c} clients {float(t):.0f} tps" for c, t in ramp)
  + f"; soak: `pgbench -R {meta.get('rate')}` (half of {float(meta.get('max_tps', 0)):.0f}) at "
  f"{meta.get('clients')} clients, {n_samples} samples {period} s apart; failed checks: {meta.get('failed', '?')}")
w("- Mix (pgbench scripts in `test/bench/pgbench/`, weights): "
  + ", ".join(f"`{m}` {wt}" for m, wt in zip(mix, weights)) + "\n")

if short:
    w("A short run (`--short`) checks that every sample was taken, that the sweeper lag stayed within "
      "60 s and the sweeper kept working, and that nothing failed; the targets need the full hour.\n")
elif periods >= 2:
    mref, mlast = per[ref]["minute"], per[last]["minute"]
    w("## Targets\n")
    w(f"Minute {mlast:g} against minute {mref:g}; in brackets the median of the five periods around each "
      "(less moved by the machine's other work).\n")
    w("| target | minute %g | minute %g | ratio | | five-period medians | |" % (mref, mlast))
    w("|---|--:|--:|--:|---|--:|---|")
    a, b = per[ref]["total_mb"], per[last]["total_mb"]
    wa, wb = window(ref, "total_mb"), window(last, "total_mb")
    w(f"| `idempo.operations` heap + indexes ≤ 1.2 × | {a:.2f} MB | {b:.2f} MB | {b / a:.2f} | {verdict(b <= 1.2 * a)} "
      f"| {wa:.2f} → {wb:.2f} MB ({wb / wa:.2f}) | {verdict(wb <= 1.2 * wa)} |")
    lag_max = max(r["lag"] for r in per)
    w(f"| sweeper lag ≤ 2 × `sweep_interval` (20 s), every sample | | | max {lag_max:.1f} s | {verdict(lag_max <= 20)} | "
      f"median {statistics.median(r['lag'] for r in per):.1f} s | |")
    a, b = per[ref]["p99"], per[last]["p99"]
    wa, wb = window(ref, "p99"), window(last, "p99")
    if a and b and wa and wb:
        w(f"| claim p99 (new key) ≤ 1.5 × | {a:.0f} µs | {b:.0f} µs | {b / a:.2f} | {verdict(b <= 1.5 * a)} "
          f"| {wa:.0f} → {wb:.0f} µs ({wb / wa:.2f}) | {verdict(wb <= 1.5 * wa)} |")
    for who, k in (("sweeper", "s_anon"), ("launcher", "l_anon")):
        a, b = per[ref][k], per[last][k]
        hours = (mlast - mref) / 60
        growth = (b - a) / 1024 / hours if hours else 0
        w(f"| {who} memory (`RssAnon`) growth ≤ 1 MB per hour | {a:.0f} kB | {b:.0f} kB | {growth:+.2f} MB/h "
          f"| {verdict(growth <= 1)} | RSS {per[ref][k[0] + '_rss']:.0f} → {per[last][k[0] + '_rss']:.0f} kB, "
          f"private dirty {per[ref][k[0] + '_pd']:.0f} → {per[last][k[0] + '_pd']:.0f} kB | |")
    w("")

w("## Per period\n")
w("At the end of each period: the table's size, dead tuples, the age of the oldest due row (lag) and "
  "how many rows were due, the memory of the sweeper and the launcher (`RssAnon`, kB), the machine's "
  "1-minute load average; over the period: throughput, the new-key claim's p50/p99 service time "
  "(µs, pgbench's schedule lag left out), p99 of every script, autovacuum runs and sweep rounds of "
  "`idempo.operations`, rows purged.\n")
w("| min | load | TPS | claim p50 | p99 | all p99 | heap MB | index MB (sweep_at) | rows (in review) | dead | lag s | due | autovac. | sweeps | purged | sweeper kB | launcher kB |")
w("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for r in per:
    w(f"| {r['minute']:g} | {r['load']:.2f} | {r['tps']:.0f} | {fmt(r['p50'])} | {fmt(r['p99'])} | {fmt(r['all_p99'])} "
      f"| {r['heap_mb']:.2f} | {r['index_mb']:.2f} ({r['sweep_idx_mb']:.2f}) | {r['rows']:.0f} ({r['in_review']:.0f}) | {r['dead']:.0f} | {r['lag']:.1f} | {r['due']:.0f} "
      f"| {r['av']:.0f} | {r['sweeps']:.0f} | {r['purged']:.0f} | {r['s_anon']:.0f} | {r['l_anon']:.0f} |")
w("")
if per:
    z = per[-1]
    w(f"At the end: {z['open_reviews']:.0f} open reviews, {z['open_conflicts']:.0f} open conflicts; "
      f"`idempo.reviews` {z['reviews_mb']:.2f} MB and `idempo.conflicts` {z['conflicts_mb']:.2f} MB "
      "(their resolved rows are history and stay).\n")
if not short:
    for p, t in (("size", "size of idempo.operations"), ("lag", "sweeper lag"),
                 ("latency", "claim latency"), ("memory", "workers' memory")):
        w(f"![{t}](../test/bench/soak_{p}.png)\n")
w("@ANALYSIS@\n")

text = "\n".join(lines)
analysis = os.path.join(os.path.dirname(os.path.abspath(__file__)), "soak_analysis.md")
if not short and os.path.exists(analysis):
    with open(analysis) as f:
        text = text.replace("@ANALYSIS@", f.read().rstrip("\n"))
else:
    text = text.replace("@ANALYSIS@\n", "")
with open(out, "w") as f:
    f.write(text)
