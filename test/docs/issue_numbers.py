#!/usr/bin/env python3
"""The docs speak to their readers, who have no access to the project's issue tracker: no page
may cite an internal issue number ("issue 28's 5 %", "targets of issue 19", "(#28)").  A page
says the rule or the target and its figure instead.  An upstream issue stays citable in the
form owner/repo#N (patroni/patroni#2689) or by its address.

The same holds for comments and test names: the code, the tests and the build files are checked
for the spelled-out form ("issue 28", "issues 27 and 29"; a bare "#28" is too common in code to
mean an issue there).

usage: issue_numbers.py --root REPO [FILE...]
Without files: every Markdown file of the tree (README.md, SECURITY.md, CONTRIBUTING.md, docs/,
managed/, clients/; not node_modules), one test each, and the other text files of src/,
managed/, clients/, sql/, expected/, test/, debian/, .ci/ and the root, one test for all.
First checks itself on lines that must and must not be flagged (so that a pattern that stopped
matching fails here, not silently), then prints one line per test ("ok" / "FAILED" with each
citation and its line) and, last, "N passed, N failed".
"""
import argparse
import os
import re
import sys

SPELLED = r'\bissues?[ \t-]+(no\.?\s*)?#?\d+'   # issue 28, Issues 27 and 29, issue-25, issue #28
CITATION = re.compile(SPELLED + r'|(?<![\w/.&#-])#\d+\b(?![\w-])',  # a bare #28 (not owner/repo#28,
                      re.I)                                          # &#8212;, #28a5ff)
CODE_CITATION = re.compile(SPELLED, re.I)
CODE_DIRS = ('src', 'managed', 'clients', 'sql', 'expected', 'test', 'debian', '.ci')
SKIP_DIRS = {'node_modules', '.git', 'results', 'tmp_check', 'build', '__pycache__'}
SELF = os.path.abspath(__file__)

# (line, flagged?): the check's own test; each is counted as a test
SELF_TEST = [
    ("**Issue 28's 5 % is not met**", True),
    ('Targets of issue 19: one-call', True),
    ('(issues 27 and 29)', True),
    ('From the review of the issue-25 fixes', True),
    ('fixed in #28, see there', True),
    ('(#104)', True),
    ('see issue #7', True),
    ('Patroni 3.0.3 fixed it (patroni/patroni#2689)', False),
    ('a dash &#8212; as an entity', False),
    ('colour #28a5ff and #fff', False),
    ('[the reference](reference.md#claim)', False),
    ('## 0.3.0 and issues that a user may hit', False),
    ('Run the whole list before resolving an issue that touches `src/`.', False),
]


# the same for code: the spelled-out form only
CODE_SELF_TEST = [
    ('-- Fingerprint include rules (issue 28): a scope', True),
    ('# Soak test (issue 29): does', True),
    ('echo "step #1 of $#"; a[#2]', False),
]


def citations(text, pattern=CITATION):
    """(line number, citation) for every issue number cited in text."""
    found = []
    for n, line in enumerate(text.split('\n'), 1):
        for m in pattern.finditer(line):
            found.append((n, m.group(0)))
    return found


def code_files(root):
    """The text files outside Markdown that the tree's comments and tests live in."""
    out = [os.path.join(root, f) for f in sorted(os.listdir(root))
           if os.path.isfile(os.path.join(root, f)) and not f.endswith('.md')]
    for top in CODE_DIRS:
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS)
            out += [os.path.join(d, f) for f in sorted(files) if not f.endswith('.md')]
    return [f for f in out if os.path.abspath(f) != SELF]


def read_text(path):
    """A file's text, or None for a binary file."""
    try:
        data = open(path, 'rb').read()
    except OSError:
        return None
    if b'\0' in data[:8192]:
        return None
    return data.decode('utf-8', errors='replace')


def default_files(root):
    out = []
    for top in ('.', 'docs', 'managed', 'clients'):
        base = os.path.join(root, top)
        if not os.path.isdir(base):
            continue
        for d, dirs, files in os.walk(base):
            dirs[:] = sorted(x for x in dirs if x not in ('node_modules', '.git'))
            out += [os.path.join(d, f) for f in sorted(files) if f.endswith('.md')]
            if top == '.':
                break                    # the root's own files only: the others are walked above
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--root', required=True)
    ap.add_argument('files', nargs='*')
    args = ap.parse_args()
    ok = bad = 0
    for line, flagged, pattern in [(l, f, CITATION) for l, f in SELF_TEST] + \
            [(l, f, CODE_CITATION) for l, f in CODE_SELF_TEST]:
        got = bool(citations(line, pattern))
        if got == flagged:
            ok += 1
        else:
            bad += 1
            print(f'FAILED self-test: {line!r} should {"" if flagged else "not "}be flagged')
    files = args.files or default_files(args.root)
    if not args.files:
        found = []
        for path in code_files(args.root):
            text = read_text(path)
            if text is not None:
                rel = os.path.relpath(path, args.root)
                found += [(rel, n, c) for n, c in citations(text, CODE_CITATION)]
        if found:
            bad += 1
            print('FAILED code, tests and build files cite issue numbers (say the rule or the target and its figure):')
            for rel, n, c in found:
                print(f'  {rel}:{n}: {c}')
        else:
            ok += 1
            print('ok     code, tests and build files: no issue numbers')
    if not files:
        print('FAILED no Markdown file found under', args.root)
        bad += 1
    for path in files:
        rel = os.path.relpath(path, args.root)
        found = citations(open(path, encoding='utf-8').read())
        if found:
            bad += 1
            print(f'FAILED {rel}: cites issue numbers (say the rule or the target and its figure):')
            for n, c in found:
                print(f'  {rel}:{n}: {c}')
        else:
            ok += 1
            print(f'ok     {rel}: no issue numbers')
    print(f'{ok} passed, {bad} failed')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
