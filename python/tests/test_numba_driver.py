"""emm's NBEP 7 plugin under numba-cuda's own driver layer, on a driver.

``cargo xtask ci`` (``xtask/src/numba.rs``, ``-m numba_driver``: ``-m standin``
runs without the link below) runs these with numba-cuda and the
NVIDIA bindings (``cuda-bindings``) installed from PyPI, over the stand-in driver:
``libcuda.so.1`` on ``LD_LIBRARY_PATH`` is a link to ``libemm_standin.so``, the
file ``EMM_CUDA_DRIVER`` names, so Numba (which resolves every entry point with
``cuGetProcAddress_v2``) and emm share one loaded driver. Numba creates its context,
streams and copies through that driver and asks emm's plugin for device memory:
``device_array``, ``to_device``/``copy_to_host``, ``defer_cleanup``, IPC handles
(opened in this process: the stand-in's memory is private to it), memory info and
reset. No kernel is launched (the stand-in cannot run code; Numba compiles none for
these calls, so NVVM is not needed).
"""

import ctypes
import gc
import os
import pickle

import pytest

from conftest import HAS_GPU, ON_STANDIN

pytestmark = [
    pytest.mark.numba_driver,
    pytest.mark.skipif(not (ON_STANDIN or HAS_GPU),
                       reason="needs a driver: a GPU, or emm-standin through EMM_CUDA_DRIVER"),
]

np = pytest.importorskip("numpy")
cuda = pytest.importorskip("numba.cuda")

import emm  # noqa: E402
import emm.numba_plugin as plugin  # noqa: E402

MiB = 1 << 20


def _control(command: str) -> int:
    """The stand-in's answer to ``command`` (``emmStandinControl``)."""
    lib = ctypes.CDLL(os.environ["EMM_CUDA_DRIVER"])
    out = ctypes.c_uint64()
    assert lib.emmStandinControl(command.encode(), ctypes.byref(out)) == 0, command
    return out.value


def _calls(function: str) -> int:
    return _control(f"calls {function}")


@pytest.fixture(scope="module")
def ctx():
    """Numba's context for device 0, its memory manager emm's plugin."""
    cuda.set_memory_manager(plugin.EmmNumbaManager)
    context = cuda.current_context()
    yield context
    gc.collect()
    cuda.close()


@pytest.fixture
def mgr(ctx):
    """emm's manager of device 0: the one the plugin allocates from."""
    return emm.Manager(None, 0)


def test_numbas_context_runs_on_the_driver_emm_uses(ctx):
    assert isinstance(ctx.memory_manager, plugin.EmmNumbaManager)
    assert ctx.memory_manager.interface_version == 1
    dev = ctx.device
    assert dev.id == 0
    if ON_STANDIN:
        assert dev.name in ("emm stand-in 0 (host memory)", b"emm stand-in 0 (host memory)")
        assert dev.compute_capability == (9, 0)
        # The bindings resolved Numba's functions through cuGetProcAddress_v2 of
        # the library the stand-in's control function answers for: one driver.
        assert _calls("cuGetProcAddress_v2") > 100
        before = _calls("cuCtxGetDevice")
        from numba.cuda.cudadrv.driver import driver

        assert int(driver.cuCtxGetDevice()) == 0
        assert _calls("cuCtxGetDevice") == before + 1


def test_device_array_is_emms_memory(ctx, mgr):
    base = mgr.stats()
    n = 1 << 16
    d = cuda.device_array(n, dtype=np.float64)
    ptr = int(d.device_ctypes_pointer.value)
    assert ptr and ptr % 256 == 0
    now = mgr.stats()
    assert now["allocations"] == base["allocations"] + 1
    assert now["allocated_bytes"] - base["allocated_bytes"] >= n * 8
    d.copy_to_device(np.arange(n, dtype=np.float64))
    if ON_STANDIN:  # device memory is host memory: the bytes are at emm's address
        assert (ctypes.c_double * n).from_address(ptr)[n - 1] == n - 1
    assert (d.copy_to_host() == np.arange(n)).all()
    del d
    gc.collect()
    assert mgr.stats()["allocated_bytes"] == base["allocated_bytes"]


