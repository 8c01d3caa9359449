"""Importing emm imports no framework, finds its library, and the C ABI answers."""

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import HAS_GPU

FRAMEWORKS = ("numba", "cupy", "torch")


def test_importing_emm_imports_no_framework():
    code = ("import sys, emm, emm.cupy, emm.torch, emm._lib, emm.array\n"
            f"bad = [f for f in {FRAMEWORKS!r} if f in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_numba_plugin_needs_numba_and_says_so():
    # In a child where Numba cannot be imported (None in sys.modules: its import
    # fails as if it were not installed), whether or not it is here.
    code = ("import sys\n"
            "sys.modules['numba'] = None\n"
            "try:\n"
            "    import emm.numba_plugin\n"
            "except ImportError as e:\n"
            "    assert 'numba' in str(e), e\n"
            "    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_abi_version(lib):
    import emm._lib

    assert lib.emm_abi_version() == 314 == emm._lib.ABI_NEEDED


def test_the_library_ships_inside_the_package_and_needs_no_variable():
    import emm

    path = emm.library_path()
    if os.environ.get("EMM_TEST_INSTALLED") == "1":
        # CI: the wheel is installed in a fresh venv; nothing points at the build.
        assert "EMM_LIBRARY" not in os.environ
        pkg = pathlib.Path(emm.__file__).resolve().parent
        assert path == pkg / "_native" / "libemm_capi.so", (path, pkg)
        assert "site-packages" in str(pkg)
        assert (pkg / "py.typed").is_file()
    assert path.name.startswith("libemm_capi")


def test_emm_library_overrides_the_search(tmp_path):
    import emm

    fake = tmp_path / "libemm_capi.so"
    code = "import emm; print(emm.library_path())"
    env = dict(os.environ, EMM_LIBRARY=str(fake))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and str(fake) in out.stderr  # named, and not found
    fake.write_bytes(b"")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(fake)
    assert emm.library_path() != fake


def test_a_file_that_is_not_emms_library_is_a_typed_error(tmp_path):
    """``EMM_LIBRARY`` naming a file that is no shared library (or not emm's)
    raises EmmError naming the path and the variable, not the loader's raw
    OSError or AttributeError."""
    fake = tmp_path / "libemm_capi.so"
    fake.write_bytes(b"not a library")
    code = ("import emm\n"
            "try:\n    emm.load()\n"
            "except emm.EmmError as e:\n    print('EmmError', e.code, e)\n")
    env = dict(os.environ, EMM_LIBRARY=str(fake))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("EmmError 3 "), out.stdout
    assert str(fake) in out.stdout and "EMM_LIBRARY" in out.stdout, out.stdout


def test_messages_queued_by_paths_without_python_reach_stderr_at_exit():
    """The bindings queue the library's messages (``emm_capture_warnings``);
    those that paths running no Python queue (CuPy's C allocator, the native
    PyTorch allocator), where no later call of the bindings takes them, go to
    stderr at exit instead of being lost with the queue."""
    code = ("import ctypes, emm\n"
            "lib = emm.load()\n"
            "lib.emm_cupy_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]\n"
            "lib.emm_cupy_free(None, 0x1234, 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if "CuPy freed memory emm could not free" in ln]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("emm: ERROR (queued, not taken before exit)"), lines[0]


def test_a_manager_without_a_driver_is_a_typed_error():
    import emm

    if HAS_GPU:
        m = emm.Manager(None, 0)
        assert m.name in ("default", "pool", "hostonly")
        return
    with pytest.raises(emm.EmmError) as e:
        emm.Manager("pool", 0)
    assert e.value.code == 3
    assert "CUDA driver" in str(e.value)


def test_unknown_manager_names_the_known_ones():
    import emm

    with pytest.raises(ValueError, match="NUL"):
        emm.Manager("pool\0x", 0)  # C would read "pool"

    with pytest.raises(emm.EmmError) as e:
        emm.Manager("poool", 0)
    assert e.value.code == 5
    assert "default, hostonly, pool" in str(e.value)
