#!/usr/bin/env python3
"""nocontext.py EXPECTED RESULT: diff of a regression file's expected and actual output without
the CONTEXT lines of errors (and their continuation lines), which PL/pgSQL adds to the errors it
raises and the C edition's functions do not.  Exit 0 when they agree."""
import difflib
import re
import sys

CONT = re.compile(r'^(PL/pgSQL function |SQL function |SQL statement |PL/pgSQL assignment |SQL expression )')


def strip(path):
    out, in_context = [], False
    for line in open(path, encoding='utf-8', errors='replace'):
        if line.startswith('CONTEXT:  '):
            in_context = True
            continue
        if in_context and CONT.match(line):
            continue
        in_context = False
        out.append(line)
    return out


a, b = strip(sys.argv[1]), strip(sys.argv[2])
diff = list(difflib.unified_diff(a, b, sys.argv[1], sys.argv[2]))
sys.stdout.writelines(diff)
sys.exit(1 if diff else 0)
