#!/usr/bin/env python3
"""The managed-service edition's install scripts, generated from the C edition's one.

    generate.py OUTDIR    writes OUTDIR/idempo--VERSION.pgtle.sql (for pg_tle: the version and
                          its update paths from 0.3.0), OUTDIR/idempo--VERSION.plain.sql (schema
                          idempo without pg_tle) and OUTDIR/idempo--A--B.plain.sql (the plain
                          script's updates); prints the first two paths as the last two lines,
                          the pg_tle installer first.

One source of truth: everything both editions share (types, tables, indexes, views, grants,
comments, the functions already written in SQL or PL/pgSQL) is taken from the C edition's
install script src/sql/idempo--VERSION.sql, statement by statement, never copied by hand.  Only
its LANGUAGE C functions are replaced, in place, by the definitions in managed/sql/*.sql.
The generation FAILS when
  - a C function has neither a replacement nor a declared omission,
  - a replacement's declaration differs from the C one (name, argument names, types and
    defaults, result, volatility, strictness, parallel safety, SECURITY, ROWS) unless the
    difference is declared next to it with  -- managed-differs: KEY: reason,
  - a replacement or an omission names something the C script does not have (a stale file),
  - the result contains pg_tle's reserved delimiters, MODULE_PATHNAME or a psql meta-command.
Declarations, in managed/sql/*.sql comments:
  -- managed-omit: KIND NAME: reason     leave a statement of the C script out (KIND: function,
                                         event trigger, trigger); statements that only comment
                                         on or grant an omitted function go with it
  -- managed-differs: KEY: reason        (just above a replacement) KEY is one of security,
                                         volatility, strict, parallel, rows, leakproof
  -- managed-not-yet: function NAME: hint
                                         a C function the edition does not have yet: its
                                         stand-in is generated from the C declaration itself
                                         (LANGUAGE plpgsql, a body that refuses with 0A000 and
                                         this hint), so the signature is written once
Statements of managed/sql/*.sql that replace nothing (helpers) go just before the first
replacement of their file.  An update A -> B (from 0.3.0 on, the managed edition's first version) is
the C update script src/sql/idempo--A--B.sql (passed as it is when it changes no C function and
nothing the edition leaves out; else the generation stops), then the edition's own functions as
this version has them (edition_refresh).
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ATTR_WORDS = {'language', 'as', 'immutable', 'stable', 'volatile', 'strict', 'called', 'security',
              'parallel', 'cost', 'rows', 'set', 'leakproof', 'not', 'window', 'return', 'begin',
              'external', 'support', 'transform', 'returns'}
SYNONYMS = {'int': 'integer', 'int4': 'integer', 'int8': 'bigint', 'bool': 'boolean',
            'timestamptz': 'timestamp with time zone', 'float8': 'double precision'}
COMPARED = ('returns', 'volatility', 'strict', 'parallel', 'security', 'rows', 'leakproof')
DIFFERABLE = {'security', 'volatility', 'strict', 'parallel', 'rows', 'leakproof'}


class GenError(Exception):
    pass


def tokens(sql):
    """(kind, text, start, end) for the SQL text: word, qident, string, dollar, number, punct,
    comment, meta (a psql backslash line); whitespace is skipped."""
    i, n = 0, len(sql)
    line_start = True
    while i < n:
        c = sql[i]
        if c in ' \t\r\f\v':
            i += 1
            continue
        if c == '\n':
            i += 1
            line_start = True
            continue
        start = i
        if c == '\\' and line_start:
            j = sql.find('\n', i)
            j = n if j < 0 else j
            yield ('meta', sql[i:j], i, j)
            i = j
            continue
        line_start = False
        if sql.startswith('--', i):
            j = sql.find('\n', i)
            j = n if j < 0 else j
            yield ('comment', sql[i:j], i, j)
            i = j
        elif sql.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                if sql.startswith('/*', j):
                    depth, j = depth + 1, j + 2
                elif sql.startswith('*/', j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            yield ('comment', sql[i:j], i, j)
            i = j
        elif c == "'" or (c in 'eE' and sql.startswith("'", i + 1)
                          and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == '_'))):
            backslash = c != "'"
            j = i + (2 if backslash else 1)
            while j < n:
                if backslash and sql[j] == '\\':
                    j += 2
                    continue
                if sql[j] == "'":
                    if sql.startswith("''", j):
                        j += 2
                        continue
                    break
                j += 1
            if j >= n:
                raise GenError('unterminated string at offset %d' % i)
            yield ('string', sql[i:j + 1], i, j + 1)
            i = j + 1
        elif c == '"':
            j = i + 1
            while j < n:
                if sql[j] == '"':
                    if sql.startswith('""', j):
                        j += 2
                        continue
                    break
                j += 1
            yield ('qident', sql[i:j + 1], i, j + 1)
            i = j + 1
        elif c == '$' and re.match(r'\$([A-Za-z_][A-Za-z_0-9]*)?\$', sql[i:]):
            tag = re.match(r'\$([A-Za-z_][A-Za-z_0-9]*)?\$', sql[i:]).group(0)
            j = sql.find(tag, i + len(tag))
            if j < 0:
                raise GenError('unterminated dollar quote %s at offset %d' % (tag, i))
            yield ('dollar', sql[i:j + len(tag)], i, j + len(tag))
            i = j + len(tag)
        elif c.isalpha() or c == '_':
            j = i
            while j < n and (sql[j].isalnum() or sql[j] in '_$'):
                j += 1
            yield ('word', sql[i:j], i, j)
            i = j
        elif c.isdigit():
            j = i
            while j < n and (sql[j].isalnum() or sql[j] == '.'):
                j += 1
            yield ('number', sql[i:j], i, j)
            i = j
        else:
            yield ('punct', c, i, i + 1)
            i += 1
        del start


def statements(sql):
    """The script cut into statements: (text, code tokens), each text running from the end of
    the previous statement to its own ';' (its leading comments included).  psql meta-commands
    are dropped; the tail after the last ';' (comments) is returned as a statement without code."""
    out, begin, code, cut = [], 0, [], []
    for kind, text, s, e in tokens(sql):
        if kind == 'meta':
            cut.append((s, e))
            continue
        if kind == 'comment':
            continue
        code.append((kind, text))
        if kind == 'punct' and text == ';':
            out.append((_without(sql, begin, e, cut), code))
            begin, code, cut = e, [], []
    tail = _without(sql, begin, len(sql), cut)
    if tail.strip():
        out.append((tail, code))
    return out


def _without(sql, b, e, cut):
    parts, pos = [], b
    for s, t in cut:
        parts.append(sql[pos:s])
        pos = t
    parts.append(sql[pos:e])
    return ''.join(parts)


def words(code):
    return [t.lower() if k == 'word' else t for k, t in code]


def statement_key(code):
    """('function', name) / ('event trigger', name) / ('trigger', name), or None."""
    w = words(code)
    if w[:2] == ['create', 'function'] or w[:4] == ['create', 'or', 'replace', 'function']:
        i = w.index('function') + 1
        name = w[i] + (w[i + 1] + w[i + 2] if w[i + 1] == '.' else '')
        return ('function', name)
    if w[:3] in (['create', 'event', 'trigger'], ['alter', 'event', 'trigger']):
        return ('event trigger', w[3])
    if w[:2] == ['create', 'trigger']:
        return ('trigger', w[2])
    return None


def referenced_functions(code):
    """Functions a COMMENT ON FUNCTION or GRANT/REVOKE ... ON FUNCTION statement names."""
    w = words(code)
    if not (w[:3] == ['comment', 'on', 'function'] or w[:1] in (['grant'], ['revoke'])):
        return []
    names = []
    for i in range(len(w) - 3):
        if w[i] == 'function' and w[i + 2] == '.':
            names.append(w[i + 1] + '.' + w[i + 3])
    return names


def norm_tokens(toks):
    out = []
    for k, t in toks:
        if k == 'word':
            t = SYNONYMS.get(t.lower(), t.lower())
        out.append(t)
    return ' '.join(out)


def parse_function(code):
    """The declaration of a CREATE FUNCTION statement, normalized for comparison."""
    w = words(code)
    i = w.index('function') + 1
    name = w[i] + (w[i + 1] + w[i + 2] if w[i + 1] == '.' else '')
    i += 3 if w[i + 1] == '.' else 1
    if w[i] != '(':
        raise GenError('cannot parse the arguments of %s' % name)
    depth, j = 0, i
    while True:
        if w[j] == '(':
            depth += 1
        elif w[j] == ')':
            depth -= 1
            if depth == 0:
                break
        j += 1
    f = {'name': name, 'args': norm_tokens(code[i + 1:j]), 'volatility': 'volatile',
         'strict': False, 'parallel': 'unsafe', 'security': 'invoker', 'rows': None,
         'leakproof': False, 'language': None, 'returns': None}
    i = j + 1
    end = len(w) - 1 if w[-1] == ';' else len(w)
    while i < end:
        x = w[i]
        if x == 'returns' and w[i + 1:i + 4] == ['null', 'on', 'null']:
            f['strict'], i = True, i + 5
        elif x == 'returns':
            j = i + 1
            depth = 0
            while j < end and (depth or w[j] not in ATTR_WORDS or j == i + 1):
                depth += w[j] == '('
                depth -= w[j] == ')'
                j += 1
            f['returns'] = norm_tokens(code[i + 1:j])
            i = j
        elif x == 'language':
            f['language'], i = w[i + 1].lower(), i + 2
        elif x in ('immutable', 'stable', 'volatile'):
            f['volatility'], i = x, i + 1
        elif x == 'strict':
            f['strict'], i = True, i + 1
        elif x == 'called':            # CALLED ON NULL INPUT
            f['strict'], i = False, i + 4
        elif x == 'external':
            i += 1
        elif x == 'security':
            f['security'], i = w[i + 1], i + 2
        elif x == 'parallel':
            f['parallel'], i = w[i + 1], i + 2
        elif x == 'rows':
            f['rows'], i = w[i + 1], i + 2
        elif x == 'cost':
            i += 2
        elif x == 'leakproof':
            f['leakproof'], i = True, i + 1
        elif x == 'not' and w[i + 1] == 'leakproof':
            f['leakproof'], i = False, i + 2
        elif x == 'set':
            i += 1
            while i < end and w[i] not in ATTR_WORDS:
                i += 1
        elif x == 'as':
            i += 2
            if i < end and w[i] == ',':
                i += 2
        elif x in ('return', 'begin'):
            break
        else:
            raise GenError('cannot parse the declaration of %s at "%s"' % (name, x))
    return f


def load_edition(sql_dir):
    """The statements of managed/sql/*.sql: {file: [(text, function declaration or None,
    declared differences)]}, the omissions {(kind, name): (reason, file)} and the functions not
    there yet {name: (hint, file)}."""
    files, omit, not_yet = {}, {}, {}
    for fname in sorted(os.listdir(sql_dir)):
        if not fname.endswith('.sql'):
            continue
        text = open(os.path.join(sql_dir, fname), encoding='utf-8').read()
        for m in re.finditer(r'^--\s*managed-omit:\s*(function|event trigger|trigger)\s+(\S+?):\s*(.+)$',
                             text, re.M):
            omit[(m.group(1), m.group(2).lower())] = (m.group(3).strip(), fname)
        for m in re.finditer(r'^--\s*managed-not-yet:\s*function\s+(\S+?):\s*(.+)$', text, re.M):
            not_yet[m.group(1).lower()] = (m.group(2).strip(), fname)
        stmts = []
        for stext, code in statements(text):
            if not code:
                continue
            key = statement_key(code)
            f = parse_function(code) if key and key[0] == 'function' else None
            declared = {m.group(1).lower(): m.group(2).strip() for m in
                        re.finditer(r'^\s*--\s*managed-differs:\s*(\w+):\s*(.+)$', stext, re.M)}
            for k in declared:
                if k not in DIFFERABLE:
                    raise GenError('%s: managed-differs: %s cannot differ' % (fname, k))
            stmts.append((stext, f, declared))
        files[fname] = stmts
    return files, omit, not_yet


def refusing_stand_in(stext, name, hint):
    """The C script's CREATE FUNCTION statement stext with its body replaced: LANGUAGE plpgsql
    instead of C, no AS 'MODULE_PATHNAME', 'symbol', and a body that refuses with 0A000."""
    toks = list(tokens(stext))
    edits = []          # (start, end, replacement), applied from the end
    for i, (kind, text, s, e) in enumerate(toks):
        if kind == 'word' and text.lower() == 'as' and toks[i + 1][1] == "'MODULE_PATHNAME'":
            if toks[i + 2][1] != ',' or toks[i + 3][0] != 'string':
                raise GenError('cannot read the AS clause of %s' % name)
            end = toks[i + 3][3]
            edits.append((s, end + len(stext[end:]) - len(stext[end:].lstrip(' \t\n')), ''))
        elif kind == 'word' and text.lower() == 'language':
            edits.append((toks[i + 1][2], toks[i + 1][3], 'plpgsql'))
    semi = [t for t in toks if t[0] == 'punct' and t[1] == ';']
    if len(edits) != 2 or len(semi) != 1:
        raise GenError('cannot make a stand-in of %s from its C declaration' % name)
    body = (" AS $$\nBEGIN\n    RAISE EXCEPTION '%s() is not available in the managed edition yet' "
            "USING ERRCODE = '0A000',\n        HINT = '%s';\nEND $$" % (name, hint.replace("'", "''")))
    edits.append((semi[0][2], semi[0][2], body))
    for s, e, r in sorted(edits, reverse=True):
        stext = stext[:s] + r + stext[e:]
    return stext


def build(version):
    src = os.path.join(ROOT, 'src', 'sql', 'idempo--%s.sql' % version)
    script = open(src, encoding='utf-8').read()
    files, omit, not_yet = load_edition(os.path.join(HERE, 'sql'))
    script_functions = {}
    for _, code in statements(script):
        key = statement_key(code) if code else None
        if key and key[0] == 'function':
            f = parse_function(code)
            script_functions[(f['name'], f['args'])] = f['language']
    # a function of the edition replaces the C function of that signature; one the C script does
    # not have is a helper of the edition; one the C script has in SQL would be a second copy
    repl, helpers_of = {}, {}
    for fname, stmts in files.items():
        for stext, f, declared in stmts:
            sig = (f['name'], f['args']) if f else None
            if sig and script_functions.get(sig) == 'c':
                if sig in repl:
                    raise GenError('%s: %s(%s) is defined twice' % (fname, *sig))
                repl[sig] = (stext, f, declared, fname)
            elif sig and sig[0] in {s[0] for s in script_functions}:
                raise GenError('%s: %s(%s) is not a C function of the C script (or its declaration '
                               'differs from the C one): write it once, in the C script' % (fname, *sig))
            else:
                if declared:
                    raise GenError('%s: managed-differs on a statement that replaces nothing' % fname)
                helpers_of.setdefault(fname, []).append(stext)
    used_repl, used_omit, used_not_yet, helpers_done = set(), set(), set(), set()
    omitted_functions = {name for (kind, name) in omit if kind == 'function'}
    out, notes = [], []
    for stext, code in statements(script):
        if not code:
            out.append(stext)
            continue
        key = statement_key(code)
        if key and key in omit:
            used_omit.add(key)
            out.append('\n-- (managed edition: %s %s left out: %s)\n' % (key[0], key[1], omit[key][0]))
            continue
        gone = [n for n in referenced_functions(code) if n in omitted_functions]
        if gone:
            out.append('\n-- (managed edition: a statement on %s left out with it)\n' % gone[0])
            continue
        w = words(code)
        is_c = key and key[0] == 'function' and 'language' in w and w[w.index('language') + 1] == 'c'
        if not is_c:
            out.append(stext)
            continue
        c = parse_function(code)
        sig = (c['name'], c['args'])
        if c['name'] in not_yet:
            if sig in repl:
                raise GenError('%s: %s has a replacement and is declared not there yet in %s'
                               % (repl[sig][3], c['name'], not_yet[c['name']][1]))
            used_not_yet.add(c['name'])
            hint, fname = not_yet[c['name']]
            leading = re.match(r'\s*((?:--[^\n]*\n\s*)*)', stext).group(1)
            out.append('\n' + leading + '-- managed edition: not yet (managed/sql/%s)\n' % fname
                       + refusing_stand_in(stext[len(re.match(r'\s*(?:--[^\n]*\n\s*)*', stext).group(0)):],
                                           c['name'], hint).strip('\n') + '\n')
            continue
        if sig not in repl:
            raise GenError('the C function %s(%s) has no replacement in managed/sql/ '
                           '(nor a "-- managed-omit: function %s: reason")' % (sig[0], sig[1], sig[0]))
        rtext, r, declared, fname = repl[sig]
        if r['language'] not in ('plpgsql', 'sql'):
            raise GenError('%s: %s is LANGUAGE %s, not plpgsql or sql' % (fname, sig[0], r['language']))
        for k in COMPARED:
            if r[k] != c[k]:
                if k in declared:
                    notes.append('%s(%s): %s %s instead of %s: %s' % (sig[0], sig[1], k, r[k], c[k], declared[k]))
                    continue
                raise GenError('%s: %s(%s) differs from the C declaration in %s: %r, not %r '
                               '(declare it with "-- managed-differs: %s: reason" if intended)'
                               % (fname, sig[0], sig[1], k, r[k], c[k], k))
        for k in declared:
            if r[k] == c[k]:
                raise GenError('%s: %s declares a difference in %s that is not there' % (fname, sig[0], k))
        used_repl.add(sig)
        leading = re.match(r'\s*((?:--[^\n]*\n\s*)*)', stext).group(1)   # the C script's comment stays
        piece = '\n' + leading
        if fname not in helpers_done:
            helpers_done.add(fname)
            piece += ''.join(helpers_of.get(fname, [])).strip('\n') + '\n' if helpers_of.get(fname) else ''
        piece += '-- managed edition (managed/sql/%s):\n' % fname + rtext.strip('\n') + '\n'
        out.append(piece)
    for fname in helpers_of:
        if fname not in helpers_done:
            raise GenError('%s replaces no C function: its statements have no place (put them in '
                           'the file of the replacement that needs them)' % fname)
    for sig in repl:
        if sig not in used_repl:
            raise GenError('%s: %s(%s) replaces no C function of %s' % (repl[sig][3], sig[0], sig[1], src))
    for name in not_yet:
        if name not in used_not_yet:
            raise GenError('%s: managed-not-yet %s matches no C function of %s' % (not_yet[name][1], name, src))
    for key in omit:
        if key not in used_omit:
            raise GenError('%s: managed-omit %s %s matches no statement of %s' % (omit[key][1], *key, src))
    body = ''.join(out)
    for bad in ('$_pgtle_', 'MODULE_PATHNAME', '@extschema@'):
        if bad in body:
            raise GenError('the generated script contains %s' % bad)
    for _, code in statements(body):
        pass   # re-tokenizes the result: unbalanced quotes fail here
    if re.search(r'(?m)^\\', body):
        raise GenError('the generated script contains a psql meta-command')
    return src, body, notes


# The managed edition's first version: update paths start there.
FIRST_MANAGED = '0.3.0'


def version_key(v):
    return tuple(int(x) for x in v.split('.'))


def update_steps(version):
    """-> [(A, B, path)]: the update scripts src/sql/idempo--A--B.sql on the way from
    FIRST_MANAGED to version, in order (each A from FIRST_MANAGED on; one step per A)."""
    steps = {}
    for name in os.listdir(os.path.join(ROOT, 'src', 'sql')):
        m = re.match(r'^idempo--(\d+\.\d+\.\d+)--(\d+\.\d+\.\d+)\.sql$', name)
        if m and version_key(FIRST_MANAGED) <= version_key(m.group(1)) \
                and version_key(m.group(2)) <= version_key(version):
            steps[m.group(1)] = (m.group(1), m.group(2), os.path.join(ROOT, 'src', 'sql', name))
    out, at = [], FIRST_MANAGED
    while at != version:
        if at not in steps:
            raise GenError('no update script from %s on the way to %s in src/sql/' % (at, version))
        out.append(steps[at])
        at = steps[at][1]
    return out


def edition_refresh(install_body):
    """The managed edition's own part of every update: its functions and procedures as this
    version has them (CREATE OR REPLACE: grants kept, a new helper made), the helpers an earlier
    version had and this one lacks dropped (idempo.managed_* not made or replaced by this
    transaction or its subtransactions: a row version of pg_proc older than the transaction), then the function grants of the install script, which a fresh install ends
    with.  test/upgrade/catalog.sql's comparison in managed/run holds the result to a fresh
    install."""
    files, _, _ = load_edition(os.path.join(HERE, 'sql'))
    out = ['\n-- the managed edition\'s functions, as this version has them\n']
    for fname, stmts in files.items():
        for stext, f, _ in stmts:
            if f is not None or re.match(r'(?is)\s*(--[^\n]*\n\s*)*create\s+procedure', stext):
                stext, n = re.subn(r'(?i)\bcreate\s+(function|procedure)\b', r'CREATE OR REPLACE \1', stext, count=1)
                if n != 1:
                    raise GenError('%s: cannot make CREATE OR REPLACE of %s' % (fname, stext.strip()[:60]))
            out.append(stext)
    out.append("""
-- the helpers of an earlier version that this one does not have (not made or replaced above)
DO $idempo_update$
DECLARE
    stale regprocedure;
BEGIN
    FOR stale IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
         WHERE p.pronamespace = 'idempo'::regnamespace AND p.proname LIKE 'managed\\_%'
           -- made or replaced by this transaction or one of its subtransactions (an update run
           -- under a SAVEPOINT): an xid not older than this transaction's, age 0 or less
           AND pg_catalog.age(p.xmin) > 0
    LOOP
        EXECUTE pg_catalog.format('DROP FUNCTION %s', stale);
    END LOOP;
END
$idempo_update$;
""")
    for stext, code in statements(install_body):
        w = words(code) if code else []
        if w[:1] in (['grant'], ['revoke']) and ('function' in w or 'functions' in w or 'procedure' in w):
            out.append(stext)
    return ''.join(out)


def build_update(path):
    """The managed edition's update script from a C update script: only statements that need no
    replacement (no C function, nothing the edition leaves out) pass; anything else stops the
    generator, since the edition's own update of such a statement is not generated yet."""
    files, omit, not_yet = load_edition(os.path.join(HERE, 'sql'))
    omitted = {name for (kind, name) in omit if kind == 'function'}
    out = []
    for stext, code in statements(open(path, encoding='utf-8').read()):
        if not code:
            out.append(stext)
            continue
        w = words(code)
        key = statement_key(code)
        is_c = key and key[0] == 'function' and 'language' in w and w[w.index('language') + 1] == 'c'
        if is_c or (key and key in omit) or any(n in omitted for n in referenced_functions(code)):
            raise GenError('%s: %s needs the managed edition\'s own update, which is not generated '
                           'yet' % (os.path.relpath(path, ROOT), ' '.join(w[:4])))
        out.append(stext)
    body = re.sub(r'(?m)^\\echo[^\n]*\n', '', ''.join(out))
    for bad in ('$_pgtle_', 'MODULE_PATHNAME', '@extschema@'):
        if bad in body:
            raise GenError('the generated update contains %s' % bad)
    if re.search(r'(?m)^\\', body):
        raise GenError('the generated update contains a psql meta-command')
    return body


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    control = open(os.path.join(ROOT, 'idempo.control'), encoding='utf-8').read()
    version = re.search(r"^default_version\s*=\s*'([^']+)'", control, re.M).group(1)
    comment = re.search(r"^comment\s*=\s*'([^']+)'", control, re.M).group(1)
    try:
        src, body, notes = build(version)
        refresh = edition_refresh(body)
        updates = [(a, b, build_update(path) + refresh) for a, b, path in update_steps(version)]
    except GenError as e:
        sys.exit('managed/generate.py: error: %s' % e)
    os.makedirs(outdir, exist_ok=True)
    head = ('-- idempo %s, the managed edition. Copyright (c) 2026, The idempo Authors.\n'
            '-- Released under the PostgreSQL License: see the LICENSE file of the idempo sources.\n'
            % version)
    head += ('-- Generated by managed/generate.py from %s and managed/sql/*.sql: do not edit.\n'
             % os.path.relpath(src, ROOT))
    head += ''.join('-- declared difference: %s\n' % n for n in notes)
    tle = os.path.join(outdir, 'idempo--%s.pgtle.sql' % version)
    with open(tle, 'w', encoding='utf-8') as f:
        f.write(head)
        f.write('-- Run as a role granted pgtle_admin (not a superuser), then: CREATE EXTENSION idempo;\n'
                '-- in a database where pg_tle has an earlier idempo: ALTER EXTENSION idempo UPDATE;\n')
        # One transaction: a failure registers nothing.  pg_tle registers an extension once
        # (install_extension) and each later version with install_extension_version_sql, a
        # version already registered is left as it is (running the installer again is harmless);
        # the script is kept in a temporary table for whichever call is made.
        f.write('BEGIN;\n')
        # set_default_version replaces pg_tle's control function, which only its owner may: stop
        # before registering anything when another role registered idempo in this database
        f.write("DO $idempo_installer$\nDECLARE\n    registrant name;\nBEGIN\n"
                "    SELECT pg_catalog.pg_get_userbyid(p.proowner) INTO registrant\n"
                "      FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace\n"
                "     WHERE n.nspname = 'pgtle' AND p.proname = 'idempo.control';\n"
                "    IF registrant IS NOT NULL AND NOT pg_catalog.pg_has_role(current_user, registrant, 'USAGE') THEN\n"
                "        RAISE EXCEPTION 'idempo was registered with pg_tle in this database by role %', registrant\n"
                "            USING ERRCODE = '42501',\n"
                "                  HINT = 'Run this installer as that role (or a member of it): pg_tle lets only the registering role change the default version.';\n"
                "    END IF;\nEND\n$idempo_installer$;\n")
        f.write('CREATE TEMPORARY TABLE idempo_install_script (version text, script text) ON COMMIT DROP;\n')
        f.write("INSERT INTO pg_temp.idempo_install_script VALUES ('%s', $_pgtle_$\n" % version)
        f.write(body.strip('\n') + '\n')
        f.write('$_pgtle_$);\n')
        f.write("SELECT CASE\n"
                "  WHEN EXISTS (SELECT FROM pgtle.available_extension_versions() v\n"
                "               WHERE v.name = 'idempo' AND v.version = s.version) THEN false\n"
                "  WHEN EXISTS (SELECT FROM pgtle.available_extensions() e WHERE e.name = 'idempo')\n"
                "  THEN pgtle.install_extension_version_sql('idempo', s.version, s.script)\n"
                "  ELSE pgtle.install_extension('idempo', s.version, '%s', s.script, NULL, 'idempo')\n"
                "  END AS installed\n  FROM pg_temp.idempo_install_script s;\n"
                % comment.replace("'", "''"))
        for a, b, ubody in updates:
            f.write("-- the update %s -> %s (src/sql/idempo--%s--%s.sql)\n" % (a, b, a, b))
            f.write("SELECT pgtle.install_update_path('idempo', '%s', '%s', $_pgtle_$\n" % (a, b))
            f.write(ubody.strip('\n') + '\n')
            f.write('$_pgtle_$) AS update_path\n'
                    " WHERE NOT EXISTS (SELECT FROM pgtle.extension_update_paths('idempo')\n"
                    "                    WHERE source = '%s' AND target = '%s' AND path IS NOT NULL);\n" % (a, b))
        f.write("SELECT pgtle.set_default_version('idempo', '%s') AS default_version;\n" % version)
        f.write('COMMIT;\n')
    plain = os.path.join(outdir, 'idempo--%s.plain.sql' % version)
    kept = []
    for stext, code in statements(body):
        w = words(code)
        if w[:4] == ['select', 'pg_catalog', '.', 'pg_extension_config_dump']:
            stext = re.sub(r'(?m)^(?=.)', '-- (not an extension: nothing to mark for pg_dump) ', stext.lstrip('\n')) + '\n'
        kept.append(stext)
    with open(plain, 'w', encoding='utf-8') as f:
        f.write(head)
        f.write('-- For a server without pg_tle: psql -v ON_ERROR_STOP=1 -f THIS_FILE (one transaction).\n'
                '-- The objects are not an extension: no CREATE/DROP/ALTER EXTENSION, pg_dump dumps them\n'
                '-- as ordinary objects.\n')
        f.write('BEGIN;\nCREATE SCHEMA idempo;\n')
        f.write(''.join(kept).strip('\n') + '\n')
        f.write('COMMIT;\n')
    for a, b, ubody in updates:
        # the plain edition's update, for a schema made by the plain script of version a
        with open(os.path.join(outdir, 'idempo--%s--%s.plain.sql' % (a, b)), 'w', encoding='utf-8') as f:
            f.write('-- idempo %s -> %s, the managed edition. Copyright (c) 2026, The idempo Authors.\n'
                    '-- Released under the PostgreSQL License: see the LICENSE file of the idempo sources.\n'
                    '-- Generated by managed/generate.py from src/sql/idempo--%s--%s.sql: do not edit.\n'
                    % (a, b, a, b))
            f.write('-- For a schema installed by idempo--%s.plain.sql: psql -v ON_ERROR_STOP=1 -f THIS_FILE.\n' % a)
            f.write('BEGIN;\n' + ubody.strip('\n') + '\nCOMMIT;\n')
    for n in notes:
        print('declared difference: ' + n)
    print(os.path.abspath(tle))
    print(os.path.abspath(plain))


if __name__ == '__main__':
    main()