def test_to_device_and_back_round_trips_through_the_driver(ctx, mgr):
    host = np.arange(3 * 1000, dtype=np.int32).reshape(3, 1000)
    # The stand-in counts driver calls; a GPU's driver does not.
    htod = _calls("cuMemcpyHtoD_v2") if ON_STANDIN else None
    dtoh = _calls("cuMemcpyDtoH_v2") if ON_STANDIN else None
    d = cuda.to_device(host)
    assert d.shape == (3, 1000) and d.dtype == np.int32
    back = d.copy_to_host()
    assert (back == host).all() and back is not host
    if ON_STANDIN:
        assert _calls("cuMemcpyHtoD_v2") > htod and _calls("cuMemcpyDtoH_v2") > dtoh
    # Device to device (another emm block), a strided slice, into a given array.
    other = cuda.device_array_like(d)
    dtod = _calls("cuMemcpyDtoD_v2") if ON_STANDIN else None
    other.copy_to_device(d)
    if ON_STANDIN:
        assert _calls("cuMemcpyDtoD_v2") > dtod
    assert (other[1].copy_to_host() == host[1]).all()
    out = np.zeros_like(host)
    other.copy_to_host(out)
    assert (out == host).all()
    assert int(other.device_ctypes_pointer.value) != int(d.device_ctypes_pointer.value)


def test_copies_on_a_stream(ctx, mgr):
    s = cuda.stream()
    host = np.linspace(0, 1, 5000)
    d = cuda.to_device(host, stream=s)
    out = cuda.pinned_array(5000, dtype=np.float64)
    d.copy_to_host(out, stream=s)
    s.synchronize()
    assert (out == host).all()
    if ON_STANDIN:
        assert _calls("cuMemcpyHtoDAsync_v2") > 0 and _calls("cuMemcpyDtoHAsync_v2") > 0


def test_memory_info_is_the_drivers_and_follows_allocations(ctx, mgr):
    info = ctx.get_memory_info()
    assert (info.free, info.total) == mgr.memory_info()
    if ON_STANDIN:
        assert info.total == _control("capacity")
        assert info.free == info.total - _control("used_bytes")
    big = cuda.device_array(64 * MiB, dtype=np.uint8)
    after = ctx.get_memory_info()
    assert after.total == info.total
    assert after.free <= info.free - 64 * MiB
    del big


def test_reset_gives_cached_memory_back(ctx, mgr):
    big = cuda.device_array(96 * MiB, dtype=np.uint8)
    held = ctx.get_memory_info().free
    del big
    gc.collect()
    # emm's pool keeps the freed block for reuse: the driver still counts it.
    assert ctx.get_memory_info().free == held
    assert mgr.stats()["reserved_bytes"] >= 96 * MiB
    ctx.reset()  # Numba's Context.reset: its memory manager's reset, then its queue
    assert ctx.get_memory_info().free >= held + 96 * MiB
    assert mgr.stats()["reserved_bytes"] < 96 * MiB
    # The manager still works after a reset.
    d = cuda.to_device(np.arange(10))
    assert (d.copy_to_host() == np.arange(10)).all()


def test_defer_cleanup_holds_numbas_frees_not_emms(ctx, mgr):
    def managed_now():
        return mgr.memory_stats()["emm.managed_bytes.current"]

    base_alloc, base_managed = mgr.stats()["allocated_bytes"], managed_now()
    with cuda.defer_cleanup():
        dev = cuda.device_array(1 << 20, dtype=np.uint8)
        man = cuda.managed_array(1 << 16, dtype=np.uint8)
        man[:] = 7  # managed memory: the host writes it directly
        assert managed_now() == base_managed + (1 << 16)
        host = cuda.pinned_array(1 << 16, dtype=np.uint8)
        live_host = _control("live_host") if ON_STANDIN else None
        del dev, man, host
        gc.collect()
        # Device memory goes back to emm at once (its frees never synchronize);
        # managed memory and Numba's pinned host memory wait in Numba's queue,
        # which does not run while deferred, even when asked to.
        ctx.memory_manager.deallocations.clear()
        assert mgr.stats()["allocated_bytes"] == base_alloc
        assert managed_now() == base_managed + (1 << 16)
        if ON_STANDIN:
            assert _control("live_host") == live_host
    # Afterwards the queue runs when Numba next flushes it.
    assert managed_now() == base_managed + (1 << 16)
    ctx.memory_manager.deallocations.clear()
    assert managed_now() == base_managed
    if ON_STANDIN:
        assert _control("live_host") == live_host - 1


