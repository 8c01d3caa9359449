"""This process's memory on its GPU as the device counts it (NVML's list of the
processes on a device), for train_bench.py under --turn-fds: with other processes
on the same GPU, `cuMemGetInfo` counts theirs too.

NVML through ctypes (libnvidia-ml.so.1 ships with the driver), so nothing more is
installed on the GPU machine.
"""
import ctypes
import os


class _ProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t as nvmlDeviceGetComputeRunningProcesses_v3 fills it.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class OwnMemory:
    """Reads the bytes NVML counts for this process on the GPU whose UUID is given
    (`torch.cuda.get_device_properties(dev).uuid`). `read()` gives None where NVML
    cannot say (no library, a call refused, the process not listed)."""

    def __init__(self, uuid):
        self.lib = None
        self.device = ctypes.c_void_p()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            name = f"GPU-{uuid}" if not str(uuid).startswith("GPU-") else str(uuid)
            if lib.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(self.device)) != 0:
                return
            self.lib = lib
        except (OSError, AttributeError):
            self.lib = None

    def read(self):
        if self.lib is None:
            return None
        count = ctypes.c_uint(64)
        infos = (_ProcessInfo * 64)()
        if self.lib.nvmlDeviceGetComputeRunningProcesses_v3(self.device, ctypes.byref(count), infos) != 0:
            return None
        me = os.getpid()
        for info in infos[:count.value]:
            if info.pid == me:
                return info.usedGpuMemory
        return None
