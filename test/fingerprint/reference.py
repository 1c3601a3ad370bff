#!/usr/bin/env python3
"""An independent implementation of idempo's canonical fingerprint encoding (docs/fingerprints.md).

    reference.py generate N SEED         prints N random JSON documents, one per line, tab, their SHA-256
    reference.py vectors                 prints the published test vectors
    reference.py generate-ignore N SEED  prints N random documents, tab, a JSON array of paths to
                                         ignore (fingerprint_ignore), tab, the SHA-256 without them
    reference.py ignore-vectors          prints the published test vectors with ignored paths
    reference.py generate-include N SEED prints N random documents, tab, {"include": [...], "ignore":
                                         [...]} (fingerprint_include, fingerprint_ignore), tab, the
                                         SHA-256 of what they leave
    reference.py include-vectors         prints the published test vectors with included paths

check.py loads the generated documents into the server and checks that idempo.fingerprint()
agrees with this implementation on every one.
"""
import hashlib
import json
import random
import struct
import sys
from decimal import Decimal


def number(d):
    text = format(Decimal(d), 'f')
    negative = text.startswith('-')
    text = text.lstrip('-')
    whole, _, frac = text.partition('.')
    whole = whole.lstrip('0') or '0'
    frac = frac.rstrip('0')
    if whole == '0' and not frac:
        negative = False
    return ('-' if negative else '') + whole + ('.' + frac if frac else '')


def encode(v):
    if v is None:
        return b'n'
    if v is True:
        return b't'
    if v is False:
        return b'f'
    if isinstance(v, (int, Decimal)):
        s = number(v).encode()
        return b'N' + struct.pack('>I', len(s)) + s
    if isinstance(v, str):
        b = v.encode()
        return b'S' + struct.pack('>I', len(b)) + b
    if isinstance(v, list):
        return b'A' + struct.pack('>I', len(v)) + b''.join(encode(x) for x in v)
    keys = sorted(v, key=lambda k: (len(k.encode()), k.encode()))
    return b'O' + struct.pack('>I', len(keys)) + b''.join(encode(k) + encode(v[k]) for k in keys)


def without(v, paths):
    """The document without the fields named by paths (README, "Fingerprint rules"): each path is
    a dot-separated list of object keys from the top; arrays are not entered; absent paths and
    paths that run into a scalar or an array remove nothing."""
    if not isinstance(v, dict):
        return v
    out = dict(v)
    heads = {}
    for p in paths:
        head, _, rest = p.partition('.')
        heads.setdefault(head, []).append(rest if _ else None)
    for head, rests in heads.items():
        if head not in out:
            continue
        if None in rests:
            del out[head]
        else:
            out[head] = without(out[head], rests)
    return out


NOTHING = object()   # a projection that found nothing


def parse_include(path):
    """One fingerprint_include path as steps: ('key', k) or ('each',) for [*].  Keys are
    separated by dots; [*] may follow a key any number of times; a backslash takes the next
    character literally.  A path that breaks the grammar raises ValueError."""
    steps, i, n = [], 0, len(path)
    while True:
        key = ''
        while i < n and path[i] not in '.[':
            if path[i] == '\\':
                i += 1
                if i == n:
                    raise ValueError('lone backslash')
            key += path[i]
            i += 1
        if not key:
            raise ValueError('empty key')
        steps.append(('key', key))
        while i < n and path[i] == '[':
            if path[i:i + 3] != '[*]':
                raise ValueError('[ without *]')
            steps.append(('each',))
            i += 3
        if i == n:
            return steps
        if path[i] != '.' or i + 1 == n:
            raise ValueError('bad separator')
        i += 1


def include_tree(paths):
    """The paths as a tree: {'end': bool, 'keys': {key: tree}, 'each': tree or None}."""
    root = {'end': False, 'keys': {}, 'each': None}
    for p in paths:
        node = root
        for step in parse_include(p):
            if step[0] == 'key':
                node = node['keys'].setdefault(step[1], {'end': False, 'keys': {}, 'each': None})
            else:
                if node['each'] is None:
                    node['each'] = {'end': False, 'keys': {}, 'each': None}
                node = node['each']
        node['end'] = True
    return root


def project(v, node):
    """docs/fingerprint-rules.md: a field a path ends on counts whole; an object keeps the
    members where something is found (none: NOTHING); an array under [*] keeps every element,
    projected, {} where nothing is found; anything else finds NOTHING."""
    if node['end']:
        return v
    if isinstance(v, dict) and node['keys']:
        out = {}
        for k, sub in node['keys'].items():
            if k in v:
                p = project(v[k], sub)
                if p is not NOTHING:
                    out[k] = p
        return out if out else NOTHING
    if isinstance(v, list) and node['each'] is not None:
        out = []
        for e in v:
            p = project(e, node['each'])
            out.append({} if p is NOTHING else p)
        return out
    return NOTHING


