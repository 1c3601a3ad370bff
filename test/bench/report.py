#!/usr/bin/env python3
"""Writes docs/benchmarks.md from the result files of test/bench/run, and scale.dat for plot.gp.

usage: report.py RESULTS_DIR OUT.md PLOT_FILE_NAME
Medians are over rounds.  TPS ratios and added costs are computed per round (each variant against
the same round's baseline) and then their median is taken, which cancels most of the drift of a
shared machine; a ratio of two added costs is the ratio of their medians.
"""
import os
import statistics
import sys
from collections import defaultdict

from results import reader

res, out, plot_name = sys.argv[1:4]


rows = reader(res)


meta = {k: v for k, v in rows("meta.tsv")}
short = meta.get("short") == "1"

# runs[(section, mode, variant)][round] = (clients, tps, avg, p99, n, failed)
runs = defaultdict(dict)
for sec, mode, var, rnd, cl, tps, avg, p99, n, failed, *_ in rows("runs.tsv"):
    runs[(sec, mode, var)][int(rnd)] = (int(cl), float(tps), float(avg), float(p99), int(n), int(failed))


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def div(a, b):
    return a / b if a is not None and b else None


def col(sec, mode, var, i):
    return [r[i] for r in runs[(sec, mode, var)].values()]


def per_round(mode, f):
    """median over rounds of f(round -> {variant: tps}) (None where a value is missing)."""
    by_round = defaultdict(dict)
    for (sec, m, var), rs in runs.items():
        if sec == "write" and m == mode:
            for rnd, r in rs.items():
                if r[1] > 0:
                    by_round[rnd][var] = r[1]
    vals = []
    for tps in by_round.values():
        try:
            vals.append(f(tps))
        except (KeyError, ZeroDivisionError):
            pass
    return med(vals)


def base_of(tps, var):
    """the baseline measured with var: the _spi variants' interleaved runs have their own"""
    return "baseline_mixed" if var.endswith("_spi") and "baseline_mixed" in tps else "baseline"


def added(tps, var):
    return 1e6 / tps[var] - 1e6 / tps[base_of(tps, var)]


def fmt(x, spec=".0f", unit=""):
    return "n/a" if x is None else format(x, spec) + unit


MODES = {
    "1pin-off": "1 client, server and pgbench pinned to one core, synchronous_commit off",
    "1pin-on": "1 client, pinned, synchronous_commit on",
    "2cli-off": "2 clients, unpinned, synchronous_commit off",
    "2cli-on": "2 clients, unpinned, synchronous_commit on",
}
VARIANTS = {
    "baseline": "`BEGIN; INSERT business row; COMMIT`",
    "floor": "+ bare `INSERT … ON CONFLICT DO NOTHING` into a (scope, key) table",
    "floor_record": "+ bare `INSERT … ON CONFLICT DO NOTHING` of the record `idempo_one_call` stores, "
                    "sha256 fingerprint in SQL, into a copy of `idempo.operations` (same columns and "
                    "indexes)",
    "plain_sql": "+ insert-on-conflict with sha256(params), update with result (plain statements)",
    "plpgsql_ref": "+ hand-written PL/pgSQL claim/complete, brandur-style (`setup.sql`)",
    "idempo_two_call": "+ `idempo.claim(params)` … `idempo.complete(result, target_ref)`",
    "idempo_one_call": "+ `idempo.claim(params, complete_on_commit => true)`",
    "idempo_two_call_spi": "`idempo_two_call` with `idempo.direct_writes = off`: every write through SQL",
    "idempo_one_call_spi": "`idempo_one_call` with `idempo.direct_writes = off`",
}
PATHS = {
    "replay": "claim of a key that succeeded, same params → `replay`",
    "busy_lease": "`wait => false`, key `in_progress` with a live lease (committed) → `busy`",
    "busy_locked": "`wait => false`, key claimed by another session's open transaction → `busy`",
    "conflict": "same key, different params → `conflict`, recorded by the database's sweeper",
}

