"""What an installation of emm-cuda gives a user: one version everywhere, the `emm`
program and `python -m emm`, a package whose private library pydoc does not list,
extras for every integration, and integrations that name what to install."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import emm
from emm import _install, _require

ROOT = pathlib.Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("EMM_TEST_INSTALLED") == "1"


def _toml_version(path: pathlib.Path, table: str) -> str:
    text = path.read_text()
    body = text[text.index(f"[{table}]"):]
    return re.search(r'^version\s*=\s*"([^"]+)"', body, re.M).group(1)


def test_one_version_in_python_cargo_and_the_distribution():
    assert emm.__version__ == _toml_version(ROOT / "pyproject.toml", "project")
    assert emm.__version__ == _toml_version(ROOT / "Cargo.toml", "workspace.package")
    if INSTALLED:
        from importlib import metadata

        assert metadata.version("emm-cuda") == emm.__version__


def test_every_integration_has_an_extra_that_names_its_framework():
    text = (ROOT / "pyproject.toml").read_text()
    extras = text[text.index("[project.optional-dependencies]"):]
    for top, (extra, by_hand) in _require.EXTRAS.items():
        m = re.search(rf'^{extra}\s*=\s*\[(.*)\]', extras, re.M)
        assert m, f"no extra [{extra}] in pyproject.toml for {top}"
        first = by_hand.split()[0]
        assert first in m.group(1), (extra, m.group(1), by_hand)


@pytest.mark.parametrize("code, framework, extra", [
    ("import emm.torch as t; t.install()", "torch", "torch"),
    ("import emm.cupy as c; c.install()", "cupy", "cupy"),
    ("import emm.numba_plugin", "numba", "numba"),
    ("import emm.rmm as r; r.install(device=0)", "rmm", "rmm"),
])
def test_an_integration_without_its_framework_names_what_to_install(code, framework, extra):
    # In a child where the framework cannot be imported (None in sys.modules), so the
    # test means the same whether or not the framework is installed here.
    child = (f"import sys; sys.modules[{framework!r}] = None\n"
             "try:\n"
             f"    {code}\n"
             "except ModuleNotFoundError as e:\n"
             "    print(e.name); print(e)\n")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    name, message = out.stdout.split("\n", 1)
    assert name == framework, out.stdout + out.stderr
    assert f"emm-cuda[{extra}]" in message and "pip install" in message, message


def test_pydoc_does_not_list_the_private_library():
    import pkgutil

    names = {m.name for m in pkgutil.iter_modules(emm.__path__)}
    assert not any(n.startswith("lib") for n in names), names
    assert {"torch", "cupy", "numba_plugin", "rmm", "dask", "array"} <= names


def test_the_import_is_emm_cudas():
    assert _install.problem() is None


def test_python_m_emm_runs_the_emm_program():
    if _install.binary() is None:
        # An installed wheel must carry its program; a checkout may not have built it.
        assert not INSTALLED, "the installed emm-cuda has no `emm` program"
        pytest.skip("no emm program: not built in this checkout (cargo build -p emm-cli)")
    out = subprocess.run([sys.executable, "-m", "emm", "--version"], capture_output=True,
                         text=True, check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
                         if INSTALLED else None)
    assert out.stdout.strip() == f"emm {emm.__version__}"
    if INSTALLED:
        # pip puts a wheel's scripts in the environment's bin folder.
        exe = _install.binary().resolve()
        assert exe.parent == (pathlib.Path(sys.prefix) / "bin").resolve(), (exe, sys.prefix)


def test_python_m_emm_refuses_another_distributions_emm(tmp_path):
    # A fake installed distribution called `emm` (the unrelated project on the index).
    info = tmp_path / "emm-2.1.11.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: emm\nVersion: 2.1.11\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = subprocess.run([sys.executable, "-m", "emm", "--version"], capture_output=True, text=True, env=env)
    assert out.returncode == 2, out
    assert "pip uninstall emm" in out.stderr and "another project" in out.stderr, out.stderr
