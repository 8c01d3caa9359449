"""CuPy through emm: ``emm.cupy.install()`` makes ``cupy.cuda.set_allocator`` use emm.

The manager is ``pool`` unless ``EMM_MEMORY_MANAGER`` names another. Each allocation
is ordered on CuPy's current stream and freed on it when CuPy drops
the memory. Importing this module does not import CuPy; ``install`` does.
"""

import sys

from ._lib import Manager, default_name

_managers = {}
# CuPy's functions, bound once by install(): the allocator runs per allocation.
_get_device = _current_stream = _Unowned = _Pointer = None


_finalizing = sys.is_finalizing


class _Block:
    """Frees its block when the last CuPy array using it dies.

    A failing free raises from ``__del__``, which Python reports through
    ``sys.unraisablehook`` (printed by default): not lost. At interpreter exit the
    library may already be unloaded, so blocks still alive are left to the driver,
    which frees them with the context.
    """

    __slots__ = ("mgr", "ptr", "stream")

    def __init__(self, mgr, ptr, stream):
        self.mgr, self.ptr, self.stream = mgr, ptr, stream

    def __del__(self):
        if not _finalizing():
            self.mgr.free(self.ptr, self.stream)


def allocator(size):
    """A CuPy allocator function: ``size`` bytes on the current device and stream."""
    if _get_device is None:
        _bind()
    dev = _get_device()
    mgr = _managers.get(dev)
    if mgr is None:
        mgr = _managers[dev] = Manager(default_name(), dev)
    if size == 0:
        return _Pointer(_Unowned(0, 0, None, dev), 0)
    stream = _current_stream().ptr
    ptr = mgr.alloc(size, stream)
    return _Pointer(_Unowned(ptr, size, _Block(mgr, ptr, stream), dev), 0)


def _bind():
    global _get_device, _current_stream, _Unowned, _Pointer
    import cupy

    _current_stream = cupy.cuda.get_current_stream
    _Unowned = cupy.cuda.UnownedMemory
    _Pointer = cupy.cuda.MemoryPointer
    _get_device = cupy.cuda.runtime.getDevice


def install():
    """Makes CuPy allocate through emm (``cupy.cuda.set_allocator``)."""
    import cupy

    _bind()
    cupy.cuda.set_allocator(allocator)
