"""The install of docs/python.md, offline: pip builds from the clone with build_backend.py, which
needs nothing from an index."""
import importlib.util
import os
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.dirname(HERE)


def backend():
    spec = importlib.util.spec_from_file_location('idempo_build_backend', os.path.join(PROJECT, 'build_backend.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_editable_install_runs_the_clone(tmp_path):
    # `pip install -e ./clients/python`, to work on the library: pip refused it ("its build
    # backend is missing the 'build_editable' hook ... cannot be installed in editable mode")
    b = backend()
    assert b.get_requires_for_build_editable() == []
    name = b.build_editable(str(tmp_path))
    with zipfile.ZipFile(os.path.join(tmp_path, name)) as whl:
        names = whl.namelist()
        (pth,) = [n for n in names if n.endswith('.pth')]
        assert whl.read(pth).decode().strip() == PROJECT
        assert not [n for n in names if n.startswith('idempo/')]        # the sources stay in the clone
        assert 'RECORD' in ' '.join(names) and 'METADATA' in ' '.join(names)
    venv = os.path.join(tmp_path, 'venv')
    subprocess.run([sys.executable, '-m', 'venv', '--system-site-packages', venv], check=True)
    pip = subprocess.run([os.path.join(venv, 'bin', 'pip'), 'install', '--no-index', '-e', PROJECT],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    found = subprocess.run([os.path.join(venv, 'bin', 'python'), '-c', 'import idempo; print(idempo.__file__)'],
                           capture_output=True, text=True, cwd=tmp_path, check=True).stdout.strip()
    assert found == os.path.join(PROJECT, 'idempo', '__init__.py')
