"""A PEP 517 build backend with no dependencies, for `pip install ./clients/python` offline.

pip builds in an isolated environment with only what [build-system] requires installed; this
backend requires nothing, so no index is asked for setuptools.  It builds a pure-Python wheel of
the idempo package (and an sdist), with the metadata of pyproject.toml's [project] table, whose
few fields are read here without a TOML library (tomllib is in Python 3.11 only); and, for
`pip install -e` (PEP 660), a wheel whose .pth puts this directory on sys.path, so that the
installed idempo is the clone's."""
import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = 'idempo'
TAG = 'py3-none-any'


def _project():
    text = open(os.path.join(HERE, 'pyproject.toml'), encoding='utf-8').read()
    field = lambda name: re.search(rf'^{name}\s*=\s*"([^"]*)"', text, re.M).group(1)
    return {'version': field('version'), 'summary': field('description'),
            'requires_python': field('requires-python')}


def _metadata(p):
    return (f'Metadata-Version: 2.1\nName: {NAME}\nVersion: {p["version"]}\nSummary: {p["summary"]}\n'
            f'Requires-Python: {p["requires_python"]}\nLicense: PostgreSQL\n'
            'Provides-Extra: psycopg\nRequires-Dist: psycopg>=3.1; extra == "psycopg"\n'
            'Provides-Extra: psycopg2\nRequires-Dist: psycopg2>=2.8; extra == "psycopg2"\n'
            'Provides-Extra: console\nRequires-Dist: psycopg>=3.1; extra == "console"\n'
            'Requires-Dist: starlette; extra == "console"\nRequires-Dist: uvicorn; extra == "console"\n'
            'Requires-Dist: jinja2; extra == "console"\n')


def _license():
    """The license text: beside this file in an sdist (or a release's copy), else the repository's."""
    for path in (os.path.join(HERE, 'LICENSE'), os.path.join(HERE, '..', '..', 'LICENSE')):
        if os.path.isfile(path):
            return open(path, 'rb').read()
    raise FileNotFoundError('no LICENSE beside clients/python or at the repository root')


def _sources():
    root = os.path.join(HERE, NAME)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != '__pycache__')
        for f in sorted(filenames):
            if f.endswith('.py') or f == 'py.typed':
                full = os.path.join(dirpath, f)
                yield full, os.path.relpath(full, HERE).replace(os.sep, '/')


def _digest(data):
    return 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    p = _project()
    info = f'{NAME}-{p["version"]}.dist-info'
    os.makedirs(os.path.join(metadata_directory, info), exist_ok=True)
    with open(os.path.join(metadata_directory, info, 'METADATA'), 'w', encoding='utf-8') as f:
        f.write(_metadata(p))
    return info


def _wheel(wheel_directory, files):
    """-> the name of a wheel of files ((arcname, bytes)...) and the dist-info."""
    p = _project()
    info = f'{NAME}-{p["version"]}.dist-info'
    name = f'{NAME}-{p["version"]}-{TAG}.whl'
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), 'w', zipfile.ZIP_DEFLATED) as whl:
        def add(arcname, data):
            whl.writestr(arcname, data)
            record.append(f'{arcname},{_digest(data)},{len(data)}')
        for arcname, data in files:
            add(arcname, data)
        add(f'{info}/METADATA', _metadata(p).encode())
        add(f'{info}/LICENSE', _license())
        add(f'{info}/WHEEL', f'Wheel-Version: 1.0\nGenerator: idempo build_backend\nRoot-Is-Purelib: true\n'
                             f'Tag: {TAG}\n'.encode())
        record.append(f'{info}/RECORD,,')
        whl.writestr(f'{info}/RECORD', '\n'.join(record) + '\n')
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, [(arcname, open(full, 'rb').read()) for full, arcname in _sources()])


# PEP 660: pip install -e.  The .pth puts this directory on sys.path (its other files, bench.py
# and this one, become importable too: the price of needing nothing but the standard library).
get_requires_for_build_editable = get_requires_for_build_wheel
prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, [(f'__editable__.{NAME}.pth', (HERE + '\n').encode())])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    base = f'{NAME}-{p["version"]}'
    name = f'{base}.tar.gz'
    with tarfile.open(os.path.join(sdist_directory, name), 'w:gz') as tar:
        for rel in ('pyproject.toml', 'build_backend.py', 'README.md'):
            if os.path.exists(os.path.join(HERE, rel)):
                tar.add(os.path.join(HERE, rel), f'{base}/{rel}')
        for full, arcname in _sources():
            tar.add(full, f'{base}/{arcname}')
        lic = _license()
        ti = tarfile.TarInfo(f'{base}/LICENSE')
        ti.size, ti.mode = len(lic), 0o644
        tar.addfile(ti, io.BytesIO(lic))
        pkg = _metadata(p).encode()
        ti = tarfile.TarInfo(f'{base}/PKG-INFO')
        ti.size = len(pkg)
        tar.addfile(ti, io.BytesIO(pkg))
    return name
