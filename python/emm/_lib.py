"""ctypes bindings of libemm_capi (include/emm.h)."""

import ctypes
import os
import pathlib
import sys

_STATUS_NAMES = {
    0: "EMM_OK",
    1: "EMM_ERR_INVALID_ARGUMENT",
    2: "EMM_ERR_OUT_OF_MEMORY",
    3: "EMM_ERR_DRIVER",
    4: "EMM_ERR_UNSUPPORTED",
    5: "EMM_ERR_UNKNOWN_MANAGER",
    6: "EMM_ERR_IPC",
    7: "EMM_ERR_ALREADY_IN_USE",
    8: "EMM_ERR_PANIC",
    9: "EMM_ERR_OTHER",
}


class EmmError(RuntimeError):
    """A failed emm call: ``code`` is the emm_status, the message says what happened."""

    def __init__(self, code, message):
        super().__init__(f"{_STATUS_NAMES.get(code, code)}: {message}")
        self.code = code


def _candidates():
    env = os.environ.get("EMM_LIBRARY")
    if env:
        yield pathlib.Path(env)
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / "libemm_capi.so"
    root = here.parent.parent
    built = [root / "target" / p / "libemm_capi.so" for p in ("release", "debug")]
    # The most recently built one first: a stale release build must not win.
    built.sort(key=lambda p: p.stat().st_mtime if p.is_file() else 0, reverse=True)
    yield from built


def library_path():
    """The path of libemm_capi.so that ``load()`` uses (``EMM_LIBRARY`` wins)."""
    tried = []
    for p in _candidates():
        if p.is_file():
            return p
        tried.append(str(p))
    raise EmmError(3, "libemm_capi.so not found; tried " + ", ".join(tried) +
                   " (build it with `cargo build --release -p emm-capi` or set EMM_LIBRARY)")


_LIB = None
# The oldest C ABI (emm_abi_version) these bindings work with: 0.2.0, which added
# emm_alloc_ptr.
ABI_NEEDED = 200


