"""The Numba plugin's managed memory (``memallocmanaged``) where Numba is installed,
without a GPU: the plugin runs over emm's library on the stand-in driver (whose
device memory is host memory), and Numba's own ``ManagedMemory`` objects are built
around emm's addresses without Numba's driver being initialised. What Numba does
on a GPU with them (``cuda.managed_array``, kernels, its own tests) is
``python/gpu/checks/managed_check.py``'s part (run by ``python/gpu/checks/managed_suite.sh``).
"""

import ctypes
import gc
import importlib.util
import logging
import pathlib

import pytest

from conftest import HAS_GPU, ON_STANDIN

pytestmark = [
    pytest.mark.standin,
    pytest.mark.skipif(not ON_STANDIN or HAS_GPU,
                       reason="builds Numba's pointer objects around stand-in memory without Numba's driver"),
]

np = pytest.importorskip("numpy")
pytest.importorskip("numba.cuda")

import emm  # noqa: E402
import emm.numba_plugin as plugin  # noqa: E402
from numba.cuda.cudadrv import driver as numba_driver  # noqa: E402
from numba.cuda.cudadrv.driver import ManagedMemory, ManagedOwnedPointer  # noqa: E402


class _Device:
    id = 0


class _Context:
    """What the plugin reads of Numba's context: the device (and a weak reference)."""

    device = _Device()


@pytest.fixture
def mm(monkeypatch):
    # Numba's driver sets its module logger when it initialises (before any
    # memory manager exists); its pending-deallocation queue logs through it.
    monkeypatch.setattr(numba_driver, "_logger", logging.getLogger("numba.cuda.cudadrv.driver"),
                        raising=False)
    ctx = _Context()
    m = plugin.EmmNumbaManager(context=ctx)
    m.initialize()
    yield m
    m.reset()


def _managed_bytes():
    with emm.Manager(None, 0) as m:
        return m.memory_stats()["emm.managed_bytes.current"]


def test_memallocmanaged_gives_numbas_managed_memory_over_emm(mm):
    base = _managed_bytes()
    n = 1000
    buf = mm.memallocmanaged(n * 8, True)
    assert isinstance(buf, ManagedOwnedPointer)
    assert isinstance(buf._mem, ManagedMemory)
    ptr = int(buf.device_ctypes_pointer.value)
    assert ptr and ptr % 256 == 0
    assert ptr in mm.allocations
    assert _managed_bytes() == base + n * 8
    # cuda.managed_array's way: an ndarray over the buffer. The host writes through
    # it and the bytes are at emm's address (the stand-in's memory is the host's).
    ary = np.ndarray(shape=n, dtype=np.float64, buffer=buf)
    ary[:] = np.arange(n) * 0.5
    assert (ctypes.c_double * n).from_address(ptr)[999] == 499.5
    del ary, buf
    gc.collect()
    assert ptr not in mm.allocations
    assert _managed_bytes() == base


def test_host_attached_memory_and_many_allocations(mm):
    base = _managed_bytes()
    bufs = [mm.memallocmanaged(4096 + i, bool(i % 2)) for i in range(20)]
    ptrs = {int(b.device_ctypes_pointer.value) for b in bufs}
    assert len(ptrs) == 20
    assert _managed_bytes() == base + sum(4096 + i for i in range(20))
    del bufs
    gc.collect()
    assert _managed_bytes() == base


def test_defer_cleanup_holds_managed_frees_back(mm):
    base = _managed_bytes()
    with mm.defer_cleanup():
        buf = mm.memallocmanaged(1 << 16, True)
        del buf
        gc.collect()
        assert _managed_bytes() == base + (1 << 16), "freed inside defer_cleanup"
    # Numba's queue frees on its next flush, as for its own memory.
    mm.deallocations.clear()
    assert _managed_bytes() == base


