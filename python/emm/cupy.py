"""CuPy through emm: ``emm.cupy.install()`` makes ``cupy.cuda.set_allocator`` use emm.

The manager is the process's (``pool`` unless ``emm.configure`` or
``EMM_MEMORY_MANAGER`` names another). Each allocation
is ordered on CuPy's current stream and freed on that same stream when CuPy drops
the memory. Importing this module does not import CuPy; ``install`` does.

``install`` hands CuPy a ``cupy.cuda.PythonFunctionAllocator`` over ``malloc`` and
``free`` below, so CuPy builds its memory objects itself and calls Python only for
the two emm calls. Where that class is missing (old CuPy) it installs
``allocator``, a plain allocator function, instead.

CuPy's C-function hook (``cupy.cuda.CFunctionAllocator``, which would skip Python on
every allocation) is not used, for two reasons read in CuPy's ``memory.pyx``: its
``malloc(param, size, device_id)`` is given no stream, so emm could only order memory
on the legacy default stream (unsafe with CuPy's non-blocking streams); and its
result is not checked, so a failed allocation (NULL) would become a zero pointer
CuPy goes on to use instead of an ``OutOfMemoryError``.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Dict, Optional

from ._lib import Manager

__all__ = ["allocator", "free", "install", "malloc"]

_managers: Dict[int, Any] = {}
# CuPy's functions, bound once by install(): the allocator runs per allocation.
_get_device: Optional[Callable[[], int]] = None
_current_stream: Optional[Callable[[], Any]] = None
_Unowned: Any = None
_Pointer: Any = None


_finalizing = sys.is_finalizing


class _Block:
    """Frees its block when the last CuPy array using it dies.

    A failing free raises from ``__del__``, which Python reports through
    ``sys.unraisablehook`` (printed by default): not lost. At interpreter exit the
    library may already be unloaded, so blocks still alive are left to the driver,
    which frees them with the context.
    """

    __slots__ = ("mgr", "ptr", "stream")

    def __init__(self, mgr: Any, ptr: int, stream: int) -> None:
        self.mgr, self.ptr, self.stream = mgr, ptr, stream

    def __del__(self) -> None:
        if not _finalizing():
            self.mgr.free(self.ptr, self.stream)


def _manager(dev: int) -> Any:
    mgr = _managers.get(dev)
    if mgr is None:
        mgr = _managers[dev] = Manager(None, dev)
    return mgr


def malloc(size: int, device_id: int) -> int:
    """``PythonFunctionAllocator``'s malloc: ``size`` bytes (> 0) on device
    ``device_id``, ordered on CuPy's current stream; returns the address."""
    if _current_stream is None:
        _bind()
    assert _current_stream is not None
    return _manager(device_id).alloc(size, _current_stream().ptr)


def free(ptr: int, device_id: int) -> None:
    """``PythonFunctionAllocator``'s free: the block goes back on the stream it was
    allocated on. A failure raises (CuPy reports it as unraisable); at interpreter
    exit nothing is done (the driver frees the memory with the context)."""
    if not _finalizing():
        _managers[device_id].free(ptr)


def allocator(size: int) -> Any:
    """A CuPy allocator function: ``size`` bytes on the current device and stream."""
    if _get_device is None:
        _bind()
    assert _get_device is not None and _current_stream is not None
    dev = _get_device()
    mgr = _manager(dev)
    if size == 0:
        return _Pointer(_Unowned(0, 0, None, dev), 0)
    stream = _current_stream().ptr
    ptr = mgr.alloc(size, stream)
    return _Pointer(_Unowned(ptr, size, _Block(mgr, ptr, stream), dev), 0)


def _bind() -> None:
    global _get_device, _current_stream, _Unowned, _Pointer
    import cupy

    _current_stream = cupy.cuda.get_current_stream
    _Unowned = cupy.cuda.UnownedMemory
    _Pointer = cupy.cuda.MemoryPointer
    _get_device = cupy.cuda.runtime.getDevice


def install() -> None:
    """Makes CuPy allocate through emm (``cupy.cuda.set_allocator``).

    Also makes CuPy's current device current on the calling thread
    (``cupy.cuda.Device().use()``, which CuPy's first kernel would do anyway): on a
    thread without a current CUDA context, the runtime calls CuPy makes for every
    allocation (the device and stream lookups) take microseconds instead of tens of
    nanoseconds. CuPy's own pool gets this as a side effect of its first
    ``cudaMalloc``; emm allocates through the driver, so it is done here. Other
    threads get it from their first kernel, or from ``cupy.cuda.Device().use()``.
    """
    import cupy

    _bind()
    cupy.cuda.Device().use()
    pfa = getattr(cupy.cuda, "PythonFunctionAllocator", None)
    if pfa is not None:
        cupy.cuda.set_allocator(pfa(malloc, free).malloc)
    else:
        cupy.cuda.set_allocator(allocator)
