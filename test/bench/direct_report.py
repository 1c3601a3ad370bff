#!/usr/bin/env python3
"""The report of test/bench/direct: for every major whose rounds are in DIR (direct-MAJOR.tsv and
direct-MAJOR.meta, written by test/bench/direct), at each client count, the direct writes' worth
and the standing single-claim targets.

usage: direct_report.py DIR

Each figure is the median over the rounds of a figure taken within one round (one pgbench run
with every variant interleaved), the rounds' range in brackets.  "Added" is a variant's average
latency minus the baseline's in the same round: what it adds to the business transaction.
"""
import os
import statistics
import sys

COLS = ["major", "section", "mode", "variant", "round", "clients", "tps", "avg", "p99", "n",
        "failed", "p50", "max"]


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            cells = line.rstrip("\n").split("\t")
            if len(cells) == len(COLS):
                rows.append(dict(zip(COLS, cells)))
    return rows


def fmt(values, digits=2, suffix="×"):
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}{suffix}"
    return f"{med:.{digits}f}{suffix} [{min(values):.{digits}f}–{max(values):.{digits}f}]"


def per_round(rows):
    """{(clients, round): {variant: avg µs}}"""
    out = {}
    for r in rows:
        out.setdefault((int(r["clients"]), int(r["round"])), {})[r["variant"]] = float(r["avg"])
    return out


def figures(rounds):
    """{clients: {figure: [value per round]}}"""
    out = {}
    for (clients, _), v in sorted(rounds.items()):
        need = ["baseline", "floor", "plain_sql", "idempo_one_call", "idempo_two_call",
                "one_call_direct", "one_call_sql", "two_call_direct", "two_call_sql"]
        if any(n not in v or v[n] <= 0 for n in need):
            continue
        add = {n: v[n] - v["baseline"] for n in need}
        f = out.setdefault(clients, {})

        def put(name, value):
            f.setdefault(name, []).append(value)
        put("baseline", v["baseline"])
        if add["floor"] > 0:
            put("one/floor", add["idempo_one_call"] / add["floor"])
        if add["plain_sql"] > 0:
            put("two/plain", add["idempo_two_call"] / add["plain_sql"])
        if add["one_call_sql"] > 0:
            put("one direct/sql", add["one_call_direct"] / add["one_call_sql"])
        if add["two_call_sql"] > 0:
            put("two direct/sql", add["two_call_direct"] / add["two_call_sql"])
        put("insert saves", v["one_call_sql"] - v["one_call_direct"])
        put("both save", v["two_call_sql"] - v["two_call_direct"])
        put("finish saves", (v["two_call_sql"] - v["two_call_direct"])
            - (v["one_call_sql"] - v["one_call_direct"]))
        put("one added", add["idempo_one_call"])
        put("two added", add["idempo_two_call"])
    return out


def main():
    d = sys.argv[1]
    majors = sorted(int(n[len("direct-"):-len(".tsv")]) for n in os.listdir(d)
                    if n.startswith("direct-") and n.endswith(".tsv"))
    if not majors:
        sys.exit(f"no direct-MAJOR.tsv in {d}")
    print("| PostgreSQL | clients | baseline µs | one-call added µs | two-call added µs "
          "| one-call / floor (≤ 1.3×) | two-call / plain SQL (≤ 0.9×) "
          "| one-call direct / SQL | two-call direct / SQL "
          "| µs saved: insert / insert + finish / finish |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    meta_lines = []
    for m in majors:
        rows = load(os.path.join(d, f"direct-{m}.tsv"))
        meta = {}
        mp = os.path.join(d, f"direct-{m}.meta")
        if os.path.exists(mp):
            with open(mp) as f:
                for line in f:
                    cells = line.rstrip("\n").split("\t")
                    if len(cells) == 3:
                        meta[cells[1]] = cells[2]
        for clients, f in sorted(figures(per_round(rows)).items()):
            print(f"| {meta.get('postgres', m)} | {clients} | {fmt(f['baseline'], 0, '')} "
                  f"| {fmt(f['one added'], 0, '')} | {fmt(f['two added'], 0, '')} "
                  f"| {fmt(f.get('one/floor', []))} | {fmt(f.get('two/plain', []))} "
                  f"| {fmt(f.get('one direct/sql', []))} | {fmt(f.get('two direct/sql', []))} "
                  f"| {statistics.median(f['insert saves']):.0f} / "
                  f"{statistics.median(f['both save']):.0f} / "
                  f"{statistics.median(f['finish saves']):.0f} |")
        meta_lines.append(f"- {meta.get('postgres', m)}: {meta.get('date', '?')}, "
                          f"{meta.get('rounds', '?')} rounds of {meta.get('length', '?')}, "
                          f"idempo {meta.get('idempo', '?')}, {meta.get('wall_s', '?')} s")
    print()
    print("\n".join(meta_lines))


if __name__ == "__main__":
    main()
