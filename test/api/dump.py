#!/usr/bin/env python3
"""The API of an installed idempo, as the text of a snapshot (test/api/README.md).

usage: dump.py --psql PATH --host DIR --port N --db DB --root REPO --includedir DIR --edition c|managed
       dump.py merge C.txt MANAGED.txt       the snapshot of both editions
       dump.py edition SNAPSHOT c|managed    one edition's lines of a snapshot, as dumped
       dump.py same SNAPSHOT                 fails unless both editions promise the same API
                                             (see same_api)
The snapshot holds both editions in one file: a line both editions dump as it stands, a line
only one of them dumps prefixed "[c] " or "[managed] ", sorted as if unprefixed (so that the
two forms of one function stand together).  Comment lines (#) are the header.
A dump prints, sorted: every function and procedure of schema idempo (arguments with names and
defaults, result, volatility, SECURITY, strictness, parallel safety, SET clauses, who may
EXECUTE it), every table, view, sequence and type with its columns, the enums, the idempo.*
settings (type, context, default, bounds), the event triggers (test/api/api.sql); then the
SQLSTATEs: those docs/errors.md's table and docs/reference.md document, and those the edition's
code raises (src/*.c through errcodes.h, and ERRCODE = '...' in its SQL).  A code raised but
documented nowhere prints as UNDOCUMENTED unless INTERNAL below says why no caller can meet it;
check_sqlstates() fails the suite on it whatever the snapshot says.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

# raised by the code, not documented: why no call of the documented API can meet them
INTERNAL = {
    '39P01': 'a trigger function (drop_guard, scopes_changed) called other than as its trigger',
    '3F000': "schema idempo dropped under the library (the extension's objects removed by hand)",
    '42P01': "a table of idempo dropped under the library (the extension's objects removed by hand)",
    '53200': 'out of memory',
}
DOC_CODE = re.compile(r'`([0-9A-Z]{2}[0-9A-Z]{3})`')
ERRORS_ROW = re.compile(r'^\|\s*`([0-9A-Z]{5})`\s*\|\s*([^|]+?)\s*\|')
C_ERRCODE = re.compile(r'errcode\((ERRCODE_[A-Z0-9_]+)\)')
SQL_ERRCODE = re.compile(r"ERRCODE\s*=\s*'([0-9A-Z]{5})'", re.I)
DEFINE = re.compile(r"#define\s+(ERRCODE_[A-Z0-9_]+)\s+MAKE_SQLSTATE\('(.)',\s*'(.)',\s*'(.)',\s*'(.)',\s*'(.)'\)")


def documented(root):
    """{code: name} from errors.md's table, and the codes reference.md quotes."""
    docs = {}
    for line in open(os.path.join(root, 'docs/errors.md'), encoding='utf-8'):
        m = ERRORS_ROW.match(line)
        if m:
            docs[m.group(1)] = m.group(2).replace('(idempo\'s own) ', '')
    ref = open(os.path.join(root, 'docs/reference.md'), encoding='utf-8').read()
    for code in DOC_CODE.findall(ref):
        docs.setdefault(code, 'in reference.md only')
    return docs


def raised(root, edition, includedir):
    """The SQLSTATEs the edition's code raises itself."""
    macros = {}
    for h in [os.path.join(includedir, 'utils/errcodes.h')] + glob.glob(os.path.join(root, 'src/*.h')):
        for m in DEFINE.finditer(open(h, encoding='utf-8').read()):
            macros[m.group(1)] = ''.join(m.group(i) for i in range(2, 7))
    codes = set()
    version = re.search(r"default_version\s*=\s*'([^']+)'",
                        open(os.path.join(root, 'idempo.control')).read()).group(1)
    # both editions run the install script's SQL functions; the C edition its library, the
    # managed edition its replacements
    sql = [os.path.join(root, 'src/sql/idempo--%s.sql' % version)]
    if edition == 'c':
        for f in glob.glob(os.path.join(root, 'src/*.c')):
            for name in C_ERRCODE.findall(open(f, encoding='utf-8').read()):
                if name not in macros:
                    sys.exit('dump.py: %s uses %s, which errcodes.h does not define' % (f, name))
                codes.add(macros[name])
    else:
        sql += glob.glob(os.path.join(root, 'managed/sql/*.sql'))
    for f in sql:
        codes.update(c.upper() for c in SQL_ERRCODE.findall(open(f, encoding='utf-8').read()))
    return codes


def sqlstate_lines(root, edition, includedir):
    docs, codes = documented(root), raised(root, edition, includedir)
    out = []
    for code in sorted(set(docs) | codes):
        if code in docs:
            out.append('sqlstate %s %s | documented | %s' % (code, docs[code], 'raised' if code in codes else
                                                              'not raised by its code'))
        elif code in INTERNAL:
            out.append('sqlstate %s internal | %s' % (code, INTERNAL[code]))
        else:
            out.append('sqlstate %s UNDOCUMENTED | raised, in neither docs/errors.md nor docs/reference.md' % code)
    return out


TAGS = ('[c] ', '[managed] ')