class _NumbaContext(_Context):
    """Numba's ``Context`` as far as ``defer_cleanup`` goes: its own queue
    (``deallocations``, for streams, events and modules), the memory manager's
    ``defer_cleanup`` entered around it, and ``memallocmanaged``, all Numba's code."""

    defer_cleanup = numba_driver.Context.defer_cleanup
    memallocmanaged = numba_driver.Context.memallocmanaged

    def __init__(self):
        self.deallocations = numba_driver._PendingDeallocs()
        self.memory_manager = plugin.EmmNumbaManager(context=self)
        self.memory_manager.initialize()


def test_gpu_checks_defer_cleanup_flushes_the_queue_that_holds_the_free(mm):
    # python/gpu/checks/managed_check.py's defer_cleanup check, run here: it once flushed
    # the context's queue (ctx.deallocations), which holds no memory frees (nor
    # with Numba's own manager), and failed on an H200 for every emm manager.
    path = pathlib.Path(__file__).resolve().parent.parent / "gpu" / "checks" / "managed_check.py"
    spec = importlib.util.spec_from_file_location("managed_check", path)
    managed_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(managed_check)
    ctx = _NumbaContext()
    try:
        with emm.Manager(None, 0) as m:
            base = m.memory_stats()["emm.managed_bytes.current"]
            managed_check.check_defer_cleanup(ctx, m, base, ctx.memallocmanaged)
        assert len(ctx.memory_manager.deallocations) == 0
    finally:
        ctx.memory_manager.reset()  # what a failure leaves queued, for the next tests


def test_reset_frees_what_callers_still_hold(mm):
    base = _managed_bytes()
    buf = mm.memallocmanaged(1 << 12, True)
    assert _managed_bytes() == base + (1 << 12)
    mm.reset()
    assert _managed_bytes() == base
    assert not mm.allocations
    with pytest.raises(ReferenceError):
        buf._mem.size  # the memory object is gone, as with Numba's own reset
    del buf
    gc.collect()
    assert _managed_bytes() == base


def test_zero_bytes_allocate_nothing(mm):
    base = _managed_bytes()
    buf = mm.memallocmanaged(0, True)
    assert isinstance(buf, ManagedOwnedPointer)
    assert buf.size == 0 and int(buf.device_ctypes_pointer.value or 0) == 0
    assert not mm.allocations
    del buf
    gc.collect()
    assert _managed_bytes() == base


def test_out_of_memory_reaches_numba_as_emms_error(mm):
    with emm.Manager(None, 0) as m:
        _, total = m.memory_info()
    with pytest.raises(emm.OutOfMemoryError):
        mm.memallocmanaged(total + (1 << 30), True)
    assert not mm.allocations


def test_out_of_memory_runs_numbas_queued_frees_and_retries_once(mm, monkeypatch):
    """As Numba's own managers do: a managed allocation that runs out of memory runs
    the frees Numba's queue holds, then tries once more; a second failure raises."""
    calls, cleared = [], []
    real = mm._emm.alloc_managed

    def flaky(size, attach_global=True):
        calls.append(size)
        if len(calls) == 1:
            raise emm.OutOfMemoryError("full", size, 0, 0)
        return real(size, attach_global=attach_global)

    monkeypatch.setattr(mm._emm, "alloc_managed", flaky)
    monkeypatch.setattr(mm.deallocations, "clear", lambda: cleared.append(1))
    p = mm.memallocmanaged(4096, True)
    assert calls == [4096, 4096] and cleared == [1]
    assert p.device_ctypes_pointer.value
    del p
    gc.collect()
    cleared.clear()  # the free went to Numba's queue, which may flush it

    def full(size, attach_global=True):
        raise emm.OutOfMemoryError("full", size, 0, 0)

    monkeypatch.setattr(mm._emm, "alloc_managed", full)
    with pytest.raises(emm.OutOfMemoryError):
        mm.memallocmanaged(4096, True)
    assert cleared == [1]
