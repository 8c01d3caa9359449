"""CuPy through emm: arrays created, computed on, freed, memory returned."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import emm  # noqa: E402
import emm.cupy  # noqa: E402
import cupy  # noqa: E402
import numpy  # noqa: E402

emm.cupy.install()
m = emm.Manager(device=0)
before = m.stats()["allocated_bytes"]
a = cupy.arange(1 << 20, dtype=cupy.float32)
b = cupy.ones((1 << 20,), dtype=cupy.float32) * 2
c = (a * b).sum()
assert float(c) == float(numpy.arange(1 << 20, dtype=numpy.float64).sum() * 2), float(c)
with cupy.cuda.Stream() as s:
    d = cupy.random.default_rng(0).standard_normal((1024, 1024), dtype=cupy.float32)
    e = d @ d.T
    s.synchronize()
during = m.stats()["allocated_bytes"]
assert during > before, (before, during)
ptr = a.data.ptr
del a, b, c, d, e
cupy.cuda.Device().synchronize()
after = m.stats()["allocated_bytes"]
print(f"cupy through emm ({m.name}): allocated bytes {before} -> {during} -> {after}")
assert after <= before + (1 << 20), "memory was returned"
x = cupy.empty(1 << 22, dtype=cupy.float32)
print("reused address:", x.data.ptr == ptr, "| stats:", m.stats())
print("cupy_check: OK")
