#!/usr/bin/env python3
"""Prints the side-by-side table of docs/benchmarks-versions.md from the reports test/bench/run
wrote for each PostgreSQL major (docs/benchmarks.md, docs/benchmarks-pg17.md, ...).

usage: versions_table.py REPORT.md...
Every figure is copied from a report: medians over its rounds, the ratios taken within a round.
"""
import re
import sys


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def section(lines, title):
    """The table rows (as cell lists) of the first table under a heading starting with title."""
    out, inside = [], False
    for ln in lines:
        if ln.startswith("#"):
            if inside:
                break
            inside = ln.lstrip("#").strip().startswith(title)
        elif inside and ln.startswith("| `"):
            out.append(cells(ln))
    return {r[0].strip("`"): r for r in out}


def target(lines, start):
    for ln in lines:
        if ln.startswith("| " + start):
            return cells(ln)[1]
    return ""


def num(s):
    m = re.search(r"[\d,]+(\.\d+)?", s or "")
    return float(m.group(0).replace(",", "")) if m else None


rows = []
for path in sys.argv[1:]:
    lines = open(path).read().splitlines()
    pg = next((re.search(r"PostgreSQL (\d+(?:\.\d+|(?:beta|rc)\d+))", ln).group(1) for ln in lines
               if ln.startswith("- PostgreSQL")), "?")
    off = section(lines, "1 client, server and pgbench pinned")
    on = section(lines, "1 client, pinned, synchronous_commit on")
    two = section(lines, "2 clients, unpinned, synchronous_commit off")
    paths = section(lines, "2. Replay")
    added = {v: num(off[v][5]) for v in off if off[v][5]}
    added_on = {v: num(on[v][5]) for v in on if on[v][5]}
    total = next((num(cells(ln)[1]) for ln in lines if ln.startswith("| **total**")), None)
    scale = re.search(r"avg ([\d.]+)×.*alone: avg ([\d.]+)×", target(lines, "Claim latency at"))
    rows.append([
        pg,
        off["baseline"][4],
        f"{added['floor']:.0f} / {added['plain_sql']:.0f} / {added['idempo_two_call']:.0f} / {added['idempo_one_call']:.0f}",
        re.search(r"= ([\d.]+×)", target(lines, "One-call added cost")).group(1),
        re.search(r"= ([\d.]+×)", target(lines, "Two-call added cost")).group(1),
        f"{added_on['floor']:.0f} / {added_on['plain_sql']:.0f} / {added_on['idempo_two_call']:.0f} / {added_on['idempo_one_call']:.0f}",
        f"{two['idempo_two_call'][3]} / {two['idempo_one_call'][3]}",
        f"{paths['replay'][3]} / {paths['conflict'][3]}",
        f"{scale.group(1)}× ({scale.group(2)}×)" if scale else "",
        re.sub(r" rows/s.*", "", target(lines, "Sweep ≥ 50k rows/s: purge")) + " / " +
        re.sub(r" rows/s.*", "", target(lines, "Sweep ≥ 50k rows/s: move to review")),
        f"{total:.0f}" if total else "",
    ])

print("| PostgreSQL | baseline µs | added µs, sync off: floor / plain SQL / two-call / one-call | "
      "one-call / floor | two-call / plain SQL | added µs, sync on: floor / plain SQL / two-call / one-call | "
      "2 clients, TPS vs baseline: two-call / one-call | replay / conflict µs | claim at 10⁷ vs 10⁴ stored "
      "(bare insert) | sweep rows/s: purge / to review | bytes per operation |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for r in rows:
    print("| " + " | ".join(r) + " |")
