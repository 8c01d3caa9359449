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
- ``get_ipc_handle``: a block of the pool's expandable (virtual-memory) segment,
  which legacy CUDA IPC cannot export, gives an :class:`EmmIpcHandle`: emm's
  handle bytes (the exporting process's id and the file descriptors of the
  block's physical pieces), which the receiving process opens through emm
  (``pidfd_getfd``, then the pieces mapped at addresses of its own; Linux 5.6+
  and ptrace permission over the exporter, as a process of the same user
  normally has). It pickles, and ``IpcArrayHandle`` opens and closes it as
  Numba's own. The plugin configures ``pool_exportable`` before its first manager
  (:func:`ask_exportable`; ``EMM_POOL_EXPORTABLE`` wins when set), so that the
  pool creates those pieces exportable, and keeps the expandable segment
  (and its steady state near live memory) on. Every other block (the pool's small
  segments, the ``default`` manager's allocations) gets Numba's legacy handle
  with the allocation base and the offset (``GetIpcHandleMixin``), so views into
  pooled blocks export correctly. Consumers that call ``cuIpcOpenMemHandle``
  themselves need legacy handles for every block: set ``EMM_POOL_EXPANDABLE=0``
  (or ``emm.configure(expandable=False)``) before the first allocation; the pool
  then uses plain ``cuMemAlloc`` segments (more reserved memory at steady
  state: 1.04-1.58 times live on the repository's recorded traces, set by the
  first steps' placement; ``EMM_POOL_INITIAL_SIZE`` from a previous run, which
  ``emm replay TRACE --initial-size`` names from a recorded trace, held them
  at 1.15). As with legacy IPC, the exporter keeps the block alive while another
  process uses it. ``hostonly``'s stream-ordered pool exports no legacy handle
  either (its blocks raise).
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
import warnings
import weakref
from typing import Any, Callable, Optional

from ._require import missing  # noqa: E402

try:
    from numba import cuda
    from numba.cuda import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer
    from numba.cuda.cudadrv import driver as _driver
    from numba.cuda.cudadrv.driver import IpcHandle, ManagedMemory, ManagedOwnedPointer
except ImportError as _e:
    raise missing("numba", "emm.numba_plugin", _e) from _e

from ._lib import EmmError, EmmWarning, Manager, OutOfMemoryError, configure  # noqa: E402


def ask_exportable() -> None:
    """Blocks of the pool's expandable segment export by file descriptor only when
    its pieces are created exportable (see ``get_ipc_handle`` below): asks for that
    in code before the plugin's first manager, unless ``EMM_POOL_EXPORTABLE`` says
    otherwise (the environment wins). When the pool already serves without it
    (another framework made it first), IPC of its expandable blocks will be refused
    with an error that says so; a warning says it now."""
    if os.environ.get("EMM_POOL_EXPORTABLE", "").strip():
        return
    try:
        configure(pool_exportable=True)
    except EmmError as e:
        warnings.warn(f"emm.numba_plugin: the pool was created before the plugin, without exportable "
                      f"pieces; IPC handles of its expandable blocks will be refused ({e})", EmmWarning,
                      stacklevel=3)


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


# The kind byte of emm's handle bytes (after the "EMMIPC" magic and the format
# version) that names virtual memory exported by file descriptor.
_EMM_MAGIC = b"EMMIPC"
_EMM_KIND_VMM = 3


def _emm_manager_of(context: Any) -> Manager:
    """emm's manager of ``context``'s device: the plugin's own where Numba uses it."""
    mm = getattr(context, "memory_manager", None)
    emm = getattr(mm, "_emm", None)
    if isinstance(emm, Manager):
        return emm
    dev = context.device
    return Manager(None, dev.id if hasattr(dev, "id") else int(dev))


def _address(memory: Any) -> int:
    """The device address of a Numba ``MemoryPointer`` as an int (its handle is
    the binding's ``CUdeviceptr``, or a ``ctypes.c_void_p``)."""
    handle = memory.handle
    try:
        return int(handle)
    except TypeError:
        return handle.value or 0


class EmmIpcHandle(IpcHandle):
    """Numba's ``IpcHandle`` for memory emm exports itself (a block of the pool's
    expandable segment): it carries emm's handle bytes, and opening it maps the
    exporter's memory through emm (``Manager.ipc_open``) instead of
    ``cuIpcOpenMemHandle``; emm stages it through a buffer of its own when the
    memory lives on another device. ``offset`` is the range's offset in its
    block (informational: the opened pointer already points at the range)."""

    def __init__(self, base: Any, emm_handle: bytes, size: int, source_info: Any = None,
                 offset: int = 0) -> None:
        super().__init__(base, None, size, source_info=source_info, offset=offset)
        self.emm_handle = bytes(emm_handle)
        self._emm_opened: Optional[tuple] = None

    def open(self, context: Any) -> MemoryPointer:
        """Maps the exporter's memory in ``context`` (another process than the
        exporter's); returns a ``MemoryPointer`` of ``size`` bytes."""
        if self.base is not None:
            raise ValueError("opening IpcHandle from original process")
        if self._emm_opened is not None:
            raise ValueError("IpcHandle is already opened")
        emm = _emm_manager_of(context)
        ptr = emm.ipc_open(self.emm_handle)
        self._emm_opened = (emm, ptr)
        return MemoryPointer(weakref.proxy(context), _device_pointer(ptr), self.size)

    # Numba's direct and staged openings are both emm's open here.
    open_direct = open
    open_staged = open

    def close(self) -> None:
        """Unmaps what :meth:`open` mapped. A close the driver refuses raises and
        leaves the handle opened, to be closed again (the memory may be partly
        unmapped: do not use it)."""
        if self._emm_opened is None:
            raise ValueError("IpcHandle not opened")
        emm, ptr = self._emm_opened
        emm.ipc_close(ptr)
        self._emm_opened = None

    def __reduce__(self) -> Any:
        return (_rebuild_emm_ipc_handle, (self.emm_handle, self.size, self.source_info, self.offset))


def _rebuild_emm_ipc_handle(emm_handle: bytes, size: int, source_info: Any, offset: int) -> EmmIpcHandle:
    """Unpickles an :class:`EmmIpcHandle` (without the exporter's reference)."""
    return EmmIpcHandle(None, emm_handle, size, source_info=source_info, offset=offset)


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
            ask_exportable()
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

    def get_ipc_handle(self, memory: Any) -> IpcHandle:
        """An IPC handle of ``memory`` (a block or a view into one): an
        :class:`EmmIpcHandle` for a block of the pool's expandable segment, else
        Numba's legacy handle (see the module docs)."""
        owner = getattr(memory, "owner", None) or memory
        base = getattr(owner, "_emm_ptr", None)
        emm = self._emm
        if base is not None and emm is not None:
            ptr = _address(memory)
            data = emm.ipc_export(base, ptr - base, memory.size)
            if data[:6] == _EMM_MAGIC and len(data) > 7 and data[7] == _EMM_KIND_VMM:
                source_info = self.context.device.get_device_identity()
                return EmmIpcHandle(memory, data, memory.size, source_info=source_info,
                                    offset=ptr - base)
        return super().get_ipc_handle(memory)

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
