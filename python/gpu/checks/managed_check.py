"""Managed memory through emm.numba_plugin on a GPU: ``cuda.managed_array`` written
by the host and by kernels (attached globally and to the host), ``memallocmanaged``
set by a device memset and read by the host, frees held back by
``defer_cleanup``, ``reset``, and emm's ``emm.managed_*`` counters back where they
started. Prints one line per check and exits non-zero on the first failure.
Usage: NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin EMM_MEMORY_MANAGER=pool python3 managed_check.py
"""
import gc
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402
from numba.cuda.cudadrv.driver import ManagedOwnedPointer, device_memset  # noqa: E402

import emm.numba_plugin  # noqa: E402
from emm._lib import Manager  # noqa: E402


@cuda.jit
def double_plus_index(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 2.0 * x[i] + i


def managed_bytes(mgr):
    return mgr.memory_stats()["emm.managed_bytes.current"]


def check(name, cond, detail=""):
    if not cond:
        raise AssertionError(f"{name}: {detail}")
    print(f"  ok  {name}")


def check_defer_cleanup(ctx, mgr, base, alloc):
    """defer_cleanup holds a managed free back; the memory manager's queue frees it
    on its next flush. ``cuda.defer_cleanup()`` is ``ctx.defer_cleanup()``; ``alloc(n)``
    gives ``n`` bytes of managed memory. (python/tests/test_numba_plugin.py runs this
    on the stand-in driver.)

    Memory frees (Numba's ``_alloc_finalizer``, the plugin's ``_managed_finalizer``)
    are queued on ``ctx.memory_manager.deallocations``, the queue Numba's own
    test_deallocations flushes for memory. ``ctx.deallocations`` is another queue,
    the context's (streams, events, modules): flushing it frees no memory, with
    Numba's own manager either."""
    with ctx.defer_cleanup():
        held = alloc(1 << 16)
        del held
        gc.collect()
        check("not freed inside defer_cleanup", managed_bytes(mgr) == base + (1 << 16))
    ctx.memory_manager.deallocations.clear()
    check("freed after defer_cleanup", managed_bytes(mgr) == base, managed_bytes(mgr))


def main():
    ctx = cuda.current_context()
    plugin = ctx.memory_manager
    check("the plugin serves the context", isinstance(plugin, emm.numba_plugin.EmmNumbaManager),
          type(plugin))
    mgr = Manager(None, 0)
    cc = ctx.device.compute_capability
    print(f"emm manager {mgr.name}, device cc {cc}")
    base = managed_bytes(mgr)

    # cuda.managed_array: the host fills it, a kernel updates it, the host reads it.
    attaches = [True, False] if cc[0] >= 6 else [True]
    for attach_global in attaches:
        n = 1_000_003
        device_base = mgr.stats()["allocated_bytes"]
        ary = cuda.managed_array(n, dtype=np.float64, attach_global=attach_global)
        check(f"managed_array (attach_global={attach_global}) is emm's",
              isinstance(ary.gpu_data, ManagedOwnedPointer)
              and int(ary.gpu_data.device_ctypes_pointer.value) in plugin.allocations)
        check("counted as managed, not as device memory",
              managed_bytes(mgr) == base + n * 8 and mgr.stats()["allocated_bytes"] == device_base,
              (managed_bytes(mgr), base, mgr.stats()))
        ary[:] = 1.5
        double_plus_index[(n + 255) // 256, 256](ary)
        cuda.synchronize()
        check("a kernel's writes are read by the host", np.array_equal(ary, 3.0 + np.arange(n)))
        # The host writes again between launches: the kernel sees it.
        ary[:10] = -1.0
        double_plus_index[(n + 255) // 256, 256](ary)
        cuda.synchronize()
        check("host writes between launches reach the device",
              np.array_equal(ary[:10], -2.0 + np.arange(10))
              and ary[n - 1] == 2 * (3.0 + n - 1) + n - 1)
        del ary
        gc.collect()
        check("freed when the array goes", managed_bytes(mgr) == base, managed_bytes(mgr))

    # Numba's test_managed_alloc way: memallocmanaged, a device memset, host reads.
    n_bytes = 64 << 20
    mem = ctx.memallocmanaged(n_bytes, attach_global=True)
    host = np.ndarray(shape=n_bytes, dtype=np.uint8, buffer=mem)
    device_memset(mem, 0xAB, n_bytes)
    ctx.synchronize()
    check("a device memset is read by the host", bool(np.all(host == 0xAB)))
    del host, mem
    gc.collect()
    check("memallocmanaged memory freed", managed_bytes(mgr) == base)

    check_defer_cleanup(ctx, mgr, base, lambda n: cuda.managed_array(n, dtype=np.uint8))

    # reset frees what callers still hold (as Numba's own reset does).
    kept = cuda.managed_array(4096, dtype=np.uint8)
    check("held before reset", managed_bytes(mgr) == base + 4096)
    ctx.reset()
    check("reset frees held managed memory", managed_bytes(mgr) == base)
    del kept
    gc.collect()
    check("nothing freed twice", managed_bytes(mgr) == base)

    # Many live managed arrays of mixed sizes, each with its own value.
    arrs = [cuda.managed_array(s, dtype=np.uint8) for s in [1, 255, 4096, 65537, 1 << 20] * 20]
    for i, a in enumerate(arrs):
        a[:] = i % 251
    for i, a in enumerate(arrs):
        if not (a == i % 251).all():
            raise AssertionError(f"managed array {i} was overwritten")
    check("100 live managed arrays keep their values", True)
    del arrs, a
    gc.collect()
    check("every managed array freed", managed_bytes(mgr) == base, managed_bytes(mgr))
    peak = mgr.memory_stats()["emm.managed_bytes.peak"]
    print(f"managed_check OK: {mgr.name}; peak {peak} managed bytes; back to {base}")


if __name__ == "__main__":
    main()
