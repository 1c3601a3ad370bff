#!/usr/bin/env python3
"""Runs the snippets of Markdown files: the docs suite's executor (test/docs/run starts the
cluster and calls this as the cluster user).  The convention is docs/internals.md, "Docs that
run"; in short:

  ```sql     runs in psql, in order, in one session per file, on a new database per file
  ```sh      runs in bash -e at its place in the file (cwd: the repository, PG* set to that database)
  ```output  directly after a sql or sh block: what that block prints, compared line by line
  anything else (text, console, ini, yaml, python, js, ...) is not run

A file's database is created empty; unless one of its sql blocks creates the extension itself,
CREATE EXTENSION idempo runs first.  A block without an output block passes if it prints no
ERROR (sql) or exits 0 (sh).  Fences that look runnable but are not (bash, shell, psql, SQL,
...) are refused, so that a snippet cannot leave the suite by a spelling.

usage: snippets.py --psql PATH --host DIR --port N --root REPO FILE.md...
Prints one line per block ("ok" / "FAILED" with the difference) and, last, "N passed, N failed".
"""
import argparse
import difflib
import os
import re
import select
import subprocess
import sys
import time

RUN = {'sql', 'sh'}
OUTPUT = 'output'
# look runnable, are not: refused
REFUSED = {'bash', 'shell', 'zsh', 'psql', 'pgsql', 'postgres', 'postgresql', 'plpgsql', 'plsql'}
MARK = '@@docs-block-end@@'
BLOCK_TIMEOUT = 300
README_FIRST_CLAIM = 80           # lines
CREATES_EXTENSION = re.compile(r'create\s+extension\s+(if\s+not\s+exists\s+)?"?idempo"?\s*(;|with|schema|version|cascade|$)',
                               re.I | re.M)
FENCE = re.compile(r'^( {0,3}|\s*)(`{3,}|~{3,})\s*([^\s`]*)(.*)$')


class Block:
    def __init__(self, path, line, lang, text):
        self.path, self.line, self.lang, self.text = path, line, lang, text
        self.expected = None            # the output block's text, if one follows
        self.expected_line = None
        self.printed = None

    def where(self):
        return f'{self.path}:{self.line}'


def blocks_of(path, rel):
    """Fenced blocks of a Markdown file: [Block], with output blocks attached; problems: [str]."""
    lines = open(path, encoding='utf-8').read().split('\n')
    found, problems = [], []
    i = 0
    last_end = None                     # line index after the previous block's closing fence
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3)
        start = i
        body = []
        i += 1
        while i < len(lines):
            c = re.match(r'^\s*(`{3,}|~{3,})\s*$', lines[i])
            if c and c.group(1)[0] == fence[0] and len(c.group(1)) >= len(fence):
                break
            body.append(lines[i][indent:] if lines[i][:indent].strip() == '' else lines[i].lstrip())
            i += 1
        else:
            problems.append(f'{rel}:{start + 1}: a fence that is never closed')
        i += 1
        b = Block(rel, start + 1, lang, '\n'.join(body))
        low = lang.lower()
        if lang == OUTPUT:
            prev = found[-1] if found else None
            between = lines[last_end:start] if last_end is not None else ['x']
            if prev is None or prev.lang not in RUN or prev.expected is not None or any(s.strip() for s in between):
                problems.append(f'{rel}:{start + 1}: an output block must directly follow a sql or sh block')
            else:
                prev.expected = b.text
                prev.expected_line = start     # index of the output block's opening fence
        elif lang not in RUN and (low in RUN or low in REFUSED):
            problems.append(f'{rel}:{start + 1}: fence "{lang}": write ```sql or ```sh to run it, '
                            '```text or ```console if it must not run')
        found.append(b)
        last_end = i
    return [b for b in found if b.lang in RUN], problems


