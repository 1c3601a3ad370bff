#!/usr/bin/env python3
"""Prints the Markdown report of test/bench/scale from its result files.

usage: scale_report.py RESULTS_DIR
Per level, the claim's and the floor's latency come from the same pgbench runs (interleaved); the
ratio is taken per round, then its median.  Medians over rounds, [min-max].
"""
import sys
from collections import defaultdict

from results import reader, span

rows = reader(sys.argv[1])


def mib(b):
    return f"{int(b) / 2**20:,.0f} MiB"


meta = dict(rows("meta.tsv"))
# lat[n][round][variant] = (avg, p99)
lat = defaultdict(lambda: defaultdict(dict))
for sec, mode, var, rnd, cl, tps, avg, p99, *_ in rows("runs.tsv"):
    r, n = rnd.split(".")
    lat[int(n)][int(r)][var] = (float(avg), float(p99))

print("# Claim latency against stored operations\n")
print(f"Written by `{meta.get('command', 'test/bench/scale')}`; every full run rewrites this file. "
      f"PostgreSQL {meta.get('postgres', '?')}, commit {meta.get('commit', '?')}, {meta.get('date', '?')}, "
      f"wall time {int(meta.get('wall_s', 0)) // 60} min; machine memory "
      f"{int(meta.get('ram_kb', 0)) / 2**20:.1f} GiB, `shared_buffers = 1GB`.\n")
print("Per level, `idempo.operations` and the floor's `dedup` table (a bare (scope, key) primary key) "
      "are bulk-loaded with the same keys, spread evenly over the key space the claims draw from "
      "(`load.sql`, `load_floor.sql`), and vacuumed; tables under 10⁶ rows afresh for every round, "
      "the larger ones once (they gain the rounds' claims, under 5 %). Then each round is one "
      "pgbench run interleaving two autocommit transactions: the one-call claim of a new key "
      "(`claim.sql`) and the bare dedup insert of a new key (`claim_floor.sql`); 1 client, server "
      f"and pgbench on core {meta.get('core', '0')}, `synchronous_commit = off`. These are whole "
      "transactions, a claim alone against an insert alone, not costs added to a business write "
      "as in the other reports: their ratio is not the one of the 1.3× target. The ratio is taken "
      "within each round. Before the rounds, both tables' indexes are read into the operating "
      "system's page cache (`pg_prewarm(..., 'read')`), where a running installation keeps them; "
      "where they outgrow `shared_buffers` (1 GB), a claim reads its index pages from there.\n")
print("| stored operations | load s: idempo / floor | idempo.operations: table + indexes | dedup: table + index | "
      "claim avg µs | claim p99 µs | floor avg µs | floor p99 µs | claim / floor (avg) |")
print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for f in rows("levels.tsv"):
    n = int(f[0])
    if f[1] == "skipped":
        print(f"| {n:,} | skipped: {int(f[2]) / 2**20:.0f} GiB of disk needed, "
              f"{int(f[3]) / 2**20:.0f} GiB free | | | | | | | |")
        continue
    s_op, s_floor, op_t, op_i, d_t, d_i = f[2:8]
    rs = lat[n]
    col = lambda v, i: [rs[r][v][i] for r in rs if v in rs[r]]
    ratio = [rs[r]["claim"][0] / rs[r]["claim_floor"][0] for r in rs
             if "claim" in rs[r] and rs[r].get("claim_floor", (0,))[0] > 0]
    print(f"| {n:,} | {float(s_op):.0f} / {float(s_floor):.0f} | {mib(op_t)} + {mib(op_i)} | "
          f"{mib(d_t)} + {mib(d_i)} | {span(col('claim', 0))} | {span(col('claim', 1))} | "
          f"{span(col('claim_floor', 0))} | {span(col('claim_floor', 1))} | {span(ratio, '.2f')} |")
