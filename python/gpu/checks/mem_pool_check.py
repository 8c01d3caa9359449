"""``torch.cuda.MemPool`` under emm's own allocator object, on a GPU.

1. **A private pool.** ``MemPool()`` counts one use (``use_count``); inside
   ``use_mem_pool`` the thread's tensors come from the pool (``emm.torch.
   mem_pool_stats`` counts them; they hold the data written), a tensor made by
   another thread meanwhile does not; after the ``with`` new tensors come from the
   process's manager again; a freed tensor's block stays in the pool and is
   reused by the pool's next use at the same address; once the pool and its
   tensors are gone, its memory goes back (``torch.cuda.empty_cache()``) and the
   device's free memory (``cudaMemGetInfo``) says so.
2. **A pool with its own allocator.** ``MemPool(allocator=X)`` with X a
   ``CUDAPluggableAllocator`` over a small ``cudaMalloc`` library built here with
   nvcc: tensors made in ``use_mem_pool`` are X's (its counters move; emm's pool
   holds none of them) and hold their data; freed, they stay the pool's (taken
   again by its next use at the same address) and go back through X once the
   pool dies.
3. **Use counts.** ``use_count`` follows ``use_mem_pool`` (2 inside, 1 after).
4. **Refusals.** ``MemPool(use_on_oom=True)`` and ``MemPool(no_split=True)`` raise
   with emm's reason (where this PyTorch has the arguments).

Prints one JSON line and ``mem_pool_check: OK`` (exit 0) when every step holds.

    EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=python \\
        python3 python/gpu/checks/mem_pool_check.py
"""

import ctypes
import gc
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading

MIB = 1 << 20

ALLOCATOR_SOURCE = r"""
#include <cuda_runtime_api.h>
#include <sys/types.h>
static unsigned long long g_allocs, g_frees;
extern "C" void* check_alloc(ssize_t size, int device, cudaStream_t stream) {
  void* p = nullptr;
  if (cudaMalloc(&p, size) != cudaSuccess) return nullptr;
  ++g_allocs;
  return p;
}
extern "C" void check_free(void* p, ssize_t size, int device, cudaStream_t stream) {
  cudaStreamSynchronize(stream);
  cudaFree(p);
  ++g_frees;
}
extern "C" unsigned long long check_allocs() { return g_allocs; }
extern "C" unsigned long long check_frees() { return g_frees; }
"""


def build_allocator(folder: pathlib.Path) -> pathlib.Path:
    src = folder / "check_alloc.cu"
    out = folder / "libcheck_alloc.so"
    src.write_text(ALLOCATOR_SOURCE)
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


