"""Smoke test of emm_rmm_native.EmmMemoryResource (built by build.sh): allocations
through RMM land in emm, data round-trips (on a GPU), RMM's statistics adaptor
composes over it, out of memory is a MemoryError, memory is returned."""
import sys

import emm
import emm_rmm_native
import numpy
import rmm
import rmm.mr
from cuda.bindings import runtime

failures = 0


def check(ok, what):
    global failures
    print(f"{'PASS' if ok else 'FAIL'}: native: {what}", flush=True)
    failures += not ok


mr = emm_rmm_native.EmmMemoryResource(0)
m = emm.Manager(None, 0)
base = m.stats()
check(mr.device == 0 and mr.manager_name == m.name, f"EmmMemoryResource over emm's {mr.manager_name}")
err, count = runtime.cudaGetDeviceCount()
gpu = err == runtime.cudaError_t.cudaSuccess and count > 0
p = mr.allocate(1000)
check(m.stats()["allocations"] - base["allocations"] == 1 and p % 256 == 0, "mr.allocate goes to emm")
mr.deallocate(p, 1000)
if gpu:
    data = numpy.arange(1 << 20, dtype=numpy.uint8)
    b = rmm.DeviceBuffer(size=data.size, mr=mr)
    b.copy_from_host(data)
    check(numpy.array_equal(b.copy_to_host(), data), "DeviceBuffer round trip")
    del b
stats = rmm.mr.StatisticsResourceAdaptor(mr)
ptrs = [stats.allocate(s) for s in (10, 5000, 1 << 20)]
c = stats.allocation_counts
check(c.current_count == 3 and c.current_bytes == 10 + 5000 + (1 << 20), f"RMM's statistics over it: {c}")
for q, s in zip(ptrs, (10, 5000, 1 << 20)):
    stats.deallocate(q, s)
try:
    mr.allocate(1 << 50)
    check(False, "1 PiB: no error")
except MemoryError as e:
    check("EMM_ERR_OUT_OF_MEMORY" in str(e), f"1 PiB: MemoryError: {e}")
if gpu:
    runtime.cudaDeviceSynchronize()
check(m.stats()["allocated_bytes"] == base["allocated_bytes"], "memory returned")
print(f"native smoke: {'OK' if failures == 0 else f'FAILED ({failures})'}")
sys.exit(1 if failures else 0)
