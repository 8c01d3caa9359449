"""CuPy through emm: ``emm.cupy.install()`` makes ``cupy.cuda.set_allocator`` use emm.

The manager is the process's (``pool`` unless ``emm.configure`` or
``EMM_MEMORY_MANAGER`` names another). Each allocation
is ordered on CuPy's current stream and freed on that same stream when CuPy drops
the memory. Importing this module does not import CuPy; ``install`` does.

``install`` hands CuPy emm's C functions through ``cupy.cuda.memory.CFunctionAllocator``,
so an allocation runs no Python code of emm's: ``emm_cupy_malloc`` reads CuPy's
current stream through the C function behind
``cupy_backends.cuda.stream.get_current_stream_ptr`` (which Cython exports in the
module's ``__pyx_capi__``) and, on failure, raises :class:`~emm.OutOfMemoryError` (a
``MemoryError``) or :class:`~emm.EmmError` through CPython's ``PyErr_SetString``,
returning -1, the value on which CuPy's ``_call_malloc`` checks for an exception.
``install`` proves that CuPy propagates that exception (one allocation for a device
that does not exist, which raises without touching memory) before it commits to
the C path. Where any of this is missing (an older CuPy, another Python) it falls
back to ``cupy.cuda.PythonFunctionAllocator`` over ``malloc`` and ``free`` below, and
on CuPy without that class to ``allocator``, a plain allocator function; it warns
when it falls back and returns which path it took.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
import threading
import warnings
from typing import Any, Callable, Dict, Optional

from ._lib import EMM_ERR_OTHER, EMM_OK, EmmError, Manager, OutOfMemoryError, load
from ._require import require

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


_managers_lock = threading.Lock()


def _manager(dev: int) -> Any:
    """The device's one manager handle, made at its first use. Made under a
    lock: two handles made by threads racing to a device's first allocation
    would leave one unreferenced, and its collection would free the blocks it
    gave CuPy while CuPy used them."""
    mgr = _managers.get(dev)
    if mgr is None:
        with _managers_lock:
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
    cupy = require("cupy", "emm.cupy")

    _current_stream = cupy.cuda.get_current_stream
    _Unowned = cupy.cuda.UnownedMemory
    _Pointer = cupy.cuda.MemoryPointer
    _get_device = cupy.cuda.runtime.getDevice


class _COutOfMemoryError(OutOfMemoryError):
    """Out of memory in ``emm_cupy_malloc``: the library raises it with its message;
    the numbers come from the calling thread's last failure (``emm_last_oom``)."""

    def __init__(self, message: str) -> None:
        lib = load()
        r, f, t = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        found = lib.emm_last_oom(ctypes.byref(r), ctypes.byref(f), ctypes.byref(t)) == EMM_OK
        super().__init__(message, *((r.value, f.value, t.value) if found else (0, 0, 0)))


class _CError(EmmError):
    """Another failure in ``emm_cupy_malloc``; the code is the calling thread's last
    (``emm_last_error_code``)."""

    def __init__(self, message: str) -> None:
        code = load().emm_last_error_code()
        super().__init__(code if code != EMM_OK else EMM_ERR_OTHER, message)


