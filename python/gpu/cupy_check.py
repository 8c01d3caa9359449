"""CuPy through emm: arrays created, computed on, freed, memory returned; through
``install()`` (CuPy's PythonFunctionAllocator) and through the plain allocator
function ``emm.cupy.allocator``."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
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


emm.cupy.install()
assert hasattr(cupy.cuda, "PythonFunctionAllocator"), "this CuPy lacks PythonFunctionAllocator"
check("install: PythonFunctionAllocator")
cupy.cuda.set_allocator(emm.cupy.allocator)
check("allocator function")
print("cupy_check: OK")