# ---- design targets, from the pinned single-client sync-off mode --------------------------
A = "1pin-off"
# added costs: median over rounds of (variant - baseline) µs; their ratios are ratios of medians
# (a per-round ratio of two small differences is too noisy); TPS ratios are medians per round
add = {v: per_round(A, lambda t, v=v: added(t, v)) for v in VARIANTS if v != "baseline"}
t_two_plain = div(add["idempo_two_call"], add["plain_sql"])
t_two_ref = per_round(A, lambda t: t["idempo_two_call"] / t["plpgsql_ref"])
t_one_floor = div(add["idempo_one_call"], add["floor"])
t_one_record = div(add["idempo_one_call"], add.get("floor_record"))
t_one_ref = per_round(A, lambda t: t["idempo_one_call"] / t["plpgsql_ref"])

levels = sorted({int(v) for (s, m, v) in runs if s == "scale"})
scale = {n: (med(col("scale", A, str(n), 2)), med(col("scale", A, str(n), 3))) for n in levels}
lo, hi = (levels[0], levels[-1]) if levels else (None, None)
t_scale_avg = div(scale[hi][0], scale[lo][0]) if levels else None
t_scale_p99 = div(scale[hi][1], scale[lo][1]) if levels else None
# the bare dedup insert alone at the smallest and largest size (claim_floor.sql)
fscale = {n: (med(col("scale_floor", A, str(n), 2)), med(col("scale_floor", A, str(n), 3))) for n in levels}
t_fscale_avg = div(fscale[hi][0], fscale[lo][0]) if levels else None

sweep = defaultdict(list)      # kind -> [(rows, seconds)], one per sweep
for k, n, s, *_ in rows("sweep.tsv"):
    sweep[k].append((int(float(n)), float(s)))
rate = {k: med([div(n, s) for n, s in v]) for k, v in sweep.items()}
idle = runs[("sweep", "1cli-off", "idle")]
during = runs[("sweep", "1cli-off", "during_sweep")]
p99_idle, p99_during = med(col("sweep", "1cli-off", "idle", 3)), med(col("sweep", "1cli-off", "during_sweep", 3))
t_p99 = med([div(during[r][3], idle[r][3]) for r in during if r in idle])


def verdict(x, limit, le=True):
    if x is None:
        return "n/a"
    return "**met**" if (x <= limit if le else x >= limit) else "**missed**"


targets = [
    ("Two-call added cost ≤ plain-SQL added cost",
     f"{fmt(add['idempo_two_call'])} µs vs {fmt(add['plain_sql'])} µs = {fmt(t_two_plain, '.2f')}×",
     verdict(t_two_plain, 1.0)),
    ("Two-call TPS ≥ 1.25 × PL/pgSQL reference", f"{fmt(t_two_ref, '.2f')}×", verdict(t_two_ref, 1.25, False)),
    ("One-call added cost ≤ 1.5 × bare dedup insert's",
     f"{fmt(add['idempo_one_call'])} µs vs {fmt(add['floor'])} µs = {fmt(t_one_floor, '.2f')}×; vs the bare "
     f"insert of the same record (`floor_record`, {fmt(add.get('floor_record'))} µs): {fmt(t_one_record, '.2f')}×",
     verdict(t_one_floor, 1.5)),
    ("One-call TPS ≥ 1.5 × PL/pgSQL reference", f"{fmt(t_one_ref, '.2f')}×",
     verdict(t_one_ref, 1.5, False)),
    (f"Claim latency at {lo and f'{hi:,}'} stored ≤ 1.3 × at {lo and f'{lo:,}'}",
     f"avg {fmt(t_scale_avg, '.2f')}× (p99 {fmt(t_scale_p99, '.2f')}×); the bare dedup insert alone: "
     f"avg {fmt(t_fscale_avg, '.2f')}×", verdict(t_scale_avg, 1.3)),
    ("Sweep ≥ 50k rows/s: purge", f"{fmt(rate.get('purge'), ',.0f')} rows/s", verdict(rate.get("purge"), 50000, False)),
    ("Sweep ≥ 50k rows/s: move to review",
     f"{fmt(rate.get('review'), ',.0f')} rows/s; the same row changes as bare SQL: "
     f"{fmt(rate.get('review_floor'), ',.0f')} rows/s, and without the reviews' (scope, key) index: "
     f"{fmt(rate.get('review_floor_no_open_idx'), ',.0f')} rows/s", verdict(rate.get("review"), 50000, False)),
    ("Claim p99 during a sweep ≤ 2 × idle",
     f"{fmt(p99_during)} µs vs {fmt(p99_idle)} µs (median of per-round ratios {fmt(t_p99, '.2f')}×)",
     verdict(t_p99, 2.0)),
]