def slugs_of(path):
    """GitHub's anchors for the headings of a Markdown file (outside fences)."""
    seen, out, fence = {}, set(), None
    for line in open(path, encoding='utf-8').read().split('\n'):
        m = re.match(r'^\s*(`{3,}|~{3,})', line)
        if m:
            fence = None if fence and m.group(1)[0] == fence else (fence or m.group(1)[0])
            continue
        h = None if fence else re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
        if h:
            slug = re.sub(r'[^\w\- ]', '', h.group(1).lower()).replace(' ', '-')
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f'{slug}-{n}')
    return out


def broken_links(path, rel, root):
    """Relative links whose file or heading does not exist: [str]."""
    text = re.sub(r'(?ms)^\s*(`{3,}|~{3,}).*?^\s*\1\s*$', '', open(path, encoding='utf-8').read())
    text = re.sub(r'`[^`\n]*`', '', text)
    problems = []
    for target in re.findall(r'\]\(([^)\s]+)\)', text):
        if re.match(r'^[a-z]+:', target):
            continue
        file, _, anchor = target.partition('#')
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
        if not os.path.realpath(dest).startswith(os.path.realpath(root)) or not os.path.exists(dest):
            problems.append(f'{rel}: link to {target}: no such file')
        elif anchor and dest.endswith('.md') and anchor not in slugs_of(dest):
            problems.append(f'{rel}: link to {target}: no such heading')
    return problems


def normalize(text):
    out = []
    for line in text.split('\n'):
        line = re.sub(r'^psql:<stdin>:\d+: ', '', line)
        out.append(line.rstrip())
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return out


class Session:
    """One psql session, fed block by block; each block's output is read up to a marker."""

    def __init__(self, psql, env):
        self.proc = subprocess.Popen(
            ['stdbuf', '-oL', '-eL', psql, '-X', '-q', '-v', 'ON_ERROR_STOP=0', '-P', 'pager=off'],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            bufsize=0)
        self.buf = b''

    def run(self, text):
        self.proc.stdin.write((text + f'\n\\echo {MARK}\n').encode('utf-8'))
        fd, deadline = self.proc.stdout.fileno(), time.monotonic() + BLOCK_TIMEOUT
        while True:
            lines = self.buf.split(b'\n')
            if MARK.encode() in lines[:-1]:
                at = lines.index(MARK.encode())
                self.buf = b'\n'.join(lines[at + 1:])
                return b'\n'.join(lines[:at]).decode('utf-8', 'replace'), None
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return self.buf.decode('utf-8', 'replace'), f'no end within {BLOCK_TIMEOUT} s (a statement without its semicolon?)'
            chunk = os.read(fd, 65536)
            if not chunk:
                return self.buf.decode('utf-8', 'replace'), 'psql ended'
            self.buf += chunk

    def close(self):
        try:
            self.proc.stdin.write(b'\\q\n')
            self.proc.stdin.close()
            self.proc.wait(30)
        except Exception:
            self.proc.kill()


def check(block, got, trouble):
    """-> None if the block passed, else why not."""
    if trouble:
        return trouble + ('\n' + got if got else '')
    lines = normalize(got)
    if block.expected is not None:
        want = normalize(block.expected)
        if lines != want:
            return 'output differs:\n' + '\n'.join(difflib.unified_diff(want, lines, 'shown', 'printed', lineterm=''))
        return None
    if block.lang == 'sql':
        # errors, and psql's own complaints (a failed \\i, an unknown command, \\gset without a
        # row) and warnings, which a block without shown output must not print either
        bad = [s for s in lines if re.match(r'^(ERROR|FATAL|PANIC|WARNING):', s) or re.match(r'^psql:.*(error|warning):', s)
               or re.match(r'^(invalid command|no rows returned for \\gset|more than one row returned for \\gset)', s)
               or re.search(r': No such file or directory$', s)]
        if bad:
            return '\n'.join(lines)
    return None


