"""What numba-cuda's test_host_alloc_pinned does to a pool, step by step.

The test memsets ``driver.device_memory_size(devary)`` bytes from the array's
start; that size is the extent ``cuMemGetAddressRange`` reports for the driver
allocation holding the array. For a block inside a pool's segment it is the
segment's size, so the memset covers whatever follows the block. This probe shows,
under the manager that ``NUMBA_CUDA_MEMORY_MANAGER`` names (unset: Numba's
default), two placements:

- ``first``: the array is the first block of a fresh pool, a live neighbour follows;
- ``after``: a live block sits before the array, a live neighbour follows.

For each it prints the extent, whether the memset succeeded, and whether the
neighbour still holds its data. Usage: python3 extent_probe.py LABEL
"""
import sys

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver


def place(before):
    # ``keep`` has the array's size, so a pool that reuses the block freed by the
    # previous case gives it to ``keep``, and the array lands after it.
    keep = cuda.to_device(np.full(10, 5, np.uint32)) if before else None
    devary = cuda.to_device(np.full(10, 123, np.uint32))
    neighbour = cuda.to_device(np.full(1024, 7, np.uint32))
    return keep, devary, neighbour


def main(label):
    for name, before in (("first", False), ("after", True)):
        keep, devary, neighbour = place(before)
        ptr = driver.device_pointer(devary)
        start, end = driver.device_extents(devary)
        size = driver.device_memory_size(devary)
        try:
            driver.device_memset(devary, 0, size)
            cuda.synchronize()
            memset = "ok"
        except Exception as e:  # the driver's refusal is what this probe reports
            memset = f"refused ({type(e).__name__}: {str(e)[:80]})"
        intact = bool(np.all(neighbour.copy_to_host() == 7))
        kept = "" if keep is None else (
            "; live block before it " + ("intact" if np.all(keep.copy_to_host() == 5) else "OVERWRITTEN"))
        print(
            f"{label} {name}: array at +{ptr - start} in an extent of {size} bytes "
            f"(asked 40); memset {memset}; live neighbour after it "
            f"{'intact' if intact else 'OVERWRITTEN'}{kept}",
            flush=True,
        )
        del keep, devary, neighbour


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "?")
