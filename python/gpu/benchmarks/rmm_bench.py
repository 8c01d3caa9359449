"""What an allocation through RMM's Python costs with emm behind it, beside RMM's own
resources: an allocate+free pair of ``rmm.DeviceBuffer(size=n, mr=...)`` (and of
``mr.allocate``/``mr.deallocate``, without the buffer object) through

- ``emm``: ``emm.rmm.resource()``, RMM's ``CallbackMemoryResource`` over emm (the
  device's manager: ``pool`` unless ``EMM_MEMORY_MANAGER`` says otherwise),
- ``emm-native``: ``emm_rmm_native.EmmMemoryResource`` (examples/rmm/native: the C++
  adaptor under a Cython ``DeviceMemoryResource``, no Python per allocation), when
  it imports (examples/rmm/native/build.sh puts it in /tmp/emm_rmm_native),
- ``null-callback``: a ``CallbackMemoryResource`` whose callbacks return a made-up
  address and do nothing (RMM's callback machinery alone; nothing touches the memory),
- ``cuda``: ``CudaMemoryResource`` (cudaMalloc/cudaFree),
- ``pool``: ``PoolMemoryResource`` over ``CudaMemoryResource`` (1 GiB to start),
- ``async``: ``CudaAsyncMemoryResource`` (cudaMallocAsync),

plus ``emm.Manager.alloc``/``free`` alone (emm's ctypes calls, no RMM). Rounds are
interleaved (every variant once per round, in one process); each cell is the median
over rounds of ns per pair, with the min-max. Usage (GPU machine, repository root):
  EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=/tmp/site:python python3 python/gpu/benchmarks/rmm_bench.py [--rounds 7] [--sizes 4096 1048576]
"""
import argparse
import gc
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
import emm  # noqa: E402
import emm.rmm  # noqa: E402

FAKE = 1 << 44  # the null callback's address: never touched


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 1 << 20])
    p.add_argument("--pairs", type=int, default=20000, help="pairs per variant per round (cuda: a tenth)")
    p.add_argument("--resources", nargs="+",
                   default=["emm", "emm-native", "null-callback", "cuda", "pool", "async"],
                   help="emm-native is left out when emm_rmm_native does not import")
    args = p.parse_args()

    import rmm
    import rmm.mr

    manager = emm.Manager(None, 0)
    try:
        import emm_rmm_native
    except ImportError as e:
        if "emm-native" in args.resources:
            print(f"emm-native left out: {e}")
            args.resources.remove("emm-native")
    make = {
        "emm-native": lambda: emm_rmm_native.EmmMemoryResource(0),
        "emm": lambda: emm.rmm.resource(manager),
        "null-callback": lambda: rmm.mr.CallbackMemoryResource(lambda n, s: FAKE, lambda p, n, s: None),
        "cuda": rmm.mr.CudaMemoryResource,
        "pool": lambda: rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), initial_pool_size=1 << 30),
        "async": rmm.mr.CudaAsyncMemoryResource,
    }
    resources = {name: make[name]() for name in args.resources}
    DeviceBuffer = rmm.DeviceBuffer

    def buffer_pairs(mr, size, n):
        for _ in range(n):
            DeviceBuffer(size=size, mr=mr)  # dropped at once: allocate + free

    def mr_pairs(mr, size, n):
        alloc, free = mr.allocate, mr.deallocate
        for _ in range(n):
            free(alloc(size), size)

    def manager_pairs(_, size, n):
        alloc, free = manager.alloc, manager.free
        for _ in range(n):
            free(alloc(size))

    cases = []  # (label, function, resource, pairs)
    for size in args.sizes:
        for name, mr in resources.items():
            n = args.pairs // 10 if name == "cuda" else args.pairs
            cases.append((f"DeviceBuffer  {name:<14} {size:>8}", buffer_pairs, mr, size, n))
        for name, mr in resources.items():
            n = args.pairs // 10 if name == "cuda" else args.pairs
            cases.append((f"mr.allocate   {name:<14} {size:>8}", mr_pairs, mr, size, n))
        cases.append((f"Manager.alloc {'emm (no RMM)':<14} {size:>8}", manager_pairs, None, size, args.pairs))

    print(f"rmm {rmm.__version__}; emm manager {manager.name}; {args.rounds} interleaved rounds; "
          f"ns per allocate+free pair (median over rounds, min-max)", flush=True)
    for label, f, mr, size, n in cases:  # warm up: pools grow, code paths load
        f(mr, size, min(n, 200))
    times = {c[0]: [] for c in cases}
    gc.disable()
    for r in range(args.rounds):
        for label, f, mr, size, n in cases:
            t0 = time.perf_counter_ns()
            f(mr, size, n)
            times[label].append((time.perf_counter_ns() - t0) / n)
        print(f"  round {r + 1} done", flush=True)
    gc.enable()
    print(f"\n{'path':<14}{'resource':<15}{'bytes':>8}  {'median ns':>10}  {'min-max ns':>19}  vs pool")
    for label, f, mr, size, n in cases:
        v = times[label]
        med = statistics.median(v)
        pool_label = f"{label[:14]}{'pool':<14} {size:>8}"
        ref = statistics.median(times[pool_label]) if pool_label in times else None
        ratio = f"{med / ref:6.2f}x" if ref else ""
        print(f"{label}  {med:>10.0f}  {min(v):>8.0f}-{max(v):<10.0f} {ratio}")
    print(f"\nemm after the runs: {manager.stats()}")


if __name__ == "__main__":
    main()
