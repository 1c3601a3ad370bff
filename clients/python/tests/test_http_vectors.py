"""clients/http-vectors.json, the HTTP contract (docs/http-contract.md) as request sequences, on
every framework over real HTTP: Starlette (idempo.asgi), Flask and Django.  The Node suite plays
the same file on Express and Fastify (clients/node/test/vectors.test.js): any answer that differs
from the file's fails, so the two languages answer alike."""
import http.client
import json
import os
import re
import subprocess
import sys

import pytest

import idempo

psycopg = pytest.importorskip('psycopg')

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.environ.get('IDEMPO_HTTP_VECTORS') or os.path.join(HERE, '..', '..', 'http-vectors.json')
with open(VECTORS) as f:
    SPEC = json.load(f)
NEEDS = {'asgi': ('starlette', 'uvicorn'), 'flask': ('flask', 'werkzeug'), 'django': ('django', 'psycopg2', 'werkzeug')}


@pytest.fixture(scope='module', params=list(NEEDS))
def app(request, dbname):
    for module in NEEDS[request.param]:
        pytest.importorskip(module)
    name = f'{dbname}_vec_{request.param}'
    with psycopg.connect(dbname='postgres', autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS {name}')
        admin.execute(f'CREATE DATABASE {name}')
    with psycopg.connect(dbname=name, autocommit=True) as db:
        db.execute('CREATE EXTENSION IF NOT EXISTS idempo')
        for sql in SPEC['setup']:
            db.execute(sql)
    env = {**os.environ, 'PGDATABASE': name,
           'PYTHONPATH': os.pathsep.join([os.path.dirname(os.path.dirname(idempo.__file__)), os.environ.get('PYTHONPATH', '')])}
    process = subprocess.Popen([sys.executable, '-u', os.path.join(HERE, 'vectors_app.py'), request.param],
                               stdout=subprocess.PIPE, env=env, text=True)
    line = process.stdout.readline()
    assert line.startswith('listening on http://127.0.0.1:'), f'the {request.param} app did not start: {line!r}'
    try:
        yield name, int(line.rsplit(':', 1)[1])
    finally:
        process.kill()
        process.wait(10)
        with psycopg.connect(dbname='postgres', autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS {name} WITH (FORCE)')


def send(port, request):
    conn = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
    try:
        body = request.get('body', '').encode()
        conn.putrequest(request['method'], request['path'])
        if 'content_type' in request:
            conn.putheader('Content-Type', request['content_type'])
        conn.putheader('Content-Length', str(len(body)))
        for key in request['keys']:
            conn.putheader('Idempotency-Key', key)
        conn.endheaders(body)
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read().decode()
    finally:
        conn.close()


def check(expect, status, headers, body, replies, where):
    """-> the differences from expect (empty: as the contract says)."""
    diff = []
    if status != expect['status']:
        diff.append(f'status {status}, expected {expect["status"]}')
    for name, want in expect.get('headers', {}).items():
        got = headers.get(name)
        if isinstance(want, dict):
            ok = got is not None and got.isdigit() and want['min'] <= int(got) <= want['max']
        else:
            ok = got == want
        if not ok:
            diff.append(f'{name}: {got!r}, expected {want!r}')
    if 'problem' in expect:
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {}
        code = expect['problem']
        want = {'type': f'{SPEC["problem_type_base"]}#{code}', 'code': code, 'status': expect['status'],
                'title': SPEC['problem_titles'][code], **expect.get('members', {})}
        if headers.get('content-type') != 'application/problem+json':
            diff.append(f'content-type {headers.get("content-type")!r}, expected application/problem+json')
        diff += [f'problem {k}: {doc.get(k)!r}, expected {v!r}' for k, v in want.items() if doc.get(k) != v]
    if 'body' in expect and body != expect['body']:
        diff.append(f'body {body!r}, expected {expect["body"]!r}')
    if 'same_body_as' in expect and body != replies[expect['same_body_as']]:
        diff.append(f'body {body!r}, expected the body of request {expect["same_body_as"]}: {replies[expect["same_body_as"]]!r}')
    return [f'{where}: {d}' for d in diff]


@pytest.mark.parametrize('sequence', SPEC['sequences'], ids=[re.sub(r'\W+', '_', s['name']) for s in SPEC['sequences']])
def test_vector(app, sequence):
    dbname, port = app
    replies, diffs = [], []
    with psycopg.connect(dbname=dbname, autocommit=True) as db, psycopg.connect(dbname=dbname, autocommit=True) as held:
        for i, step in enumerate(sequence['steps']):
            where = f'step {i}'
            if 'sql' in step:
                rows = (held if step.get('session') == 'held' else db).execute(step['sql'])
                got = [list(r) for r in rows.fetchall()] if rows.description else None
                if 'rows' in step and got != step['rows']:
                    diffs.append(f'{where}: {step["sql"]} gave {got!r}, expected {step["rows"]!r}')
                continue
            status, headers, body = send(port, step['request'])
            replies.append(body)
            diffs += check(step['expect'], status, headers, body, replies, f'{where} ({status} {body[:200]})')
    assert not diffs, '\n'.join(diffs)