# ---- document --------------------------------------------------------------------------------
L = []
w = L.append
w("# Benchmarks\n")
if short:
    w("> **Short mode** (`--short`): tiny sizes and runs that only prove the scripts work. "
      "The numbers below mean nothing.\n")
w("What idempo adds to a protected write transaction, against the floor (a bare dedup insert) and "
  "against the same protection written by hand; the replay, conflict and busy paths; claim latency "
  "against stored operations; the sweep; space. Written by `test/bench/run`; every full "
  "run rewrites this file. The machine is shared and noisy: read the **ratios** and **medians of "
  f"{meta.get('rounds')} rounds** (variants run one after the other, their order rotated every "
  "round; each ratio is taken within a round; the pinned `synchronous_commit = off` mode the "
  f"targets use: {meta.get('target_rounds', meta.get('rounds'))} rounds, each one run with the "
  "variants' transactions interleaved), not lone absolute times. Under load (8 and 64 clients, "
  "durable commits, hot keys, the cost of each option): [benchmarks-load.md](benchmarks-load.md); "
  "PostgreSQL 15, 17, 18 and 19 side by side: [benchmarks-versions.md](benchmarks-versions.md); up to "
  "10⁸ stored operations: [benchmarks-scale.md](benchmarks-scale.md); what a claim costs step by "
  "step, and the layout levers: [benchmarks-claim-cost.md](benchmarks-claim-cost.md).\n")
w(f"- Date: {meta.get('date')}; command: `{meta.get('command')}` (as root, from the clone); "
  f"wall time {int(meta.get('wall_s', 0)) // 60} min {int(meta.get('wall_s', 0)) % 60} s")
w(f"- Machine: {meta.get('cpu')}, {meta.get('nproc')} cores (nproc), {meta.get('ram')} RAM; {meta.get('os')}")
w(f"- PostgreSQL {meta.get('postgres')}; idempo {meta.get('idempo')}")
w(f"- Cluster: throwaway, Unix socket only; {meta.get('settings')}; pinned server affinity: "
  f"core {meta.get('server_affinity')}")
w(f"- Runs: `pgbench -M prepared`, {meta.get('lengths')}; pgbench runs {meta.get('failed')} failed\n")

w("## Design targets\n")
w("Measured with one client, server and pgbench pinned to one core, `synchronous_commit = off`, "
  f"median of {meta.get('target_rounds', meta.get('rounds'))} rounds; "
  "\"added cost\" = µs per transaction minus the baseline's, per round.\n")
w("| target | measured | |\n|---|---|---|")
for t in targets:
    w("| " + " | ".join(t) + " |")
w("")

w("## 1. Protected write\n")
w("Every variant writes the same business row (`shipments`, bigserial key) in one transaction; keys "
  "are random 15-digit numbers, so every claim inserts a new operation (checked: stored operations "
  f"/ idempo transactions = {meta.get('stored_vs_ran')}).\n")
w("| variant | transaction |\n|---|---|")
for v, d in VARIANTS.items():
    w(f"| `{v}` | {d} |")
w("")
for mode, title in MODES.items():
    if not any(s == "write" and m == mode for s, m, _ in runs):
        continue
    one = mode.startswith("1")
    mixed = bool(runs.get(("write", mode, "baseline_mixed")))
    w(f"### {title}\n")
    if mixed:
        w("The variants' transactions are interleaved: each round is one pgbench run with every "
          "variant's script, chosen at random per transaction, so that the machine's drift hits "
          "them alike (the `_spi` variants: a second run per round with their own baseline, as "
          "`idempo.direct_writes` is set per session). TPS = 10⁶ / the variant's average latency: "
          "what one client doing only that transaction would get.\n")
    w("| variant | TPS (median) | min–max | TPS vs baseline | µs per txn | added µs | avg latency µs | p99 µs |")
    w("|---|--:|--:|--:|--:|--:|--:|--:|")
    for v in VARIANTS:
        tps = col("write", mode, v, 1)
        if not tps:
            continue
        ratio = per_round(mode, lambda t, v=v: t[v] / t[base_of(t, v)])
        add_us = per_round(mode, lambda t, v=v: added(t, v))
        per_txn = 1e6 * (1 if one else 2) / med(tps) if med(tps) else None
        w(f"| `{v}` | {fmt(med(tps))} | {fmt(min(tps))}–{fmt(max(tps))} | {fmt(ratio, '.2f')} | "
          f"{fmt(per_txn)} | {fmt(add_us) if one and v != 'baseline' else ''} | "
          f"{fmt(med(col('write', mode, v, 2)))} | {fmt(med(col('write', mode, v, 3)))} |")
    if not one:
        w("\nµs per txn with 2 clients = 2 / TPS (CPU time per transaction on 2 cores).")
    w("")

