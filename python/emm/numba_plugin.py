"""A Numba EMM plugin (NBEP 7) whose device memory comes from emm.

Use it with ``NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin`` or
``numba.cuda.set_memory_manager(emm.numba_plugin.EmmNumbaManager)``.

- Device memory: emm's manager for the context's device (``pool`` unless
  ``emm.configure`` or ``EMM_MEMORY_MANAGER`` names another). Allocations made through Numba's
  synchronous API are ordered on the legacy default stream.
- Host memory: Numba's own ``HostOnlyCUDAMemoryManager`` (pinned, mapped, mempin).
- Managed memory (``memallocmanaged``, which ``cuda.managed_array`` calls; not in
  NBEP 7's list): emm's manager (``cuMemAllocManaged`` per request, never pooled,
  counted under ``emm.managed_*``), returned as Numba's own ``ManagedMemory`` with
  the same ownership as Numba's: the plugin's ``allocations`` holds it, the caller
  gets ``mem.own()``, and its free goes through Numba's pending-deallocation queue
  (so ``defer_cleanup`` holds it back) into ``Manager.free_managed``.
- ``get_ipc_handle``: Numba's legacy handle with the allocation base and the offset
  (``GetIpcHandleMixin``), so views into pooled blocks export correctly. For the
  pool, set ``EMM_POOL_EXPANDABLE=0`` (this module does so unless it is set): legacy
  IPC cannot export memory of the pool's expandable (virtual-memory) segment, nor
  of ``hostonly``'s stream-ordered pool.
- ``get_memory_info``: the device's free and total memory.
- ``reset``: Numba's host-memory reset, then the device manager gives its cache back.
- ``defer_cleanup``: Numba's (host frees); emm's device frees never synchronize, so
  nothing needs deferring there.

This module imports Numba: it is only imported by Numba itself, or by a user who
uses Numba. ``import emm`` alone does not import it.
"""

from __future__ import annotations

import ctypes
import os
import sys
import weakref
from typing import Any, Callable, Optional

os.environ.setdefault("EMM_POOL_EXPANDABLE", "0")

from ._require import missing  # noqa: E402

try:
    from numba import cuda
    from numba.cuda import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer
    from numba.cuda.cudadrv import driver as _driver
    from numba.cuda.cudadrv.driver import ManagedMemory, ManagedOwnedPointer
except ImportError as _e:
    raise missing("numba", "emm.numba_plugin", _e) from _e

from ._lib import Manager, OutOfMemoryError  # noqa: E402


# The pointer type MemoryPointer keeps: the NVIDIA binding's CUdeviceptr where this
# numba-cuda uses that binding (made directly, it skips a conversion per
# allocation), else ctypes.c_void_p (which MemoryPointer accepts in every version).
if getattr(_driver, "USE_NV_BINDING", True) and hasattr(getattr(_driver, "binding", None), "CUdeviceptr"):
    _device_pointer = _driver.binding.CUdeviceptr
else:
    _device_pointer = ctypes.c_void_p
_finalizing = sys.is_finalizing


class EmmMemoryPointer(MemoryPointer):
    """A ``MemoryPointer`` whose block goes back to emm when the object dies.

    Numba's ``MemoryPointer`` ties its finalizer to the object with
    ``weakref.finalize``, which registers every allocation in a global table and
    costs several microseconds per allocate+free pair. This subclass frees in
    ``__del__`` instead: the same moment (the last reference goes), without the
    table. ``free()`` frees at once, as Numba's does; freeing twice raises.
    At interpreter exit, blocks still alive are left to the driver (which frees
    them with the context) rather than freed one by one.
    """

    def __init__(self, context: Any, ptr: int, size: int, free: Callable[[int], None]) -> None:
        super().__init__(context, _device_pointer(ptr), size)
        self.is_managed = True
        self._emm_ptr = ptr
        self._emm_free = free

    def free(self) -> None:
        """Gives the block back now; the object must not be used afterwards."""
        ptr = self._emm_ptr
        if ptr is None:
            raise RuntimeError("Freeing dead memory")
        self._emm_ptr = None
        self._emm_free(ptr)

    def __del__(self) -> None:
        # A failing free is reported by Python's unraisable hook, not lost. At
        # interpreter exit the library may already be unloaded: leave it.
        ptr = self._emm_ptr
        if ptr is not None and not _finalizing():
            self._emm_ptr = None
            self._emm_free(ptr)


