#!/usr/bin/env python3
"""An independent implementation of idempo's canonical fingerprint encoding (docs/fingerprints.md).

    reference.py generate N SEED         prints N random JSON documents, one per line, tab, their SHA-256
    reference.py vectors                 prints the published test vectors
    reference.py generate-ignore N SEED  prints N random documents, tab, a JSON array of paths to
                                         ignore (fingerprint_ignore), tab, the SHA-256 without them
    reference.py ignore-vectors          prints the published test vectors with ignored paths

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


def digest(text, ignore=()):
    doc = json.loads(text, parse_float=Decimal, parse_int=Decimal)
    return hashlib.sha256(encode(without(doc, list(ignore)))).hexdigest()


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
    elif sys.argv[1] == 'vectors':
        for doc in ['null', 'true', 'false', '0', '1', '-1.5', '""', '"1"', '[]', '{}', '[1,2]', '[2,1]',
                    '{"a":1,"b":2}',
                    '{"sku":"A-1","qty":2,"price":9.90,"tags":["x","y"],"gift":false,"note":null}',
                    '{"ü":"日本","emoji":"🙂"}']:
            print(doc + '\t' + digest(doc))


if __name__ == '__main__':
    main()
