#!/usr/bin/env python3
"""Prints the Markdown report of test/bench/levers from its result files.

usage: levers_report.py RESULTS_DIR
A variant's added cost is its average latency minus the baseline's in the same pgbench run (the
variants are interleaved in it); a layout's ratio is, per round, its added cost over the shipped
layout's in the same round, and the median of those.  Medians over rounds, [min-max].
"""
import sys
from collections import defaultdict

from results import reader, span

res = sys.argv[1]


rows = reader(res)


meta = dict(rows("meta.tsv"))
# avg[layout][round][variant] = average latency (µs)
avg = defaultdict(lambda: defaultdict(dict))
for sec, mode, var, rnd, cl, tps, a, *_ in rows("runs.tsv"):
    if sec.startswith("claims-"):
        avg[sec[len("claims-"):]][int(rnd)][var] = float(a)
layouts = list(avg)
added = {l: {r: {v: vs[v] - vs["baseline"] for v in vs if v != "baseline"} for r, vs in avg[l].items()}
         for l in layouts}

print(f"PostgreSQL {meta.get('postgres', '?')}, `{meta.get('command', '?')}`, {meta.get('date', '?')}, "
      f"{meta.get('wall_s', '?')} s.\n")
print("Added latency over the business insert alone (µs, 1 client, pinned, synchronous_commit off; "
      "median [range] over rounds), and against the shipped layout round by round:\n")
print("| layout | floor | two-call | one-call | two-call / shipped | one-call / shipped | one-call / floor |")
print("|---|--:|--:|--:|--:|--:|--:|")
for l in layouts:
    rs = sorted(added[l])
    col = {v: [added[l][r][v] for r in rs if v in added[l][r]] for v in ("floor", "idempo_two_call", "idempo_one_call")}
    ratio = {v: [added[l][r][v] / added["shipped"][r][v] for r in rs
                 if "shipped" in added and r in added["shipped"] and added["shipped"][r].get(v)]
             for v in ("idempo_two_call", "idempo_one_call")}
    of_floor = [added[l][r]["idempo_one_call"] / added[l][r]["floor"] for r in rs
                if added[l][r].get("floor") and "idempo_one_call" in added[l][r]]
    print(f"| {l} | {span(col['floor'])} | {span(col['idempo_two_call'])} | {span(col['idempo_one_call'])} | "
          f"{span(ratio['idempo_two_call'], '.2f')} | {span(ratio['idempo_one_call'], '.2f')} | "
          f"{span(of_floor, '.2f')} |")

hot = defaultdict(lambda: [0, 0])
for l, r, u, h in rows("hot.tsv"):
    hot[l][0] += int(u)
    hot[l][1] += int(h)
print("\nUpdates of idempo.operations during those runs (the two-call form's complete; the one-call "
      "form's row is born finished and never updated), and how many were HOT (no new index entry):\n")
print("| layout | updates | HOT | HOT share |\n|---|--:|--:|--:|")
for l in layouts:
    u, h = hot[l]
    print(f"| {l} | {u:,} | {h:,} | {100 * h / u if u else 0:.1f} % |")

sw = rows("sweep.tsv")
if sw:
    print("\nThe sweep (`bench_sweep(10000)` until nothing is due) of bulk-loaded rows, all due:\n")
    print("| layout | what | rows | seconds | rows/s |\n|---|---|--:|--:|--:|")
    for l, kind, n, s in sw:
        print(f"| {l} | {kind} | {int(n):,} | {float(s):.1f} | {int(n) / float(s):,.0f} |")
