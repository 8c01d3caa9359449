"""Shared fixtures of the Python tests (run by `cargo xtask ci` in a fresh venv with
the wheel installed; locally: `PYTHONPATH=python python -m pytest python/tests`)."""

import pathlib

import pytest

HAS_GPU = pathlib.Path("/dev/nvidia0").exists()


def load_gpu_script(name: str):
    """The module of ``python/gpu/<folder>/<name>.py`` (a GPU-machine script whose
    pure functions the host tests check), loaded by path: ``python/gpu`` is no
    package."""
    import importlib.util

    gpu = pathlib.Path(__file__).resolve().parent.parent / "gpu"
    (path,) = gpu.glob(f"*/{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def lib():
    """The loaded libemm_capi (fails the test when it does not load)."""
    import emm

    try:
        return emm.load()
    except emm.EmmError as e:  # pragma: no cover - a broken install
        pytest.fail(f"libemm_capi did not load: {e}")


@pytest.fixture(autouse=True)
def _no_leftover_warnings(lib):
    """Each test starts and ends with an empty warning queue."""
    import emm

    emm.take_warnings()
    yield
    emm.take_warnings()


def _driver_is_standin() -> bool:
    import os

    return "emm_standin" in os.path.basename(os.environ.get("EMM_CUDA_DRIVER", ""))


# `EMM_CUDA_DRIVER` names emm-standin (a stand-in driver over host memory, no GPU):
# `cargo xtask ci` runs the `standin` tests that way; its device addresses are host
# addresses, which the tests read and write directly.
ON_STANDIN = _driver_is_standin()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "standin: needs a driver (a GPU, or emm-standin through EMM_CUDA_DRIVER); "
        "`cargo xtask ci` runs these on the stand-in",
    )
    config.addinivalue_line(
        "markers",
        "numba_driver: numba-cuda's own driver layer on a driver (a GPU, or emm-standin "
        "found as libcuda.so.1); `cargo xtask ci` runs these apart (xtask/src/numba.rs)",
    )