def _current_stream_function() -> Optional[int]:
    """The address of CuPy's C function ``intptr_t get_current_stream_ptr(void)``,
    from the Cython module's exported C API, or None where CuPy has none."""
    api = ctypes.PyDLL(None)  # this process's CPython, with our own function objects
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    for name in ("cupy_backends.cuda.stream", "cupy.cuda.stream"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        capsule = getattr(module, "__pyx_capi__", {}).get("get_current_stream_ptr")
        if capsule is None:
            continue
        signature = api.PyCapsule_GetName(capsule)
        # Cython names the capsule after the C signature, e.g. b"intptr_t (void)".
        if signature is None or not signature.startswith(b"intptr_t") or b"(void)" not in signature:
            continue
        address = api.PyCapsule_GetPointer(capsule, signature)
        if address:
            return int(address)
    return None


def _c_allocator(cupy: Any) -> Any:
    """CuPy's ``CFunctionAllocator`` over emm's C functions, or a string saying why
    it cannot be used."""
    try:
        return _c_allocator_or_reason(cupy)
    except (OSError, AttributeError, TypeError, ValueError) as e:
        # No CPython symbols to reach (libpython loaded privately), another CuPy.
        return f"{type(e).__name__}: {e}"


def _c_allocator_or_reason(cupy: Any) -> Any:
    memory = cupy.cuda.memory
    cfa = getattr(memory, "CFunctionAllocator", None)
    cfm = getattr(memory, "CFunctionAllocatorMemory", None)
    if cfa is None or cfm is None:
        return "this CuPy has no CFunctionAllocator"
    lib = load()
    if not hasattr(lib, "emm_cupy_malloc"):
        return "the emm library predates emm_cupy_malloc (C ABI 303)"
    stream_fn = _current_stream_function()
    if stream_fn is None:
        return "CuPy exports no C function for its current stream"
    vp = ctypes.c_void_p
    lib.emm_cupy_set_hooks.argtypes = [vp, vp, vp, vp]
    lib.emm_cupy_set_hooks.restype = ctypes.c_int
    api = ctypes.PyDLL(None)
    raise_fn = ctypes.cast(api.PyErr_SetString, vp).value
    # The library keeps the two classes' addresses for the life of the process: one
    # reference each that is never given back, so a reload of this module or the
    # interpreter's teardown cannot free them under it.
    api.Py_IncRef.argtypes = [ctypes.py_object]
    api.Py_IncRef.restype = None
    for cls in (_COutOfMemoryError, _CError):
        api.Py_IncRef(cls)
    status = lib.emm_cupy_set_hooks(stream_fn, raise_fn, id(_COutOfMemoryError), id(_CError))
    if status != EMM_OK:
        return f"emm_cupy_set_hooks failed ({status})"
    malloc_fn = ctypes.cast(lib.emm_cupy_malloc, vp).value
    free_fn = ctypes.cast(lib.emm_cupy_free, vp).value
    # Does CuPy raise what emm_cupy_malloc sets? Device 1 << 20 fails at once (no
    # memory is touched); the memory object's free ignores the failure value.
    try:
        cfm(256, 0, malloc_fn, free_fn, 1 << 20)
    except _CError:
        pass
    except BaseException as e:  # e.g. SystemError: CuPy did not check the result
        return f"CuPy did not raise emm's error from its C allocator ({type(e).__name__}: {e})"
    else:
        return "CuPy ignored a failed allocation of its C allocator"
    # The library object is the owner: it stays loaded while CuPy holds the functions.
    return cfa(0, malloc_fn, free_fn, lib)


def install(path: str = "auto") -> str:
    """Makes CuPy allocate through emm (``cupy.cuda.set_allocator``); returns the
    path taken: ``"c"`` (``CFunctionAllocator`` over emm's C functions, no Python per
    allocation) or ``"python"`` (``PythonFunctionAllocator``, or an allocator
    function on older CuPy). ``path``: ``"auto"`` (C where CuPy supports it, else
    Python with a warning saying why), ``"c"`` (raise :class:`EmmError` if
    unsupported) or ``"python"``.

    Also makes CuPy's current device current on the calling thread
    (``cupy.cuda.Device().use()``, which CuPy's first kernel would do anyway): on a
    thread without a current CUDA context, the runtime calls CuPy makes for every
    allocation (the device and stream lookups) take microseconds instead of tens of
    nanoseconds. CuPy's own pool gets this as a side effect of its first
    ``cudaMalloc``; emm allocates through the driver, so it is done here. Other
    threads get it from their first kernel, or from ``cupy.cuda.Device().use()``.
    """
    if path not in ("auto", "c", "python"):
        raise ValueError(f"path must be 'auto', 'c' or 'python', not {path!r}")
    cupy = require("cupy", "emm.cupy.install()")

    _bind()
    cupy.cuda.Device().use()
    if path != "python":
        c = _c_allocator(cupy)
        if not isinstance(c, str):
            cupy.cuda.set_allocator(c.malloc)
            return "c"
        if path == "c":
            raise EmmError(EMM_ERR_OTHER, f"CuPy's C allocator path is unavailable: {c}")
        warnings.warn(f"emm.cupy: allocating through Python functions: {c}", RuntimeWarning, stacklevel=2)
    pfa = getattr(cupy.cuda, "PythonFunctionAllocator", None)
    if pfa is not None:
        cupy.cuda.set_allocator(pfa(malloc, free).malloc)
    else:
        cupy.cuda.set_allocator(allocator)
    return "python"