def only(v, paths):
    """The document as fingerprint_include leaves it: itself without paths or if its top is not
    an object, {} where nothing is found."""
    if not paths or not isinstance(v, dict):
        return v
    p = project(v, include_tree(paths))
    return {} if p is NOTHING else p


def digest(text, ignore=(), include=()):
    doc = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    return hashlib.sha256(encode(without(only(doc, list(include)), list(ignore)))).hexdigest()


IGNORE_VECTORS = [
    ('{"order":"A-1","delivered_at":"2026-11-30T10:00:00Z"}', ['delivered_at']),
    ('{"order":"A-1"}', ['delivered_at']),
    ('{"order":"A-1","meta":{"trace_id":"t-1","source":"shop"}}', ['meta.trace_id']),
    ('{"order":"A-1","meta":{"source":"shop"}}', ['meta.trace_id']),
    ('{"order":"A-1","items":[{"trace_id":"t-1"}]}', ['items.trace_id']),
    ('{"order":"A-1","meta":"plain"}', ['meta.trace_id']),
    ('{"order":"A-1","meta":{"trace_id":"t-1"}}', ['meta', 'meta.trace_id']),
    ('[{"delivered_at":1}]', ['delivered_at']),
]


# (document, include, ignore)
INCLUDE_VECTORS = [
    ('{"order":"A-1","amount":500,"delivered_at":"10:00"}', ['order', 'amount'], []),
    ('{"order":"A-1","amount":500}', ['order', 'amount'], []),
    ('{"order":"A-1","items":[{"sku":"X","qty":1,"note":"gift"},{"sku":"Y","qty":2}]}', ['order', 'items[*].sku'], []),
    ('{"order":"A-1","items":[{"sku":"X"},{"sku":"Y"}]}', ['order', 'items[*].sku'], []),
    ('{"order":"A-1","items":[{"qty":1},{"sku":"Y"}]}', ['order', 'items[*].sku'], []),
    ('{"order":"A-1","items":[]}', ['order', 'items[*].sku'], []),
    ('{"order":"A-1"}', ['order', 'items[*].sku'], []),
    ('{"order":"A-1","items":"none"}', ['order', 'items[*].sku'], []),
    ('{"customer":{"id":7,"name":"Ann"},"meta":{}}', ['customer.id', 'meta.trace_id'], []),
    ('{"customer":{"id":7}}', ['customer.id', 'meta.trace_id'], []),
    ('{"order":"A-1","meta":{"trace":{"span":1}}}', ['order', 'meta.trace.id'], []),
    ('{"grid":[[{"v":1,"w":2}],[]]}', ['grid[*][*].v'], []),
    ('{"a.b":1,"a":{"b":2},"c[0]":3}', ['a\\.b', 'c\\[0]'], []),
    ('{"meta":{"source":"shop","trace_id":"t-1"},"order":"A-1"}', ['meta', 'order'], ['meta.trace_id']),
    ('{"unrelated":true}', ['order'], []),
    ('[{"order":"A-1"}]', ['order'], []),
]


ALPHABET = ['a', 'b', 'Z', '0', ' ', 'é', '日', '🙂', '"', '\\', '\n', '\t', 'ü']


def rand_string(r):
    return ''.join(r.choice(ALPHABET) for _ in range(r.randint(0, 6)))


def rand_number(r):
    kind = r.randint(0, 5)
    if kind == 0:
        return str(r.randint(-10**6, 10**6))
    if kind == 1:
        return '%d.%s' % (r.randint(-999, 999), '0' * r.randint(1, 4))
    if kind == 2:
        return '%s%d.%d%s' % (r.choice(['', '-']), r.randint(0, 99), r.randint(0, 999), '0' * r.randint(0, 3))
    if kind == 3:
        return '%de%d' % (r.randint(-99, 99), r.randint(-8, 8))
    if kind == 4:
        return '-0.0' if r.random() < 0.5 else '0.000'
    return str(r.randint(10**20, 10**30)) + '.5'


