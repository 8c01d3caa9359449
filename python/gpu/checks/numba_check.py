"""emm.numba_plugin on a GPU: data written and read back through Numba, a kernel
run on emm memory, explicit free, double free refused, memory returned.
Usage: NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin python3 numba_check.py
"""
import gc
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

import emm.numba_plugin  # noqa: E402
from emm._lib import Manager  # noqa: E402


@cuda.jit
def axpy(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def main():
    ctx = cuda.current_context()
    assert isinstance(ctx.memory_manager, emm.numba_plugin.EmmNumbaManager), type(ctx.memory_manager)
    stats = Manager(None, 0).stats
    base = stats()["allocated_bytes"]
    n = 1 << 20
    x = np.arange(n, dtype=np.float32)
    y = np.ones(n, dtype=np.float32)
    dx, dy, dout = cuda.to_device(x), cuda.to_device(y), cuda.device_array(n, dtype=np.float32)
    assert isinstance(dout.gpu_data, emm.numba_plugin.EmmMemoryPointer)
    assert stats()["allocated_bytes"] >= base + 3 * 4 * n, stats()
    axpy[(n + 255) // 256, 256](dout, np.float32(2.0), dx, dy)
    got = dout.copy_to_host()
    assert np.array_equal(got, 2 * x + y), "kernel result differs"
    # A slice is a view of the same block; the block lives while the view does.
    view = dout[10:20]
    del dout
    gc.collect()
    assert np.array_equal(view.copy_to_host(), (2 * x + y)[10:20])
    del view, dx, dy
    gc.collect()
    assert stats()["allocated_bytes"] == base, ("memory not returned", stats(), base)
    # Explicit free, then a second free is refused (Numba's MemoryPointer contract).
    mem = ctx.memalloc(4096)
    mem.memset(7)
    mem.free()
    try:
        mem.free()
    except RuntimeError as e:
        print("double free refused:", e)
    else:
        raise AssertionError("a second free() was accepted")
    del mem
    assert stats()["allocated_bytes"] == base, stats()
    # Many live arrays of mixed sizes, each written with its own value and checked.
    arrs = [cuda.to_device(np.full(s, i % 251, dtype=np.uint8))
            for i, s in enumerate([1, 255, 4096, 65537, 1 << 20] * 40)]
    for i in range(len(arrs)):
        assert (arrs[i].copy_to_host() == i % 251).all(), i
    del arrs
    gc.collect()
    assert stats()["allocated_bytes"] == base, stats()
    print("numba_check OK: kernel, views, explicit and double free, 200 arrays checked; "
          f"allocated back to {base} B")


if __name__ == "__main__":
    main()
