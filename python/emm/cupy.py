"""CuPy through emm: ``emm.cupy.install()`` makes ``cupy.cuda.set_allocator`` use emm.

The manager is ``pool`` unless ``EMM_MEMORY_MANAGER`` names another. Each allocation
is ordered on CuPy's current stream and freed on it when CuPy drops
the memory. Importing this module does not import CuPy; ``install`` does.
"""

from ._lib import Manager, default_name

_managers = {}


class _Block:
    """Frees its block when the last CuPy array using it dies."""

    __slots__ = ("mgr", "ptr", "stream")

    def __init__(self, mgr, ptr, stream):
        self.mgr, self.ptr, self.stream = mgr, ptr, stream

    def __del__(self):
        try:
            self.mgr.free(self.ptr, self.stream)
        except Exception:  # interpreter shutdown
            pass


def allocator(size):
    """A CuPy allocator function: ``size`` bytes on the current device and stream."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    mgr = _managers.get(dev)
    if mgr is None:
        mgr = _managers[dev] = Manager(default_name(), dev)
    if size == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(0, 0, None, dev), 0)
    stream = cupy.cuda.get_current_stream().ptr
    ptr = mgr.alloc(size, stream)
    mem = cupy.cuda.UnownedMemory(ptr, size, _Block(mgr, ptr, stream), dev)
    return cupy.cuda.MemoryPointer(mem, 0)


def install():
    """Makes CuPy allocate through emm (``cupy.cuda.set_allocator``)."""
    import cupy

    cupy.cuda.set_allocator(allocator)
