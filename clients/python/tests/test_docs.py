"""The snippets of docs/python.md, in order, as a reader would type them: ```sql blocks in psql's
place (psycopg, autocommit), ```python blocks in one shared namespace, on a new database; a
block after an "<!-- not run: why -->" line is left out.  One test per block."""
import os
import re
import uuid

import pytest

psycopg = pytest.importorskip('psycopg')

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.environ.get('IDEMPO_TEST_DOCS') or os.path.join(HERE, '..', '..', '..', 'docs', 'python.md')
FENCE = re.compile(r'^```(\w*)\s*$')


def blocks():
    lines = open(DOCS, encoding='utf-8').read().split('\n')
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        i += 1
        body = []
        while not lines[i].startswith('```'):
            body.append(lines[i])
            i += 1
        i += 1
        skipped = start > 0 and lines[start - 1].startswith('<!-- not run')
        if lang in ('sql', 'python') and not skipped:
            out.append((f'{lang}@{start + 1}', lang, '\n'.join(body)))
    return out


BLOCKS = blocks()


@pytest.fixture(scope='module')
def reader(dbname):
    name = f'{dbname}_docs'
    with psycopg.connect(dbname='postgres', autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE {name}')
    before = os.environ['PGDATABASE']
    os.environ['PGDATABASE'] = name
    with psycopg.connect(autocommit=True) as c:
        c.execute('CREATE EXTENSION idempo')
        if os.environ.get('IDEMPO_TEST_SHIM') == '1':
            c.execute(open(os.path.join(HERE, 'shim.sql')).read())
    namespace = {'__name__': f'docs_python_{uuid.uuid4().hex[:6]}'}
    yield namespace
    conn = namespace.get('conn')
    if conn is not None:
        conn.close()
    os.environ['PGDATABASE'] = before
    with psycopg.connect(dbname='postgres', autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS {name} WITH (FORCE)')


def test_the_page_has_snippets():
    assert len([b for b in BLOCKS if b[1] == 'python']) >= 6


@pytest.mark.parametrize('where,lang,text', BLOCKS, ids=[b[0] for b in BLOCKS])
def test_snippet(reader, where, lang, text):
    if lang == 'sql':
        with psycopg.connect(autocommit=True) as c:
            c.execute(text)
    else:
        exec(compile(text, f'docs/python.md:{where}', 'exec'), reader)