def last_statement_closed(text):
    """A sql block must not leave a statement open for the next one."""
    code = [s for s in text.split('\n') if s.strip() and not s.strip().startswith('--')]
    if not code:
        return True
    last = re.sub(r'\s--.*$', '', code[-1]).rstrip()
    return last.endswith(';') or last.lstrip().startswith('\\')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--psql', required=True)
    ap.add_argument('--host', required=True)
    ap.add_argument('--port', required=True)
    ap.add_argument('--root', required=True)
    ap.add_argument('--fill', action='store_true',
                    help='write what a block printed into its empty output block (in place)')
    ap.add_argument('files', nargs='+')
    a = ap.parse_args()
    passed = failed = 0
    base = dict(os.environ, PGHOST=a.host, PGPORT=a.port, PGUSER='postgres')
    base.pop('PGOPTIONS', None)
    for n, path in enumerate(a.files, 1):
        rel = os.path.relpath(path, a.root)
        blocks, problems = blocks_of(path, rel)
        problems += broken_links(path, rel, a.root)
        if rel == 'README.md':
            # the README shows a claim early: a reader meets the API within the first screens
            first = next((b.line + b.text.split('\n').index(l) + 1 for b in blocks if b.lang == 'sql'
                          for l in b.text.split('\n') if 'idempo.claim(' in l), None)
            if first is None or first > README_FIRST_CLAIM:
                problems.append(f'{rel}: the first idempo.claim( of a sql block is on line {first}, '
                                f'not within the first {README_FIRST_CLAIM}')
        for p in problems:
            print(f'FAILED  {p}')
            failed += 1
        if not blocks:
            continue
        db = f'docs_{n}'
        admin = subprocess.run([a.psql, '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', 'postgres',
                                '-c', f'DROP DATABASE IF EXISTS {db}', '-c', f'CREATE DATABASE {db}'],
                               env=base, capture_output=True, text=True)
        if admin.returncode != 0:
            print(f'FAILED  {rel}: could not create database {db}: {admin.stderr.strip()}')
            failed += 1
            continue
        env = dict(base, PGDATABASE=db)
        session = Session(a.psql, env)
        if not any(b.lang == 'sql' and CREATES_EXTENSION.search(b.text) for b in blocks):
            got, trouble = session.run('CREATE EXTENSION idempo;')
            if trouble or normalize(got):
                print(f'FAILED  {rel}: CREATE EXTENSION idempo: {trouble or got}')
                failed += 1
                session.close()
                continue
        print(f'-- {rel}: {len(blocks)} blocks, database {db}')
        for b in blocks:
            if b.lang == 'sql':
                if not last_statement_closed(b.text):
                    why = 'the block ends inside a statement (no closing semicolon)'
                else:
                    got, trouble = session.run(b.text)
                    why = check(b, got, trouble)
            else:
                try:
                    r = subprocess.run(['bash', '-e', '-o', 'pipefail', '-c', b.text], cwd=a.root, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       timeout=BLOCK_TIMEOUT)
                    why = check(b, r.stdout, None if r.returncode == 0 else f'exit status {r.returncode}')
                except subprocess.TimeoutExpired:
                    why = f'no end within {BLOCK_TIMEOUT} s'
            if a.fill and b.expected is not None and not b.expected.strip() and why and why.startswith('output differs'):
                b.printed = normalize(got if b.lang == 'sql' else r.stdout)
                why = None
            first = b.text.strip().split('\n')[0][:70] if b.text.strip() else '(empty)'
            if why is None:
                passed += 1
                print(f'ok      {b.where()} {b.lang}: {first}')
            else:
                failed += 1
                print(f'FAILED  {b.where()} {b.lang}: {first}')
                print('        ' + why.replace('\n', '\n        '))
        session.close()
        fills = [b for b in blocks if b.printed is not None]
        if fills:
            lines = open(path, encoding='utf-8').read().split('\n')
            for b in sorted(fills, key=lambda b: -b.expected_line):
                lines[b.expected_line + 1:b.expected_line + 1] = b.printed
            open(path, 'w', encoding='utf-8').write('\n'.join(lines))
            print(f'-- {rel}: filled {len(fills)} output blocks')
    print(f'{passed} passed, {failed} failed')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
