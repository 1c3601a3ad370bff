#!/usr/bin/env python3
"""An independent implementation of idempo's canonical fingerprint encoding (docs/fingerprints.md).

    reference.py generate N SEED   prints N random JSON documents, one per line, tab, their SHA-256
    reference.py vectors           prints the published test vectors

test/run loads the generated documents into the server and checks that idempo.fingerprint()
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


def digest(text):
    return hashlib.sha256(encode(json.loads(text, parse_float=Decimal, parse_int=Decimal))).hexdigest()


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


def main():
    if sys.argv[1] == 'generate':
        r = random.Random(int(sys.argv[3]))
        for _ in range(int(sys.argv[2])):
            doc = rand_json(r)
            print(json.dumps(doc) + '\t' + digest(doc))
    elif sys.argv[1] == 'vectors':
        for doc in ['null', 'true', 'false', '0', '1', '-1.5', '""', '"1"', '[]', '{}', '[1,2]', '[2,1]',
                    '{"a":1,"b":2}',
                    '{"sku":"A-1","qty":2,"price":9.90,"tags":["x","y"],"gift":false,"note":null}',
                    '{"ü":"日本","emoji":"🙂"}']:
            print(doc + '\t' + digest(doc))


if __name__ == '__main__':
    main()
