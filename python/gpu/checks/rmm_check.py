"""emm as RMM's memory resource from Python, on a GPU (``emm.rmm.install()``):
``rmm.DeviceBuffer`` of several sizes on the default and a created stream with data
written and read back; CuPy through ``rmm.allocators.cupy.rmm_cupy_allocator`` with
a computation checked against NumPy; RMM's ``StatisticsResourceAdaptor`` over emm
beside emm's own counters; out of memory as ``MemoryError``; ``uninstall()``;
memory returned (emm's allocated bytes back to where they began). One PASS/FAIL
line per check; exit status 1 on any failure.

Usage (repository root, GPU machine; python/gpu/checks/rmm_check.sh sets this up):
  EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=/tmp/site:python python3 python/gpu/checks/rmm_check.py
"""
import gc
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
import emm  # noqa: E402
import emm.rmm  # noqa: E402

failures = 0


def check(ok, what):
    global failures
    print(f"{'PASS' if ok else 'FAIL'}: {what}", flush=True)
    if not ok:
        failures += 1


def main():
    assert "rmm" not in sys.modules, "importing emm.rmm imported rmm"
    import numpy
    import rmm
    import rmm.mr
    from rmm.pylibrmm.stream import Stream

    print(f"rmm {rmm.__version__}, numpy {numpy.__version__}, emm library {emm.library_path()}")
    m = emm.Manager(None, 0)
    base = m.stats()
    print(f"manager: {m.name}; allocated at the start: {base['allocated_bytes']} bytes")
    previous = rmm.mr.get_current_device_resource()
    mr = emm.rmm.install()
    check(rmm.mr.get_current_device_resource() is mr, "install(): emm's resource is RMM's current device resource")
    check(emm.rmm.install() is mr, "install() again returns the resource in place")

    from cuda.bindings import runtime

    def allocated():
        # Frees are stream-ordered: the hostonly manager's counter (its CUDA memory
        # pool's used bytes) drops when they run, so wait for the device first.
        runtime.cudaDeviceSynchronize()
        return m.stats()["allocated_bytes"] - base["allocated_bytes"]

    def rounded(emm_bytes, asked, count):
        # The pool rounds every block up to 512 bytes; the other managers are only
        # checked for counting at least what was asked.
        if m.name == "pool":
            return asked <= emm_bytes <= asked + 512 * count
        return asked <= emm_bytes

    # 1. DeviceBuffer: sizes, data round trip, default and created streams.
    rng = numpy.random.default_rng(0)
    sizes = [1, 255, 256, 4097, 1 << 20, (3 << 20) + 5, 64 << 20]
    n0 = m.stats()["allocations"]
    bufs, datas = [], []
    for s in sizes:
        data = rng.integers(0, 256, size=s, dtype=numpy.uint8)
        b = rmm.DeviceBuffer(size=s)
        b.copy_from_host(data)
        bufs.append(b)
        datas.append(data)
    check(m.stats()["allocations"] - n0 == len(sizes), f"{len(sizes)} DeviceBuffers allocated through emm")
    check(all(b.ptr % 256 == 0 for b in bufs), "every DeviceBuffer is 256-byte aligned")
    check(allocated() >= sum(sizes), f"emm counts their bytes ({allocated()} >= {sum(sizes)})")
    same = [numpy.array_equal(b.copy_to_host(), d) for b, d in zip(bufs, datas)]
    check(all(same), f"copy_from_host / copy_to_host round trip of {sizes}")
    check(bufs[3].tobytes() == datas[3].tobytes(), "tobytes() of 4097 bytes")
    n1 = m.stats()["allocations"]
    d = rmm.DeviceBuffer.to_device(datas[4].tobytes())
    check(d.tobytes() == datas[4].tobytes() and m.stats()["allocations"] == n1 + 1,
          "DeviceBuffer.to_device through emm")
    stream = Stream()
    sb = rmm.DeviceBuffer(size=5 << 20, stream=stream)
    payload = rng.integers(0, 256, size=5 << 20, dtype=numpy.uint8)
    sb.copy_from_host(payload, stream=stream)
    back = sb.copy_to_host(stream=stream)
    stream.synchronize()
    check(numpy.array_equal(back, payload), "a DeviceBuffer on a created stream round-trips")
    c = sb.copy()
    check(c.tobytes(stream=stream) == payload.tobytes(), "DeviceBuffer.copy() through emm")
    z = rmm.DeviceBuffer(size=0)
    check(z.size == 0, "a zero-byte DeviceBuffer")
    del bufs, datas, b, d, sb, c, z
    gc.collect()
    stream.synchronize()
    check(allocated() == 0, f"DeviceBuffers freed: emm's allocated bytes back ({allocated()} above the start)")

    # 2. CuPy through RMM's allocator over emm.
    try:
        import cupy
    except ImportError as e:
        print(f"SKIP: CuPy does not import ({e})")
        cupy = None
    if cupy is not None:
        import rmm.allocators.cupy

        cupy.cuda.set_allocator(rmm.allocators.cupy.rmm_cupy_allocator)
        n1 = m.stats()["allocations"]
        a = cupy.arange(1 << 20, dtype=cupy.float32)
        b = cupy.ones((1 << 20,), dtype=cupy.float32) * 2
        total = float((a * b).sum())
        expect = float(numpy.arange(1 << 20, dtype=numpy.float64).sum() * 2)
        check(total == expect, f"CuPy (a * b).sum() over emm: {total} == {expect}")
        with cupy.cuda.Stream(non_blocking=True) as s:
            x = cupy.random.default_rng(1).standard_normal((1024, 1024), dtype=cupy.float32)
            y = x @ x.T
            hx = cupy.asnumpy(x)
            ok = numpy.allclose(cupy.asnumpy(y), hx @ hx.T, rtol=1e-3, atol=1e-2)
            del x, y
        s.synchronize()
        check(ok, "CuPy matmul on a non-blocking stream over emm matches NumPy")
        check(m.stats()["allocations"] - n1 >= 3, f"CuPy allocated through emm ({m.stats()['allocations'] - n1})")
        del a, b
        cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
        gc.collect()
        cupy.cuda.runtime.deviceSynchronize()
        check(allocated() == 0, f"CuPy arrays freed: emm's allocated bytes back ({allocated()} above the start)")

    # 3. RMM's statistics adaptor over emm, against emm's counters.
    stats = rmm.mr.StatisticsResourceAdaptor(mr)
    rmm.mr.set_current_device_resource(stats)
    n2 = m.stats()["allocations"]
    bufs = [rmm.DeviceBuffer(size=s) for s in sizes]
    st = stats.allocation_counts
    emm_bytes, emm_count = allocated(), m.stats()["allocations"] - n2
    print(f"  RMM statistics: {st}; emm: {emm_bytes} bytes (rounded), {emm_count} allocations")
    check(st.current_bytes == sum(sizes) and st.current_count == len(sizes) and st.total_count == len(sizes),
          "RMM's statistics count every request")
    check(emm_count == len(sizes), "emm served each of them")
    check(rounded(emm_bytes, sum(sizes), len(sizes)),
          "emm's allocated bytes are RMM's, each rounded up (pool: by less than 512)")
    del bufs
    gc.collect()
    st = stats.allocation_counts
    check(st.current_bytes == 0 and st.current_count == 0 and st.peak_bytes == sum(sizes),
          f"after the frees: RMM's current 0, peak {st.peak_bytes}")
    check(allocated() == 0, f"after the frees: emm's allocated bytes back ({allocated()} above the start)")
    rmm.mr.set_current_device_resource(mr)

    # 4. Out of memory reaches RMM's caller as MemoryError with emm's message.
    try:
        rmm.DeviceBuffer(size=1 << 50)
        check(False, "1 PiB DeviceBuffer: no error")
    except MemoryError as e:
        check("EMM_ERR_OUT_OF_MEMORY" in str(e), f"1 PiB DeviceBuffer: MemoryError: {e}")
    ok = rmm.DeviceBuffer(size=4096)
    check(ok.size == 4096, "emm serves again after out of memory")
    del ok

    # 5. uninstall(): RMM's previous resource again; emm's buffers stay valid.
    keep = rmm.DeviceBuffer(size=1 << 20)
    keep.copy_from_host(numpy.full(1 << 20, 7, dtype=numpy.uint8))
    emm.rmm.uninstall()
    check(rmm.mr.get_current_device_resource() is previous, "uninstall(): RMM's previous resource is back")
    n3 = m.stats()["allocations"]
    other = rmm.DeviceBuffer(size=1 << 20)
    check(m.stats()["allocations"] == n3, "after uninstall() RMM no longer allocates through emm")
    check(keep.tobytes()[-1] == 7, "a buffer from before uninstall() is still valid")
    del keep, other
    gc.collect()
    with emm.rmm.using() as inner:
        check(rmm.mr.get_current_device_resource() is inner, "using(): emm inside the block")
        t = rmm.DeviceBuffer(size=1000)
        del t
    check(rmm.mr.get_current_device_resource() is previous, "using(): the previous resource after the block")

    gc.collect()
    runtime.cudaDeviceSynchronize()
    end = m.stats()
    print(f"emm at the end: allocated {end['allocated_bytes']} bytes, reserved {end['reserved_bytes']} bytes, "
          f"{end['allocations'] - base['allocations']} allocations served")
    check(end["allocated_bytes"] == base["allocated_bytes"], "memory returned: emm's allocated bytes back to the start")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # a crash is a failure, with its traceback
        import traceback

        traceback.print_exc()
        check(False, f"rmm_check raised {type(e).__name__}: {e}")
    print(f"rmm_check: {'OK' if failures == 0 else f'FAILED ({failures})'}")
    sys.exit(1 if failures else 0)