def merge(c_lines, m_lines):
    """The snapshot of both editions: shared lines bare, the others tagged with their edition."""
    c, m = set(c_lines), set(m_lines)
    tagged = [(l, '' if l in m else TAGS[0]) for l in c] + [(l, TAGS[1]) for l in m - c]
    tagged.sort(key=lambda t: (t[0].encode(), t[1]))
    return [tag + l for l, tag in tagged]


def edition(snapshot_lines, which):
    """The lines a dump of one edition prints, from a snapshot."""
    mine, other = (TAGS[0], TAGS[1]) if which == 'c' else (TAGS[1], TAGS[0])
    out = []
    for l in snapshot_lines:
        if l.startswith('#') or l.startswith(other):
            continue
        out.append(l[len(mine):] if l.startswith(mine) else l)
    return out


# what only the C edition has, by design (docs/managed-edition.md, "Differences")
C_ONLY = ('function idempo.drop_guard()', 'event trigger idempo_drop_guard ', 'setting idempo.')
# the fields of a routine's line that may differ: how it reaches the tables (the managed edition
# runs as their owner through SECURITY DEFINER and pins its search_path; the C edition switches
# to the owner inside)
MAY_DIFFER = {2: 'security', 5: 'config'}
SCHEDULING = ('idempo.schedule_sweep', 'idempo.unschedule_sweep', 'idempo.sweep_until_done')


def same_api(snapshot_lines):
    """Problems with the promise that both editions have one API: every object of the C edition
    but those of C_ONLY is in the managed edition, the same line, or for a function or procedure
    the same but for MAY_DIFFER; the managed edition's own objects are its helpers
    (idempo.managed_*, which only their owner may execute: internal_helper) and the pg_cron
    scheduling routines."""
    c, m = edition(snapshot_lines, 'c'), edition(snapshot_lines, 'managed')
    routine = lambda l: l.startswith(('function ', 'procedure '))
    m_routines = {l.split(' | ')[0]: l.split(' | ') for l in m if routine(l)}
    problems = []
    for l in set(c) - set(m):
        if l.startswith(C_ONLY) or l.startswith('sqlstate '):
            continue
        twin = m_routines.get(l.split(' | ')[0]) if routine(l) else None
        if twin is None:
            problems.append('only in the C edition: ' + l)
            continue
        a = l.split(' | ')
        for i, (x, y) in enumerate(zip(a, twin)):
            if x != y and i not in MAY_DIFFER:
                problems.append('%s: C %r, managed %r' % (a[0], x, y))
    c_names = {l.split(' | ')[0] for l in c if routine(l)}
    for l in set(m) - set(c):
        if l.startswith('sqlstate '):
            continue
        if l.startswith('helper idempo.managed_') and l.endswith('| execute none'):
            continue                     # a helper nobody but its owner may call
        if routine(l):
            name = l.split(' | ')[0]
            fname = name.split('(')[0].split(' ')[1]
            if name in c_names or fname in SCHEDULING:
                continue                 # a twin (compared above), or pg_cron's scheduling
        problems.append('only in the managed edition: ' + l)
    return sorted(problems)


def internal_helper(line):
    """The managed edition's helpers (idempo.managed_*, which nobody but their owner may execute)
    are not part of the API: a snapshot names each, and says that nobody may call it, without its
    arguments, so that their insides may change within a release series."""
    if line.startswith(('function idempo.managed_', 'procedure idempo.managed_')) and line.endswith('| execute none'):
        return 'helper ' + line.split('(')[0].split(' ')[1] + ' | execute none'
    return line


def read_lines(path):
    return [l for l in open(path, encoding='utf-8').read().split('\n') if l != '']


def main():
    if len(sys.argv) == 4 and sys.argv[1] == 'merge':
        print('\n'.join(merge(read_lines(sys.argv[2]), read_lines(sys.argv[3]))))
        return
    if len(sys.argv) == 4 and sys.argv[1] == 'edition' and sys.argv[3] in ('c', 'managed'):
        print('\n'.join(edition(read_lines(sys.argv[2]), sys.argv[3])))
        return
    if len(sys.argv) == 3 and sys.argv[1] == 'same':
        problems = same_api(read_lines(sys.argv[2]))
        print('\n'.join(problems))
        sys.exit(1 if problems else 0)
    ap = argparse.ArgumentParser()
    for a in ('--psql', '--host', '--port', '--db', '--root', '--includedir'):
        ap.add_argument(a, required=True)
    ap.add_argument('--edition', choices=('c', 'managed'), required=True)
    args = ap.parse_args()
    out = subprocess.run([args.psql, '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', '-h', args.host,
                          '-p', args.port, '-d', args.db, '-f', os.path.join(args.root, 'test/api/api.sql')],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit('dump.py: psql failed: ' + out.stderr.strip())
    lines = [internal_helper(l) for l in out.stdout.rstrip('\n').split('\n')]
    lines += sqlstate_lines(args.root, args.edition, args.includedir)
    print('\n'.join(sorted(lines, key=str.encode)))


if __name__ == '__main__':
    main()
