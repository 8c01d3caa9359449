"""CuPy through emm: arrays created, computed on, freed, memory returned; through
``install()``'s C path (CuPy's CFunctionAllocator over emm's C functions), its
Python path (PythonFunctionAllocator) and the plain allocator function
``emm.cupy.allocator``; out of memory raised as emm's OutOfMemoryError (a
MemoryError) with the numbers, on both paths."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
import emm  # noqa: E402
import emm.cupy  # noqa: E402
import cupy  # noqa: E402
import numpy  # noqa: E402


def check(how):
    m = emm.Manager(device=0)
    before = m.stats()["allocated_bytes"]
    z = cupy.empty(0, dtype=cupy.float32)  # no allocation behind it
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    b = cupy.ones((1 << 20,), dtype=cupy.float32) * 2
    c = (a * b).sum()
    assert float(c) == float(numpy.arange(1 << 20, dtype=numpy.float64).sum() * 2), float(c)
    with cupy.cuda.Stream(non_blocking=True) as s:
        d = cupy.random.default_rng(0).standard_normal((1024, 1024), dtype=cupy.float32)
        e = d @ d.T
        assert abs(float(e[5, 5]) - float((d[5] * d[5]).sum())) < 1e-2
        del d, e  # freed on s, the stream they were allocated on
    s.synchronize()
    during = m.stats()["allocated_bytes"]
    assert during > before, (before, during)
    ptr = a.data.ptr
    del a, b, c, z
    cupy.cuda.Device().synchronize()
    after = m.stats()["allocated_bytes"]
    print(f"cupy through emm ({how}, {m.name}): allocated bytes {before} -> {during} -> {after}")
    # Everything but what CuPy's libraries may keep (a cuBLAS workspace) came back.
    assert after <= before + (1 << 20), "memory was not returned"
    x = cupy.empty(1 << 22, dtype=cupy.float32)
    print("  reused address:", x.data.ptr == ptr, "| stats:", m.stats())
    del x


def out_of_memory(how):
    huge = 1 << 52  # 4 PiB: more than any device
    try:
        cupy.empty(huge, dtype=cupy.uint8)
    except emm.OutOfMemoryError as e:
        assert isinstance(e, MemoryError)
        assert e.requested == huge and e.total > 0, (e.requested, e.free, e.total)
        print(f"  out of memory ({how}): {type(e).__name__}: requested {e.requested}, "
              f"free {e.free} of {e.total}")
    else:
        raise AssertionError(f"{how}: a 4 PiB array was allocated")


path = emm.cupy.install()
assert path == "c", f"install() took the {path} path"
check("install: CFunctionAllocator, emm's C functions")
out_of_memory("C path")
assert emm.cupy.install(path="python") == "python"
assert hasattr(cupy.cuda, "PythonFunctionAllocator"), "this CuPy lacks PythonFunctionAllocator"
check("install: PythonFunctionAllocator")
out_of_memory("Python path")
cupy.cuda.set_allocator(emm.cupy.allocator)
check("allocator function")
print("cupy_check: OK")