def device_free(torch) -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def main() -> int:
    import torch

    import emm.torch as et

    et.install()
    kind = et.installed()
    assert kind == "native", f"emm's own object is needed, got {kind}"
    dev = torch.device("cuda", 0)
    torch.ones(1, device=dev)  # the context and emm's device state
    result = {"object": kind}
    free_at_start = device_free(torch)

    # 1. A private pool.
    pool = torch.cuda.MemPool()
    assert pool.use_count() == 1, pool.use_count()
    other = {}

    def elsewhere():
        other["t"] = torch.full((MIB,), 7.0, device=dev)

    with torch.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2, pool.use_count()
        a = torch.full((8 * MIB,), 3.0, device=dev)  # 32 MiB
        b = torch.arange(4 * MIB, device=dev, dtype=torch.float32)
        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
        inside = et.mem_pool_stats(pool)
    assert pool.use_count() == 1, pool.use_count()
    # a and b: the other thread's tensor, made meanwhile, is not the pool's.
    assert inside["live_blocks"] == 2, inside
    assert inside["live_bytes"] >= 48 * MIB, inside
    c = torch.zeros(MIB, device=dev)
    after = et.mem_pool_stats(pool)
    assert after["live_blocks"] == 2, ("a tensor made after the with came from the pool", after)
    assert float(a.sum()) == 3.0 * 8 * MIB and float(b[-1]) == 4 * MIB - 1
    assert float(other["t"].sum()) == 7.0 * MIB
    a_ptr = a.data_ptr()
    del a
    kept = et.mem_pool_stats(pool)
    assert kept["live_blocks"] == 1 and kept["reserved_bytes"] == inside["reserved_bytes"], kept
    with torch.cuda.use_mem_pool(pool):
        again = torch.full((8 * MIB,), 5.0, device=dev)
    assert again.data_ptr() == a_ptr, "the pool's freed block was not reused by its next use"
    assert float(again.sum()) == 5.0 * 8 * MIB
    result["pool_reserved_mib"] = inside["reserved_bytes"] / MIB
    reserved_with_pool = torch.cuda.memory_reserved()
    pool_id = pool.id
    del again, b, pool
    gc.collect()
    torch.cuda.empty_cache()
    gone = et.mem_pool_stats(pool_id)
    assert gone["uses"] == 0 and gone["reserved_bytes"] == 0, gone
    reserved_after = torch.cuda.memory_reserved()
    assert reserved_with_pool - reserved_after >= 48 * MIB, (reserved_with_pool, reserved_after)
    free_after = device_free(torch)
    result["device_free_regained_mib"] = round((free_after - free_at_start) / MIB, 1)
    assert free_at_start - free_after < 64 * MIB, ("the pool's memory did not go back to the device",
                                                    free_at_start, free_after)
    del c, other

    # 2. A pool with its own allocator.
    with tempfile.TemporaryDirectory() as tmp:
        lib_path = build_allocator(pathlib.Path(tmp))
        lib = ctypes.CDLL(str(lib_path))
        lib.check_allocs.restype = ctypes.c_ulonglong
        lib.check_frees.restype = ctypes.c_ulonglong
        x = torch.cuda.memory.CUDAPluggableAllocator(str(lib_path), "check_alloc", "check_free")
        xpool = torch.cuda.MemPool(x.allocator())
        assert xpool.use_count() == 1
        with torch.cuda.use_mem_pool(xpool):
            d = torch.full((2 * MIB,), 9.0, device=dev)
            e = torch.ones(3 * MIB, device=dev)
        outside = torch.ones(MIB, device=dev)
        assert lib.check_allocs() == 2, lib.check_allocs()
        assert float(d.sum()) == 9.0 * 2 * MIB and float((d[: MIB] * e[: MIB]).sum()) == 9.0 * MIB
        xs = et.mem_pool_stats(xpool)
        assert xs["live_bytes"] == 0 and xs["uses"] == 1, ("emm's pool holds X's memory", xs)
        d_ptr = d.data_ptr()
        del d, e
        torch.cuda.synchronize()
        # Freed blocks stay the pool's while it lives (a graph captured with it
        # would write into them): none went back to X, and the pool's next use
        # takes them again.
        assert lib.check_frees() == 0, lib.check_frees()
        with torch.cuda.use_mem_pool(xpool):
            d2 = torch.full((2 * MIB,), 4.0, device=dev)
        assert d2.data_ptr() == d_ptr and lib.check_allocs() == 2, (lib.check_allocs(), "not taken again")
        assert float(d2.sum()) == 4.0 * 2 * MIB
        del d2
        result["foreign_allocs"] = lib.check_allocs()
        del xpool, outside
        gc.collect()
        torch.cuda.synchronize()
        # The pool died: its blocks went back to X.
        assert lib.check_frees() == 2, lib.check_frees()
        result["foreign_frees"] = lib.check_frees()
    # 4. Refusals.
    refused = {}
    for kwargs in ({"use_on_oom": True}, {"no_split": True}):
        name = next(iter(kwargs))
        try:
            torch.cuda.MemPool(**kwargs)
        except TypeError:
            refused[name] = "not an argument of this PyTorch"
            continue
        except RuntimeError as e:
            assert "emm's allocator object" in str(e), e
            refused[name] = "refused"
            continue
        raise AssertionError(f"MemPool({name}=True) was accepted")
    result["refused"] = refused
    print(json.dumps(result))
    print("mem_pool_check: OK")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("EMM_LOG", "warn")
    sys.exit(main())