def _managed_finalizer(allocations: Any, deallocations: Any, ptr: int, size: int,
                       free: Callable[[int], None]) -> Callable[[], None]:
    """What Numba's ``_alloc_finalizer`` does for its managed memory, with emm's
    free: forget the allocation, then queue its free (``dtor(handle)``), which
    Numba's ``defer_cleanup`` holds back."""

    def core() -> None:
        if allocations:
            allocations.pop(ptr, None)
        deallocations.add_item(free, ptr, size)

    return core


class EmmNumbaManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """Numba's memory manager interface (version 1) over emm."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Numba's constructor arguments (the context)."""
        super().__init__(*args, **kwargs)
        self._emm: Optional[Manager] = None

    def initialize(self) -> None:
        """Opens emm's manager of the context's device (once; Numba calls this on
        every context push)."""
        # Called on every context push: cheap after the first time.
        if self._emm is None and self.context is not None:
            dev = self.context.device
            # Numba's Device has .id; a third-party (attached) context may carry the
            # driver binding's CUdevice, which converts to its ordinal.
            ordinal = dev.id if hasattr(dev, "id") else int(dev)
            self._emm = Manager(None, ordinal)  # the process's manager: pool unless configured

    def memalloc(self, size: int) -> EmmMemoryPointer:
        """``size`` bytes of device memory, ordered on the legacy default stream."""
        emm = self._emm
        if emm is None:
            self.initialize()
            emm = self._emm
        return EmmMemoryPointer(self.context, emm.alloc(size), size, emm.free)

    def memallocmanaged(self, size: int, attach_global: bool) -> Any:
        """``size`` bytes of managed memory from emm, as Numba returns its own:
        ``ManagedMemory(...).own()``, a buffer the host and every device use.
        ``attach_global``: accessible from any stream on any device (else attached
        to the host)."""
        emm = self._emm
        if emm is None:
            self.initialize()
            emm = self._emm
        try:
            ptr = emm.alloc_managed(size, attach_global=attach_global)
        except OutOfMemoryError:
            # As Numba's own managers do (`_attempt_allocation`): run the frees its
            # queue still holds (clear() runs none under defer_cleanup), then try
            # once more.
            self.deallocations.clear()
            ptr = emm.alloc_managed(size, attach_global=attach_global)
        ctx = weakref.proxy(self.context)
        if not ptr:
            # Zero bytes: nothing to free and nothing to track; the owned pointer
            # holds the memory object itself (Numba's holds a weak proxy to an
            # object its allocations table keeps alive).
            return ManagedOwnedPointer(ManagedMemory(ctx, _device_pointer(0), 0))
        finalizer = _managed_finalizer(self.allocations, self.deallocations, ptr, size,
                                       emm.free_managed)
        try:
            mem = ManagedMemory(ctx, _device_pointer(ptr), size, finalizer=finalizer)
        except BaseException:
            emm.free_managed(ptr)
            raise
        self.allocations[ptr] = mem
        return mem.own()

    def get_memory_info(self) -> Any:
        """The device's free and total bytes (Numba's ``MemoryInfo``)."""
        self.initialize()
        free, total = self._emm.memory_info()
        return MemoryInfo(free=free, total=total)

    def reset(self) -> None:
        """Numba's host-memory reset, then emm gives its cached device memory back."""
        super().reset()
        if self._emm is not None:
            self._emm.trim()

    @property
    def interface_version(self) -> int:
        """NBEP 7's interface version: 1."""
        return 1


_numba_memory_manager = EmmNumbaManager
