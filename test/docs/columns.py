#!/usr/bin/env python3
"""The column lists of docs/reference.md ("Tables and views") against the installed objects.

Each object there is a heading '### `idempo.NAME`' (a function returning a table:
'### `idempo.NAME()`') followed by a Markdown table whose first two columns are the column's
name and its type as format_type() prints it, in the catalog's order.  This compares them with
a fresh CREATE EXTENSION idempo in a database of its own, and fails on any difference: a column
added, dropped, renamed, retyped or moved, or an object documented that does not exist.

usage: columns.py --psql PATH --host DIR --port N FILE.md             check (test/docs/run)
       columns.py --psql PATH --host DIR --port N --print NAME...     print a table to start from
Prints one line per object ("ok" / "FAILED" with the difference) and, last, "N passed, N failed".
"""
import argparse
import re
import subprocess
import sys

DB = 'idempo_docs_columns'
HEADING = re.compile(r'^###\s+`idempo\.([a-z_]+)(\(\))?`\s*$')
ROW = re.compile(r'^\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|')

# the columns of a table or view, or of the TABLE a function returns, in order
QUERY_REL = """SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = 'idempo.{name}'::pg_catalog.regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum"""
QUERY_FUNC = """SELECT u.n, pg_catalog.format_type(u.t, NULL)
FROM pg_catalog.pg_proc p,
     unnest(p.proargnames, p.proallargtypes::pg_catalog.oid[], p.proargmodes::text[])
         WITH ORDINALITY AS u(n, t, m, i)
WHERE p.oid = 'idempo.{name}'::pg_catalog.regproc AND u.m = 't'
ORDER BY u.i"""


def psql(args, db, sql):
    out = subprocess.run([args.psql, '-X', '-q', '-At', '-F', '\t', '-v', 'ON_ERROR_STOP=1',
                          '-h', args.host, '-p', str(args.port), '-d', db, '-c', sql],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return [tuple(line.split('\t')) for line in out.stdout.splitlines() if line]


def installed(args, name, func):
    return psql(args, DB, (QUERY_FUNC if func else QUERY_REL).format(name=name))


def documented(path):
    """{(name, is_function): [(column, type)]} in the order of the file."""
    objects, cur = {}, None
    for line in open(path, encoding='utf-8'):
        line = line.rstrip('\n')
        m = HEADING.match(line)
        if m:
            cur = (m.group(1), bool(m.group(2)))
            objects[cur] = []
            continue
        if line.startswith('#'):
            cur = None
        elif cur is not None:
            r = ROW.match(line)
            if r:
                objects[cur].append((r.group(1), r.group(2)))
    return objects


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--psql', required=True)
    ap.add_argument('--host', required=True)
    ap.add_argument('--port', required=True)
    ap.add_argument('--print', action='store_true')
    ap.add_argument('files', nargs='+')
    args = ap.parse_args()

    psql(args, 'postgres', f'DROP DATABASE IF EXISTS {DB}')
    psql(args, 'postgres', f'CREATE DATABASE {DB}')
    try:
        psql(args, DB, 'CREATE EXTENSION idempo')
        if args.print:
            for name in args.files:
                func = name.endswith('()')
                name = name.removesuffix('()')
                print(f'### `idempo.{name}{"()" if func else ""}`\n')
                print('| column | type | meaning |\n|---|---|---|')
                for col, typ in installed(args, name, func):
                    print(f'| `{col}` | `{typ}` | |')
                print()
            return 0
        passed = failed = 0
        for path in args.files:
            objects = documented(path)
            if not objects:
                print(f'FAILED {path}: no "### `idempo.NAME`" column lists found')
                failed += 1
            for (name, func), cols in objects.items():
                label = f'{path}: idempo.{name}{"()" if func else ""}'
                try:
                    real = installed(args, name, func)
                except RuntimeError as e:
                    print(f'FAILED {label}: {e}')
                    failed += 1
                    continue
                if cols == real:
                    print(f'ok     {label} ({len(real)} columns)')
                    passed += 1
                else:
                    print(f'FAILED {label}: documented and installed columns differ')
                    for i in range(max(len(cols), len(real))):
                        d = cols[i] if i < len(cols) else ('', '')
                        r = real[i] if i < len(real) else ('', '')
                        mark = '  ' if d == r else '!='
                        print(f'    {mark} {d[0] + " " + d[1]:<44} | {r[0]} {r[1]}')
                    failed += 1
        print(f'{passed} passed, {failed} failed')
        return 1 if failed else 0
    finally:
        psql(args, 'postgres', f'DROP DATABASE IF EXISTS {DB}')


if __name__ == '__main__':
    sys.exit(main())