def test_ipc_handle_fields_and_opening_it(ctx, mgr):
    host = np.arange(4096, dtype=np.float64)
    d = cuda.to_device(host)
    ipch = d.get_ipc_handle()
    inner = ipch._ipc_handle
    # The handle names the base of the driver's allocation (one of the pool's
    # segments) and the array's offset in it.
    from numba.cuda.cudadrv.driver import device_extents

    base, end = device_extents(d.gpu_data)
    ptr = int(d.device_ctypes_pointer.value)
    assert base <= ptr and ptr + host.nbytes <= end
    assert inner.size == host.nbytes and inner.offset == ptr - base
    assert inner.source_info == ctx.device.get_device_identity()
    if ON_STANDIN:
        assert inner.handle.reserved.startswith(b"EMMSTIPC")
    # A view: the same allocation, further in.
    view_h = d[1000:].get_ipc_handle()._ipc_handle
    assert view_h.offset == inner.offset + 1000 * 8 and view_h.size == 3096 * 8
    assert view_h.handle.reserved == inner.handle.reserved
    # What another process would do, here: the pickled handle (without the
    # exporter's reference) opens to the same bytes.
    if not ON_STANDIN:
        return  # a GPU's driver refuses to open a handle in the process that made it
    opened_before = _control("ipc_open")
    remote = pickle.loads(pickle.dumps(ipch))
    with remote as arr:
        assert _control("ipc_open") == opened_before + 1
        assert (arr.copy_to_host() == host).all()
        assert int(arr.device_ctypes_pointer.value) == int(d.device_ctypes_pointer.value)
    assert _control("ipc_open") == opened_before
    view_remote = pickle.loads(pickle.dumps(d[1000:].get_ipc_handle()))
    with view_remote as arr:
        assert (arr.copy_to_host() == host[1000:]).all()


def test_large_arrays_keep_the_expandable_segment_and_export_by_descriptor(ctx, mgr):
    # The plugin keeps the pool's expandable segment (no EMM_POOL_EXPANDABLE=0)
    # and makes its pieces exportable.
    assert os.environ.get("EMM_POOL_EXPANDABLE") != "0"
    assert "EMM_POOL_EXPORTABLE" not in os.environ, "the plugin configures it in code"
    host = np.arange(3 * MiB, dtype=np.float32)  # 12 MiB: a large block
    d = cuda.to_device(host)
    snap = mgr.snapshot()
    ptr = int(d.device_ctypes_pointer.value)
    seg = [s for s in snap["segments"] if s["address"] <= ptr < s["address"] + s["total_size"]]
    assert seg and seg[0]["expandable"], "the array lives in the expandable segment"
    ipch = d.get_ipc_handle()
    inner = ipch._ipc_handle
    assert isinstance(inner, plugin.EmmIpcHandle)
    assert inner.emm_handle[:6] == b"EMMIPC" and inner.emm_handle[7] == 3
    assert inner.size == host.nbytes and inner.offset == 0
    assert inner.source_info == ctx.device.get_device_identity()
    with pytest.raises(ValueError, match="original process"):
        inner.open(ctx)  # as Numba's: the exporter's own handle does not open
    view_h = d[1000:].get_ipc_handle()._ipc_handle
    assert isinstance(view_h, plugin.EmmIpcHandle)
    assert view_h.offset == 4000 and view_h.size == host.nbytes - 4000
    if not ON_STANDIN:
        return  # the cross-process round trip is `vmm_ipc_round_trip_across_processes`
    # What another process does, here: the pickled handle maps the same memory
    # at addresses of its own.
    remote = pickle.loads(pickle.dumps(ipch))
    assert remote._ipc_handle.base is None
    with remote as arr:
        assert int(arr.device_ctypes_pointer.value) != ptr
        assert (arr.copy_to_host() == host).all()
        arr[:16].copy_to_device(np.full(16, 7.0, dtype=np.float32))
    assert (d.copy_to_host()[:16] == 7.0).all(), "written through the import"
    with pytest.raises(ValueError, match="not opened"):
        remote._ipc_handle.close()
    # A close the driver refuses raises and leaves the handle open for another.
    again = pickle.loads(pickle.dumps(ipch))._ipc_handle
    again.open(ctx)
    _control("fail cuMemUnmap 1 CUDA_ERROR_UNKNOWN")
    with pytest.raises(emm.EmmError, match="cuMemUnmap"):
        again.close()
    again.close()
    with pytest.raises(ValueError, match="not opened"):
        again.close()
    view_remote = pickle.loads(pickle.dumps(d[1000:].get_ipc_handle()))
    with view_remote as arr:
        assert (arr.copy_to_host() == host[1000:]).all()
    # A handle whose exporter is gone is emm's typed error.
    gone = plugin.EmmIpcHandle(None, bytes(inner.emm_handle[:8]) + b"\0" * 40, 16)
    with pytest.raises(emm.EmmError):
        gone.open(ctx)


def test_out_of_memory_reaches_numba_as_emms_error(ctx, mgr):
    _, total = mgr.memory_info()
    with pytest.raises(emm.OutOfMemoryError):
        cuda.device_array(total + MiB, dtype=np.uint8)
    d = cuda.device_array(16, dtype=np.uint8)  # and the next allocation works
    assert d.size == 16
