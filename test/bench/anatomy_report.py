#!/usr/bin/env python3
"""Prints the Markdown report of test/bench/anatomy from its result files.

usage: anatomy_report.py RESULTS_DIR
A variant's added cost is its average latency minus the baseline's in the same pgbench run (the
variants are interleaved in it); a step's cost is its added cost minus the previous step's, per
round.  Medians over rounds, [min-max].
"""
import sys
from collections import defaultdict

from results import reader, span

rows = reader(sys.argv[1])


meta = dict(rows("meta.tsv"))
avg = defaultdict(dict)          # avg[round][variant] = average latency, µs
for sec, mode, var, rnd, cl, tps, a, *_ in rows("runs.tsv"):
    avg[int(rnd)][var] = float(a)
added = {r: {v: vs[v] - vs["baseline"] for v in vs if v != "baseline"} for r, vs in avg.items()}


def col(v):
    return [added[r][v] for r in added if v in added[r]]


def diff(v, prev):
    return [added[r][v] - added[r][prev] for r in added if v in added[r] and prev in added[r]]


def ratio(v, of):
    return [added[r][v] / added[r][of] for r in added if v in added[r] and added[r].get(of)]


print(f"PostgreSQL {meta.get('postgres', '?')}, `{meta.get('command', '?')}`, commit "
      f"{meta.get('commit', '?')}, {meta.get('started', '?')} to {meta.get('date', '?')}, {meta.get('wall_s', '?')} s. Added µs per "
      "transaction over the business insert alone, 1 client, pinned, "
      f"`synchronous_commit = {meta.get('synchronous_commit', 'off')}` (fsync on), "
      "every variant interleaved in one pgbench run per round; median [range] over rounds.\n")
print("### From the bare dedup insert to idempo's record\n")
print("| variant | what it adds | added µs | step µs | / floor |")
print("|---|---|--:|--:|--:|")
ladder = [
    ("floor", "bare dedup `INSERT … ON CONFLICT DO NOTHING`", None),
    ("step_returning", "`RETURNING`: a row back, as a claim's outcome", "floor"),
    ("step_fingerprint", "the params' sha256 fingerprint, stored", "step_returning"),
    ("step_record", "the rest of the one-call record (status, attempt, times)", "step_fingerprint"),
    ("step_sweep_index", "the `sweep_at` index: idempo's record, as one bare statement", "step_record"),
    ("idempo_one_call", "**idempo's one-call form** (params)", "step_sweep_index"),
    ("one_call_no_params", "idempo's one-call form without params (no fingerprint)", "floor"),
]
for v, what, prev in ladder:
    step = span(diff(v, prev)) if prev else ""
    print(f"| `{v}` | {what} | {span(col(v))} | {step} | {span(ratio(v, 'floor'), '.2f')} |")
print("\n\"step µs\" is the difference to the row above, except for `one_call_no_params`, whose is "
      "to `floor`.\n")
print("### The two-call form against plain SQL\n")
print("| variant | added µs | / plain_sql |")
print("|---|--:|--:|")
for v in ("plain_sql", "plain_sql_returning", "idempo_two_call"):
    print(f"| `{v}` | {span(col(v))} | {span(ratio(v, 'plain_sql'), '.2f')} |")
print(f"\n`idempo_two_call` / `plain_sql_returning`: {span(ratio('idempo_two_call', 'plain_sql_returning'), '.2f')}")

wal = rows("wal.tsv")
if wal:
    print("\n### WAL per transaction\n")
    print("Each variant run alone, `full_page_writes` off (no page images), "
          "`pg_current_wal_insert_lsn()` before and after, divided by the transactions:\n")
    print("| variant | bytes of WAL per transaction |\n|---|--:|")
    for v, b in wal:
        print(f"| `{v}` | {int(float(b)):,} |")