def load():
    """Loads libemm_capi once, checks its ABI version and declares its functions."""
    global _LIB
    if _LIB is not None:
        return _LIB
    path = library_path()
    lib = ctypes.CDLL(str(path))
    version = lib.emm_abi_version()
    if version < ABI_NEEDED or version // 10000 != ABI_NEEDED // 10000:
        raise EmmError(4, f"{path} has C ABI {version}; these bindings need {ABI_NEEDED} or a later "
                          f"minor version of the same major (rebuild with `cargo build --release -p emm-capi`)")
    u64p = ctypes.POINTER(ctypes.c_uint64)
    szp = ctypes.POINTER(ctypes.c_size_t)
    vp = ctypes.c_void_p
    sigs = {
        "emm_abi_version": ([], ctypes.c_int),
        "emm_last_error": ([ctypes.c_char_p, ctypes.c_size_t], ctypes.c_size_t),
        "emm_last_error_code": ([], ctypes.c_int),
        "emm_manager_create": ([ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(vp)], ctypes.c_int),
        "emm_manager_destroy": ([vp], None),
        "emm_manager_name": ([vp], ctypes.c_char_p),
        "emm_alloc": ([vp, ctypes.c_size_t, vp, u64p], ctypes.c_int),
        "emm_alloc_ptr": ([vp, ctypes.c_size_t, vp], ctypes.c_uint64),
        "emm_free": ([vp, ctypes.c_uint64, vp], ctypes.c_int),
        "emm_host_alloc": ([vp, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(vp), u64p], ctypes.c_int),
        "emm_host_free": ([vp, vp], ctypes.c_int),
        "emm_memory_info": ([vp, szp, szp], ctypes.c_int),
        "emm_get_stats": ([vp, ctypes.POINTER(_Stats)], ctypes.c_int),
        "emm_trim": ([vp, szp], ctypes.c_int),
        "emm_ipc_export": ([vp, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_char_p,
                            ctypes.c_size_t, szp], ctypes.c_int),
        "emm_ipc_open": ([vp, ctypes.c_char_p, ctypes.c_size_t, u64p], ctypes.c_int),
        "emm_ipc_close": ([vp, ctypes.c_uint64], ctypes.c_int),
        "emm_array_create": ([vp, ctypes.c_uint8, ctypes.c_uint8, ctypes.c_int, szp, ctypes.POINTER(vp)], ctypes.c_int),
        "emm_array_destroy": ([vp], None),
        "emm_array_move": ([vp, ctypes.c_int, vp, ctypes.c_int, ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "emm_array_info": ([vp, u64p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                            ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "emm_array_get": ([vp, szp, ctypes.c_int, vp, ctypes.c_size_t], ctypes.c_int),
        "emm_array_set": ([vp, szp, ctypes.c_int, vp, ctypes.c_size_t], ctypes.c_int),
        "emm_array_lock": ([vp, u64p], ctypes.c_int),
        "emm_array_unlock": ([vp, ctypes.c_uint64], ctypes.c_int),
        "emm_array_to_dlpack": ([vp, ctypes.c_int, ctypes.POINTER(vp)], ctypes.c_int),
        "emm_dlpack_delete": ([vp, ctypes.c_int], None),
        "emm_array_deleters_run": ([vp], ctypes.c_uint64),
        "emm_manager_report": ([vp, ctypes.c_char_p, ctypes.c_size_t, szp], ctypes.c_int),
    }
    for name, (args, res) in sigs.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    _LIB = lib
    return lib


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "allocated_bytes", "allocated_bytes_peak", "reserved_bytes", "reserved_bytes_peak",
        "allocations", "upstream_allocs")]


def default_name():
    """The manager the Python integrations use: ``EMM_MEMORY_MANAGER``, else ``pool``."""
    return os.environ.get("EMM_MEMORY_MANAGER") or "pool"


def _check(lib, status):
    if status != 0:
        n = lib.emm_last_error(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        lib.emm_last_error(buf, n + 1)
        raise EmmError(status, buf.value.decode("utf-8", "replace"))


class _Owner:
    """Owns one C handle ``_h``, given back by ``close()`` (``_destroy``: the name of
    the C function) or when the object is collected. At interpreter exit the library
    may be unloaded already, so the handle is left to the process's end; otherwise a
    failure is reported by Python's unraisable hook, not swallowed."""

    _destroy = None

    def close(self):
        if getattr(self, "_h", None):
            getattr(self._lib, self._destroy)(self._h)
            self._h = None

    def __del__(self):
        if not sys.is_finalizing():
            self.close()


class Manager(_Owner):
    """A handle on the manager of one device (shared with every emm user in the process)."""

    _destroy = "emm_manager_destroy"

    def __init__(self, name=None, device=0):
        """``name``: ``default``, ``pool`` or ``hostonly``; None: ``EMM_MEMORY_MANAGER``,
        else ``pool``. A process has one manager per device: asking for another name
        once one has served memory raises ``EmmError`` (EMM_ERR_ALREADY_IN_USE)."""
        lib = self._lib = load()
        h = ctypes.c_void_p()
        name = name or default_name()
        _check(lib, lib.emm_manager_create(name.encode(), int(device), ctypes.byref(h)))
        self._h = h
        # The handle as a plain int: ctypes converts it faster than a c_void_p.
        self._hv = h.value
        self._alloc, self._free = lib.emm_alloc_ptr, lib.emm_free
        self.device = int(device)
        self.name = lib.emm_manager_name(h).decode()

    def alloc(self, size, stream=0):
        """Device memory of ``size`` bytes ordered on ``stream`` (an int handle; 0: legacy default)."""
        ptr = self._alloc(self._hv, size, stream or None)
        if not ptr and size:
            _check(self._lib, self._lib.emm_last_error_code())
        return ptr

    def free(self, ptr, stream=0):
        """Frees ``ptr`` ordered on ``stream`` (0: the stream it was allocated on)."""
        status = self._free(self._hv, ptr, stream or None)
        if status:
            _check(self._lib, status)

    def host_alloc(self, size, mapped=False, portable=False, wc=False):
        """Pinned host memory: returns ``(host_ptr, device_ptr_or_0)``."""
        host, dev = ctypes.c_void_p(), ctypes.c_uint64()
        flags = (1 if mapped else 0) | (2 if portable else 0) | (4 if wc else 0)
        _check(self._lib, self._lib.emm_host_alloc(self._h, size, flags, ctypes.byref(host), ctypes.byref(dev)))
        return host.value, dev.value

    def host_free(self, host):
        _check(self._lib, self._lib.emm_host_free(self._h, host))

    def memory_info(self):
        """``(free, total)`` bytes of the device."""
        f, t = ctypes.c_size_t(), ctypes.c_size_t()
        _check(self._lib, self._lib.emm_memory_info(self._h, ctypes.byref(f), ctypes.byref(t)))
        return f.value, t.value

    def stats(self):
        """The manager's statistics as a dict (PyTorch's names where they fit)."""
        s = _Stats()
        _check(self._lib, self._lib.emm_get_stats(self._h, ctypes.byref(s)))
        return {n: getattr(s, n) for n, _ in _Stats._fields_}

    def report(self):
        """Every counter the manager keeps, as one line of text (for profiling)."""
        n = ctypes.c_size_t()
        _check(self._lib, self._lib.emm_manager_report(self._h, None, 0, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(n.value + 1)
        _check(self._lib, self._lib.emm_manager_report(self._h, buf, n.value + 1, None))
        return buf.value.decode("utf-8", "replace")

    def trim(self):
        """Gives cached memory back to the device; returns the bytes released."""
        n = ctypes.c_size_t()
        _check(self._lib, self._lib.emm_trim(self._h, ctypes.byref(n)))
        return n.value

    def ipc_export(self, ptr, offset, length):
        """IPC handle bytes for ``[ptr+offset, ptr+offset+length)``."""
        n = ctypes.c_size_t()
        _check(self._lib, self._lib.emm_ipc_export(self._h, ptr, offset, length, None, 0, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(n.value)
        _check(self._lib, self._lib.emm_ipc_export(self._h, ptr, offset, length, buf, n.value, ctypes.byref(n)))
        return buf.raw[: n.value]

    def ipc_open(self, handle):
        out = ctypes.c_uint64()
        _check(self._lib, self._lib.emm_ipc_open(self._h, handle, len(handle), ctypes.byref(out)))
        return out.value

    def ipc_close(self, ptr):
        _check(self._lib, self._lib.emm_ipc_close(self._h, ptr))
