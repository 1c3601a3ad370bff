#!/usr/bin/env python3
"""idempo.fingerprint() against the independent implementation in reference.py.

    check.py plain|ignore|include SOCKET_DIR PORT DBNAME

plain: reference.py's random documents (fixed seed, so that a failure can be reproduced) and
the vectors of docs/fingerprints.md, each compared with idempo.fingerprint(doc).
ignore: the same for fingerprint_ignore, idempo.fingerprint(doc, paths), on random documents
with paths that exist and paths that do not, and the README's vectors.
include: the same for fingerprint_include (with fingerprint_ignore on some),
idempo.fingerprint(doc, ignore, include), and docs/fingerprint-rules.md's include vectors.

Prints "N documents, M mismatches" (and the first mismatches) and exits 1 on a mismatch or when
nothing was compared: the number of documents is whatever the reference produces, so adding a
vector changes nothing here.
"""
import json
import os
import subprocess
import sys

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = {  # mode: the reference's commands; each line is doc (as JSON text or a JSON string), [paths,] digest
    'plain': [['generate', '5000', '20261129'], ['vectors']],
    'ignore': [['generate-ignore', '3000', '20261130'], ['ignore-vectors']],
    'include': [['generate-include', '3000', '20261201'], ['include-vectors']],
}


def reference(args):
    out = subprocess.run([sys.executable, os.path.join(HERE, 'reference.py')] + args,
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        cols = line.split('\t')
        # the generators quote each document as a JSON string (it may hold tabs); the vectors do not
        doc = json.loads(cols[0]) if args[0].startswith('generate') else cols[0]
        yield (doc, cols[1] if len(cols) == 3 else '[]', cols[-1])


def main():
    mode, host, port, dbname = sys.argv[1:5]
    conn = psycopg.connect(host=host, port=port, user='postgres', dbname=dbname, autocommit=True)
    cur = conn.cursor()
    cur.execute("CREATE EXTENSION IF NOT EXISTS idempo")
    cur.execute("CREATE TEMP TABLE ref (doc text, paths text, sha256 text)")
    with cur.copy("COPY ref (doc, paths, sha256) FROM STDIN") as copy:
        for args in RUNS[mode]:
            for row in reference(args):
                copy.write_row(row)
    fp = {'plain': "idempo.fingerprint(doc::jsonb)",
          'ignore': "idempo.fingerprint(doc::jsonb, ARRAY(SELECT pg_catalog.jsonb_array_elements_text(paths::jsonb)))",
          'include': "idempo.fingerprint(doc::jsonb,"
                     " ARRAY(SELECT pg_catalog.jsonb_array_elements_text(paths::jsonb -> 'ignore')),"
                     " ARRAY(SELECT pg_catalog.jsonb_array_elements_text(paths::jsonb -> 'include')))"}[mode]
    cur.execute(f"SELECT doc, paths, sha256, encode({fp}, 'hex') FROM ref")
    rows = cur.fetchall()
    bad = [r for r in rows if r[2] != r[3]]
    for doc, paths, want, got in bad[:10]:
        print(f"mismatch: {doc} ignoring {paths}: reference {want}, idempo {got}")
    print(f"{len(rows)} documents, {len(bad)} mismatches")
    return 0 if rows and not bad else 1


if __name__ == '__main__':
    sys.exit(main())