w("## 2. Replay, conflict and busy paths\n")
w(f"{MODES[A]}; one claim per transaction (autocommit). Checked before measuring: each path answers "
  "the outcome named.\n")
w("| path | what | TPS (median) | avg latency µs | p99 µs |\n|---|---|--:|--:|--:|")
for v, d in PATHS.items():
    tps = col("write", A, v, 1)
    if tps:
        w(f"| `{v}` | {d} | {fmt(med(tps))} | {fmt(med(col('write', A, v, 2)))} | "
          f"{fmt(med(col('write', A, v, 3)))} |")
w("\nThe busy path was measured both ways: `busy_lease` (a committed `in_progress` row with a live "
  "lease; nobody holds the row, it is read `FOR UPDATE SKIP LOCKED`) and `busy_locked` (a "
  f"background psql holds 1000 claimed keys in an open transaction; the claim sees the running "
  f"inserter in the primary key and answers without waiting). "
  "A conflict is recorded durably by the database's sweeper in its own transaction (a second commit, `synchronous_commit = on`), and the claim waits for it, so the path costs about a commit more.\n")

w("## 3. Claim latency against stored operations\n")
w(f"{MODES[A]}. One claim of a new random key per transaction (`claim.sql`: one-call form, "
  "autocommit), against a table bulk-loaded with valid `succeeded` operations whose keys are spread "
  "evenly over the same key space (`load.sql`), vacuumed, indexes prewarmed (shared_buffers holds "
  "them). Tables under 10⁶ rows are reloaded for every round; the larger ones gain at most "
  f"{meta.get('rounds')} × the claims of a round. The last two columns: the floor's bare dedup insert "
  "alone (`claim_floor.sql`, autocommit) into its (scope, key) table loaded with the same keys "
  "(`load_floor.sql`), at the smallest and the largest size: the growth of any B-tree primary key "
  "on such keys.\n")
loads = {int(r[0]): r for r in rows("scale_load.tsv")}
w("| stored operations | load s | table + indexes | avg µs | p99 µs | avg vs smallest | p99 vs smallest "
  "| bare dedup insert: avg µs | its avg vs smallest |")
