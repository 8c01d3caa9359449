"""Where the time of a CuPy ``cupy.empty`` allocate+free pair goes, all in one
process (CuPy lets the allocator change at any time, so every variant runs in the
same process, interleaved rep by rep, and the process's speed is shared by all).

Usage: python3 cupy_probe.py [emm-first]
(emm-first: emm is installed and serves CuPy's first allocation, as in bench.py;
otherwise CuPy's own pool serves the first one.)
Rows (microseconds per pair or per call, median of 7 interleaved repetitions):
- cupy-pool: CuPy's own memory pool.
- pfa-floor: CuPy's PythonFunctionAllocator over Python functions that hand out
  one fixed address and free nothing: the cost of the hook itself.
- emm: ``emm.cupy.install()`` as shipped (PythonFunctionAllocator over emm).
- emm-fn: the plain allocator function ``emm.cupy.allocator``.
- parts: ``get_current_stream().ptr``; ``Manager.alloc`` + ``Manager.free``.
"""
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
import cupy  # noqa: E402
import emm  # noqa: E402
import emm.cupy  # noqa: E402

SIZES = [256, 65536, 1 << 20, 64 << 20]
N = 2000


def rate(fn, n=N):
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main(emm_first):
    native = cupy.cuda.get_allocator()
    if emm_first:
        emm.cupy.install()
        first = cupy.empty(16, dtype=cupy.uint8)
        del first
        cupy.cuda.set_allocator(native)
    spare = cupy.cuda.alloc(1 << 20)  # a real address for the floor (never written)
    fixed = spare.ptr
    floor = cupy.cuda.PythonFunctionAllocator(lambda size, dev: fixed, lambda ptr, dev: None).malloc
    emm.cupy.install()
    shipped = cupy.cuda.get_allocator()
    variants = {"cupy-pool": native, "pfa-floor": floor, "emm": shipped, "emm-fn": emm.cupy.allocator}
    for sz in SIZES:
        def pair():
            a = cupy.empty(sz, dtype=cupy.uint8)
            del a
        times = {k: [] for k in variants}
        for k, alloc in variants.items():  # warm every path once
            cupy.cuda.set_allocator(alloc)
            pair()
        for _ in range(7):
            for k, alloc in variants.items():
                cupy.cuda.set_allocator(alloc)
                times[k].append(rate(pair, 200 if sz >= (64 << 20) else N))
        for k, v in times.items():
            print(f"cupy-probe{'-emm-first' if emm_first else ''}:{k} size={sz} us_per_pair={statistics.median(v):.2f}", flush=True)
    cupy.cuda.set_allocator(shipped)
    m = emm.Manager(device=0)
    stream = cupy.cuda.get_current_stream

    def parts_stream():
        stream().ptr

    def parts_emm():
        m.free(m.alloc(256, 0))

    for name, fn in (("get_current_stream", parts_stream), ("Manager.alloc+free", parts_emm)):
        print(f"cupy-probe:part:{name} size=256 us_per_pair={statistics.median(rate(fn) for _ in range(7)):.2f}")
    del spare


if __name__ == "__main__":
    main(sys.argv[1:] == ["emm-first"])