def rand_json(r, depth=0):
    kind = r.randint(0, 6 if depth < 4 else 3)
    if kind == 0:
        return r.choice(['null', 'true', 'false'])
    if kind in (1, 2):
        return rand_number(r)
    if kind == 3:
        return json.dumps(rand_string(r), ensure_ascii=r.random() < 0.5)
    if kind in (4, 5):
        return '[' + ','.join(rand_json(r, depth + 1) for _ in range(r.randint(0, 4))) + ']'
    pairs = [json.dumps(rand_string(r)) + ':' + rand_json(r, depth + 1) for _ in range(r.randint(0, 4))]
    return '{' + ','.join(pairs) + '}'


def rand_paths(r, doc):
    """Paths to ignore: some that exist in doc (objects entered from the top), some that do not."""
    paths = []
    for _ in range(r.randint(0, 3)):
        v, parts = doc, []
        while isinstance(v, dict) and v and r.random() < 0.8:
            k = r.choice(sorted(v))
            if k == '' or '.' in k:
                break
            parts.append(k)
            v = v[k]
        if parts:
            paths.append('.'.join(parts))
    if r.random() < 0.3:
        paths.append(r.choice(['a', 'b.a', 'Z.Z.Z', 'missing']))
    return paths


def escape_key(k):
    return k.replace('\\', '\\\\').replace('.', '\\.').replace('[', '\\[')


def rand_include(r, doc):
    """Paths to include: some that exist in doc (entering objects and, with [*], arrays from the
    top), some that do not, some that run into values of another kind."""
    paths = []
    for _ in range(r.randint(0, 4)):
        v, text = doc, ''
        while True:
            if isinstance(v, dict) and v and r.random() < 0.8:
                k = r.choice(sorted(v))
                if k == '':
                    break   # an empty key cannot be named
                text += ('.' if text else '') + escape_key(k)
                v = v[k]
            elif isinstance(v, list) and text and r.random() < 0.8:
                text += '[*]'
                v = r.choice(v) if v else None
            else:
                break
        if text:
            paths.append(text)
    if r.random() < 0.3:
        paths.append(r.choice(['a', 'b.a', 'Z[*].Z', 'missing', 'a[*]', 'a[*][*].b', '\\.']))
    return paths


def main():
    if sys.argv[1] == 'generate':
        r = random.Random(int(sys.argv[3]))
        for _ in range(int(sys.argv[2])):
            doc = rand_json(r)
            print(json.dumps(doc) + '\t' + digest(doc))
    elif sys.argv[1] == 'generate-ignore':
        r = random.Random(int(sys.argv[3]))
        for _ in range(int(sys.argv[2])):
            doc = '{' + ','.join(json.dumps(rand_string(r)) + ':' + rand_json(r, 1)
                                 for _ in range(r.randint(0, 5))) + '}'
            paths = rand_paths(r, json.loads(doc, parse_float=Decimal, parse_int=Decimal))
            print(json.dumps(doc) + '\t' + json.dumps(paths) + '\t' + digest(doc, paths))
    elif sys.argv[1] == 'ignore-vectors':
        for doc, paths in IGNORE_VECTORS:
            print(doc + '\t' + json.dumps(paths) + '\t' + digest(doc, paths))
    elif sys.argv[1] == 'generate-include':
        r = random.Random(int(sys.argv[3]))
        for _ in range(int(sys.argv[2])):
            doc = '{' + ','.join(json.dumps(rand_string(r) if r.random() < 0.5 else r.choice(['a', 'b', 'a.b', 'Z']))
                                 + ':' + rand_json(r, 1) for _ in range(r.randint(0, 5))) + '}'
            parsed = json.loads(doc, parse_float=Decimal, parse_int=Decimal)
            include = rand_include(r, parsed)
            ignore = rand_paths(r, parsed) if r.random() < 0.3 else []
            rules = json.dumps({'include': include, 'ignore': ignore})
            print(json.dumps(doc) + '\t' + rules + '\t' + digest(doc, ignore, include))
    elif sys.argv[1] == 'include-vectors':
        for doc, include, ignore in INCLUDE_VECTORS:
            print(doc + '\t' + json.dumps({'include': include, 'ignore': ignore}) + '\t' + digest(doc, ignore, include))
    elif sys.argv[1] == 'vectors':
        for doc in ['null', 'true', 'false', '0', '1', '-1.5', '""', '"1"', '[]', '{}', '[1,2]', '[2,1]',
                    '{"a":1,"b":2}',
                    '{"sku":"A-1","qty":2,"price":9.90,"tags":["x","y"],"gift":false,"note":null}',
                    '{"ü":"日本","emoji":"🙂"}']:
            print(doc + '\t' + digest(doc))


if __name__ == '__main__':
    main()