w("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
with open(os.path.join(res, "scale.dat"), "w") as dat:
    dat.write("# stored avg_us p99_us\n")
    for n in levels:
        a, p = scale[n]
        ld = loads.get(n, [n, "", 0, 0])
        mb = (int(ld[2]) + int(ld[3])) / 2**20
        fa = fscale[n][0]
        w(f"| {n:,} | {ld[1]} | {mb:,.0f} MB | {fmt(a)} | {fmt(p)} | {fmt(div(a, scale[lo][0]), '.2f')} | "
          f"{fmt(div(p, scale[lo][1]), '.2f')} | {fmt(fa) if fa else ''} | "
          f"{fmt(div(fa, fscale[lo][0]), '.2f') if fa else ''} |")
        dat.write(f"{n} {a or 0} {p or 0}\n")
w(f"\n![claim latency against stored operations](../test/bench/{plot_name})\n")

w("## 4. Sweep\n")
w(f"`idempo.sweep(10000)` called until it returns zeros, committing after each call (`sweep.sql`), "
  f"with `idempo.clock_offset = '2h'` so that all loaded rows (retention 1 hour) are due.\n")
w("| work | rows | seconds | rows/s |\n|---|--:|--:|--:|")
labels = {"purge": "purge (`succeeded` past `expires_at`)",
          "review": "move to review (`unknown` past retention; opens a review each)",
          "review_floor": "the same row changes as bare SQL (`bench_review_floor`: lock, insert the "
                          "reviews, update the rows; no decisions)",
          "review_floor_no_open_idx": "the same bare SQL without the index `reviews_open_idx` "
                                      "(scope, key) that keeps one open review per operation",
          "purge_under_claims": "purge, while one client claims"}
for k, v in sweep.items():
    secs = [s for _, s in v]
    w(f"| {labels.get(k, k)}{f' (median of {len(v)})' if len(v) > 1 else ''} | {v[0][0]:,} | "
      f"{fmt(med(secs), '.1f')} | {fmt(rate[k], ',.0f')} |")
w(f"\nClaim latency (one client, unpinned, `claim.sql`), idle vs during the purge above "
  "(transactions that ended while the sweep ran); per round: reload, sweep with claims, then the "
  "idle run (after a reload p99 settles over ~10 s, so this order counts that against the sweep):\n")
w("| round | idle: transactions | avg µs | p99 µs | during sweep: transactions | avg µs | p99 µs | p99 ratio |")
w("|--:|--:|--:|--:|--:|--:|--:|--:|")
for r in sorted(during):
    i, d = idle.get(r), during[r]
    if i:
        w(f"| {r} | {i[4]:,} | {fmt(i[2])} | {fmt(i[3])} | {d[4]:,} | {fmt(d[2])} | {fmt(d[3])} | "
          f"{fmt(div(d[3], i[3]), '.2f')} |")
w("")

w("## 5. Space\n")
space = rows("space.tsv")
hot = rows("hot.tsv")
if space:
    first = next(r for r in space if r[1] == "peak")
    n, tl, tupl, dead, free, pk, sw = (int(x) for x in first[2:])
    w(f"Operations written through the API (`space.sql`: UUID keys, params of two fields, result "
      f"`{{\"shipment_id\": n}}`, target_ref): after the first wave of {n:,} claim → complete:\n")
    w("| | bytes per operation |\n|---|--:|")
    w(f"| table (heap) | {tl / n:.0f} |")
    w(f"| of which live row versions | {tupl / n:.0f} |")
    w(f"| of which dead versions (the claim's, replaced by complete) | {dead / n:.0f} |")
    w(f"| of which free space | {free / n:.0f} |")
    w(f"| primary key (scope, key) | {pk / n:.0f} |")
    w(f"| sweep_at index | {sw / n:.0f} |")
    w(f"| **total** | **{(tl + pk + sw) / n:.0f}** |")
    w(f"| live row versions + indexes (once the claim's versions are pruned) | {(tupl + pk + sw) / n:.0f} |")
    if loads:
        n7 = max(loads)
        ld = loads[n7]
        w(f"\nBulk-loaded rows (section 3, 16-character keys, {n7:,} rows, right after load and VACUUM): "
          f"table {int(ld[2]) / n7:.0f} + indexes {int(ld[3]) / n7:.0f} = "
          f"{(int(ld[2]) + int(ld[3])) / n7:.0f} bytes per operation.")
    w(f"\nGrowth over {len(space) // 2} waves of claim → complete, each followed by a sweep that purges "
      "them (clock offset past expiry) and `VACUUM (TRUNCATE false)`:\n")
    w("| wave | after | live rows | table MB | dead MB | free MB | pkey MB | sweep_at idx MB |")
    w("|--:|---|--:|--:|--:|--:|--:|--:|")
    last = len(space) // 2
    for r in space:
        if r[1] == "vacuumed" and r[0] not in ("1", str(last)):
            continue
        n, tl, tupl, dead, free, pk, sw = (int(x) for x in r[2:])
        mb = lambda x: f"{x / 2**20:.1f}"
        w(f"| {r[0]} | {'claims' if r[1] == 'peak' else 'sweep + VACUUM'} | {n:,} | {mb(tl)} | {mb(dead)} | "
          f"{mb(free)} | {mb(pk)} | {mb(sw)} |")
    peaks = [r for r in space if r[1] == "peak"]
    g = lambda i: div(int(peaks[-1][i]), int(peaks[0][i]))
    g2 = lambda i: div(int(peaks[-1][i]), int(peaks[min(1, len(peaks) - 1)][i]))
    w(f"\nLast wave vs first, at the peak: table {fmt(g(3), '.2f')}×, primary key {fmt(g(7), '.2f')}×, "
      f"sweep_at index {fmt(g(8), '.2f')}×; last vs second: table {fmt(g2(3), '.2f')}×, primary key "
      f"{fmt(g2(7), '.2f')}×, sweep_at index {fmt(g2(8), '.2f')}×. The heap is reused as it is; a B-tree "
      "page that VACUUM empties is recycled only by a later VACUUM, so the indexes settle at the size "
      "of two waves' keys and stay there.")
if hot:
    upd, hupd, opts = hot[0] + [""] * (3 - len(hot[0]))
    w(f"\nHOT: {int(hupd):,} of {int(upd):,} updates of `idempo.operations` were HOT "
      f"(**{fmt(div(int(hupd), int(upd)), '.1%')}**); reloptions `{opts}`.")
w("""
Why: the table has `fillfactor = 90`, so each page keeps ~800 bytes free when rows are inserted.
`complete` (and `fail`) change no indexed column — `sweep_at` is left alone, since it may be early,
never late — so their UPDATE can be a HOT update: the new row version goes on the same page, no
index entry is added, and the claim's version is pruned from the page later without VACUUM having
to touch the indexes. A lower fillfactor would make room for more than one update per page at the
price of a bigger table; every operation is updated at most a few times, so 90 is enough. The
indexes are the primary key (needed for the claim's lookup) and the partial `sweep_at` index (the
sweep's work queue); both are emptied by the purge, and freed pages are reused after VACUUM.

The runner ANALYZEs the table after each wave's claims and its VACUUM does not truncate, as
autovacuum would keep statistics current. Found while building this suite, with builds before
commit c03b4ca (autovacuum off): a kept plan made while `idempo.operations` looked empty stayed
until the next ANALYZE. (1) After a sweep emptied the table and a truncating VACUUM shrank it to 0
pages, `complete()`'s UPDATE became a sequential scan: 5,000 claim → complete pairs took 3.3 s, the
next 5,000 11 s (0.4 s without truncation), and a wave of 10⁵ did not finish in 10 minutes.
(2) After a non-truncating VACUUM of the emptied table (`reltuples = 0`), the sweep's batch
`DELETE … USING ROWS FROM (unnest($1), unnest($2))` ran as a nested loop over a full primary-key
scan with the keys as a join filter: purging the next 10⁵ rows had not finished after 4 minutes.
c03b4ca builds idempo's plans generic, with sequential scans and hash and merge joins disabled;
rechecked with it: after a truncating VACUUM of the emptied table, 20,000 pairs took 1.8 s and
their sweep 0.3 s.
""")

w("## How it is measured\n")
w("""- `test/bench/run` installs what it needs, builds and installs idempo, starts a throwaway cluster
  (`autovacuum = off` — the runner vacuums between rounds — no checkpoint during the run,
  `wal_level = minimal` so that bulk loads of a freshly truncated table skip the WAL; per-transaction
  WAL is the same as with `replica`) and stops it at the end.
- Pinned modes restart the server under `taskset -c 0`, so the postmaster and every backend run on
  core 0 with pgbench (`taskset -c 0 pgbench`): unpinned single-client numbers on these VMs are
  dominated by cross-core wake-ups. `synchronous_commit` is set per run with `PGOPTIONS`.
- TPS is pgbench's; latencies (avg, p99) come from `pgbench --log` (one line per transaction).
- Claims are called as `SELECT (idempo.claim(...)).outcome`, the form docs/performance.md recommends for hot paths (a
  function in `FROM` is materialized through a tuplestore).
- `test/bench/profile [VARIANT] [SECONDS]` profiles one variant's backend with
  `perf record -e cpu-clock -g` (same setup, pinned, one client) and prints the top symbols.
- The scripts: `test/bench/pgbench/*.sql` (one per variant and path), `setup.sql` (tables, the
  PL/pgSQL reference, fixtures), `load.sql` (bulk load), `sweep.sql`, `space.sql`, `holder.sql`.
""")

with open(out, "w") as f:
    f.write("\n".join(L))
