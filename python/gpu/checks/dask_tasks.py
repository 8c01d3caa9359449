"""What the Dask workers of ``python/gpu/checks/dask_cluster.py`` run: functions of an
importable module, so tasks carry them by name (the script puts this folder on the
workers' ``PYTHONPATH``) and the Numba kernel is compiled once per worker."""

from __future__ import annotations

import os
from typing import Any, Dict

_AFFINE: Any = None


def to_numpy(block: Any) -> Any:
    """A CuPy block as a NumPy array (results travel to the client as host data, so
    the client needs no GPU memory for them)."""
    import cupy

    return cupy.asnumpy(block)


def _affine_kernel() -> Any:
    global _AFFINE
    if _AFFINE is None:
        from numba import cuda

        @cuda.jit
        def affine(x: Any, out: Any, a: float, b: float) -> None:
            i, j = cuda.grid(2)
            if i < x.shape[0] and j < x.shape[1]:
                out[i, j] = a * x[i, j] + b

        _AFFINE = affine
    return _AFFINE


def numba_affine(block: Any, a: float, b: float) -> Any:
    """``a * block + b`` by a Numba kernel on a CuPy block: the output is a Numba
    device array (allocated by Numba's memory manager: emm's NBEP 7 plugin under
    EmmPlugin), handed back to CuPy without a copy (``__cuda_array_interface__``)."""
    import warnings

    import cupy
    from numba import cuda

    kernel = _affine_kernel()
    out = cuda.device_array(block.shape, dtype=block.dtype)
    threads = (16, 16)
    blocks = ((block.shape[0] + 15) // 16, (block.shape[1] + 15) // 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumbaPerformanceWarning on small grids
        kernel[blocks, threads](cuda.as_cuda_array(block), out, a, b)
    return cupy.asarray(out)


def cupy_pool_bytes() -> Dict[str, int]:
    """CuPy's own memory pool on this worker: bytes it holds and bytes in use."""
    import cupy

    pool = cupy.get_default_memory_pool()
    return {"total": int(pool.total_bytes()), "used": int(pool.used_bytes())}


def environment(names: Any) -> Dict[str, Any]:
    """The worker's values of the environment variables ``names``."""
    return {n: os.environ.get(n) for n in names}
