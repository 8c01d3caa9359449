"""MemArray on a GPU from Python: the blog's test through DLPack (numpy fills the
pinned host mirror, CuPy adds each element's index sum on the device, numpy checks),
zero copy with torch and CuPy, writes visible across consumers, deleters counted."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
import cupy  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from emm.array import MemArray  # noqa: E402

checked = 0
for dtype in ("int32", "int64", "float32", "float64", "uint8"):
    for shape in ((1000,), (37, 41), (7, 11, 13)):
        a = MemArray(shape, dtype)
        exports = 0
        h = np.from_dlpack(a)
        exports += 1
        assert h.ctypes.data == a.data_ptr, "numpy sees the host mirror itself"
        base = (np.arange(h.size) % 97).reshape(shape)
        h[...] = base.astype(dtype)
        del h
        assert a.to_device() and not a.to_device(), "moved once, then an early exit"
        c = cupy.from_dlpack(a)
        exports += 1
        assert c.data.ptr == a.data_ptr, "CuPy sees the device copy itself"
        c += cupy.indices(shape).sum(axis=0).astype(c.dtype)
        cupy.cuda.Device().synchronize()
        del c
        a.to_host()
        got = np.from_dlpack(a)
        exports += 1
        want = (base + np.indices(shape).sum(axis=0)).astype(dtype)
        assert np.array_equal(got, want), (dtype, shape)
        del got
        assert a.deleters_run == exports, (a.deleters_run, exports)
        checked += 1

a = MemArray((256, 256), "float32")
a.to_device()
t = torch.from_dlpack(a)
assert t.data_ptr() == a.data_ptr, "torch sees the device copy itself"
t.fill_(5.0)
torch.cuda.synchronize()
c = cupy.from_dlpack(a)
assert float(c.sum()) == 5.0 * 256 * 256, "torch's write is visible to CuPy"
try:
    a.to_host()
    raise SystemExit("moving while exported must fail")
except Exception as e:  # EmmError: locked
    assert "locked" in str(e), e
del t, c
a.to_host()
assert a[10, 10] == 5.0
print(f"memarray_check: {checked} dtype/rank cases and the torch/CuPy zero-copy checks passed; OK")
