"""This process's memory on its GPU as the device counts it (NVML's list of the
processes on a device), for train_bench.py under --turn-fds: with other processes
on the same GPU, `cuMemGetInfo` counts theirs too.

NVML through ctypes (libnvidia-ml.so.1 ships with the driver), so nothing more is
installed on the GPU machine.
"""
import ctypes
import os
import sys


class _ProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t as nvmlDeviceGetComputeRunningProcesses_v3 fills it.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


# NVML's usedGpuMemory when it cannot say (NVML_VALUE_NOT_AVAILABLE).
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF


class OwnMemory:
    """Reads the bytes NVML counts for this process on the GPU whose UUID is given
    (`torch.cuda.get_device_properties(dev).uuid`). `read()` gives None where NVML
    cannot say: no library or entry point, a call refused, a figure not available,
    or this process not in the list (a driver that lists processes by the host's
    process ids in a container; the first such miss is written to stderr with the
    ids listed)."""

    def __init__(self, uuid):
        self.query = None
        self.device = ctypes.c_void_p()
        self.told = False
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            query = lib.nvmlDeviceGetComputeRunningProcesses_v3
            if lib.nvmlInit_v2() != 0:
                return
            name = f"GPU-{uuid}" if not str(uuid).startswith("GPU-") else str(uuid)
            if lib.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(self.device)) != 0:
                return
            self.query = query
        except (OSError, AttributeError):
            self.query = None

    def read(self):
        if self.query is None:
            return None
        count = ctypes.c_uint(64)
        infos = (_ProcessInfo * 64)()
        if self.query(self.device, ctypes.byref(count), infos) != 0:
            return None
        me = os.getpid()
        listed = infos[:min(count.value, 64)]
        for info in listed:
            if info.pid == me:
                return None if info.usedGpuMemory == NOT_AVAILABLE else info.usedGpuMemory
        if not self.told:
            self.told = True
            print(f"own_memory: process {me} is not among those NVML lists on the device "
                  f"({[i.pid for i in listed]}); its device-used peak is not read", file=sys.stderr)
        return None
