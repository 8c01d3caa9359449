"""Allocate+free pairs as Python users see them, through emm (timed like
shared/peers/py_bench.py: median of 7 repetitions, first call excluded).

Usage: python3 bench.py {numba-emm|torch-emm|cupy-emm}
Prints '<variant> size=<bytes> us_per_pair=<median>' per size. One variant per
process: Numba's manager and PyTorch's allocator are fixed at first use.
"""
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
SIZES = [256, 65536, 1 << 20, 64 << 20]


def timeit(fn, n, reps=7):
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n)
    return statistics.median(out) * 1e6


def main(variant):
    label = f"{variant}({os.environ.get('EMM_MEMORY_MANAGER') or 'pool'})"
    # Each variant installs emm, then times exactly what py_bench.py times for its
    # peer: the same function body, the same counts.
    if variant == "numba-emm":
        from numba import cuda
        import emm.numba_plugin
        import numpy as np
        cuda.set_memory_manager(emm.numba_plugin.EmmNumbaManager)

        def make(sz):
            def f():
                a = cuda.device_array(sz, dtype=np.uint8)
                del a
            return f
    elif variant == "torch-emm":
        import emm.torch
        emm.torch.install()
        import torch
        torch.cuda.init()

        def make(sz):
            def f():
                a = torch.empty(sz, dtype=torch.uint8, device="cuda")
                del a
            return f
    elif variant == "cupy-emm":
        import emm.cupy
        import cupy
        emm.cupy.install()

        def make(sz):
            def f():
                a = cupy.empty(sz, dtype=cupy.uint8)
                del a
            return f
    else:
        raise SystemExit(f"unknown variant {variant}")
    for sz in SIZES:
        n = 200 if sz >= (64 << 20) else 2000
        print(f"{label} size={sz} us_per_pair={timeit(make(sz), n):.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
