"""ctypes bindings of libemm_capi (``include/emm.h``): loading, errors, warnings,
configuration and :class:`Manager`.

Every integer crosses into C through ctypes, which wraps silently (``2**64 + 5``
becomes 5). So each integer argument is checked here first: a negative value
raises ``ValueError``, one too large for its C type raises ``OverflowError``, a
non-integer raises ``TypeError``, and nothing reaches the library.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import operator
import os
import pathlib
import sys
import threading
import warnings
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

__all__ = [
    "ABI_NEEDED",
    "ClosedError",
    "EmmError",
    "EmmWarning",
    "Manager",
    "OutOfMemoryError",
    "TagStateError",
    "configure",
    "library_path",
    "load",
]

EMM_OK = 0
EMM_ERR_INVALID_ARGUMENT = 1
EMM_ERR_OUT_OF_MEMORY = 2
EMM_ERR_DRIVER = 3
EMM_ERR_UNSUPPORTED = 4
EMM_ERR_UNKNOWN_MANAGER = 5
EMM_ERR_IPC = 6
EMM_ERR_ALREADY_IN_USE = 7
EMM_ERR_PANIC = 8
EMM_ERR_OTHER = 9
EMM_ERR_INTERNAL = 10
EMM_ERR_FORKED = 11
EMM_ERR_TAG_STATE = 12

_STATUS_NAMES = {
    EMM_OK: "EMM_OK",
    EMM_ERR_INVALID_ARGUMENT: "EMM_ERR_INVALID_ARGUMENT",
    EMM_ERR_OUT_OF_MEMORY: "EMM_ERR_OUT_OF_MEMORY",
    EMM_ERR_DRIVER: "EMM_ERR_DRIVER",
    EMM_ERR_UNSUPPORTED: "EMM_ERR_UNSUPPORTED",
    EMM_ERR_UNKNOWN_MANAGER: "EMM_ERR_UNKNOWN_MANAGER",
    EMM_ERR_IPC: "EMM_ERR_IPC",
    EMM_ERR_ALREADY_IN_USE: "EMM_ERR_ALREADY_IN_USE",
    EMM_ERR_PANIC: "EMM_ERR_PANIC",
    EMM_ERR_OTHER: "EMM_ERR_OTHER",
    EMM_ERR_INTERNAL: "EMM_ERR_INTERNAL",
    EMM_ERR_FORKED: "EMM_ERR_FORKED",
    EMM_ERR_TAG_STATE: "EMM_ERR_TAG_STATE",
}

# Limits of the C types the bindings pass integers as.
SIZE_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1
U64_MAX = 2**64 - 1
POINTER_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1
INT_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_int) - 1) - 1

_log = logging.getLogger("emm")


class EmmError(RuntimeError):
    """A failed emm call: ``code`` is the ``emm_status`` (``EMM_ERR_*``), the
    message says what happened."""

    code: int

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{_STATUS_NAMES.get(code, code)}: {message}")
        self.code = code


class OutOfMemoryError(MemoryError, EmmError):
    """Out of memory (``EMM_ERR_OUT_OF_MEMORY``): a ``MemoryError`` that also says
    how many bytes were requested and how many were free of how many in all (of the
    device, or of the manager's limit; 0 where unknown)."""

    requested: int
    free: int
    total: int

    def __init__(self, message: str, requested: int = 0, free: int = 0, total: int = 0) -> None:
        EmmError.__init__(self, EMM_ERR_OUT_OF_MEMORY, message)
        self.requested, self.free, self.total = requested, free, total


class ForkedError(EmmError):
    """This process was forked after its parent initialised CUDA through emm
    (``EMM_ERR_FORKED``): CUDA and the parent's pools cannot be used here, and
    nothing was allocated or freed. Start workers with
    ``multiprocessing.get_context("spawn")``, or fork before CUDA is first used."""

    def __init__(self, message: str) -> None:
        super().__init__(EMM_ERR_FORKED, message)


class TagStateError(EmmError):
    """An operation a tag's state does not allow (``EMM_ERR_TAG_STATE``):
    allocating under a paused tag, pausing a paused tag or ``"default"``, resuming
    a tag that is not paused, pausing memory that cannot be paused, exporting a
    tagged block (see :func:`emm.pause`)."""

    def __init__(self, message: str) -> None:
        super().__init__(EMM_ERR_TAG_STATE, message)


class ClosedError(EmmError, ValueError):
    """A method of an object whose handle was closed (like I/O on a closed file:
    a ``ValueError`` too). The handle is never passed to the library again."""

    def __init__(self, what: str) -> None:
        super().__init__(EMM_ERR_INVALID_ARGUMENT, f"this {what} is closed")


class EmmWarning(UserWarning):
    """A warning from emm's library, e.g. ``EMM_MEMORY_MANAGER`` overriding a
    manager chosen in code (NBEP 7 asks for that warning)."""


def check_uint(value: Any, name: str, limit: int) -> int:
    """``value`` as a Python int in ``0..=limit``; raises ``TypeError`` (not an
    integer), ``ValueError`` (negative) or ``OverflowError`` (above ``limit``)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}") from None
    if v < 0:
        raise ValueError(f"{name} must not be negative (got {v})")
    if v > limit:
        raise OverflowError(f"{name} {v} is too large (at most {limit})")
    return v


def _pointer(value: Any, name: str) -> Optional[int]:
    """A stream or host pointer for a ``void*`` argument: 0 or None -> NULL."""
    if value is None:
        return None
    v = check_uint(value, name, POINTER_MAX)
    return v or None


def _package_libraries(here: pathlib.Path) -> List[pathlib.Path]:
    # Installed packages carry _native/libemm_capi.so (a folder without __init__.py,
    # so pydoc and pkgutil do not list the library as a module); older installs and
    # editable builds may carry libemm_capi.so or the build backend's name for it
    # (libemm_capi.<ext suffix>.so) beside this file.
    native = here / "_native" / "libemm_capi.so"
    exact = here / "libemm_capi.so"
    found = [p for p in (native, exact) if p.is_file()]
    found += sorted(p for p in here.glob("libemm_capi*.so") if p != exact)
    return found


def _candidates() -> Iterator[pathlib.Path]:
    env = os.environ.get("EMM_LIBRARY")
    if env:
        # Absolute, so that the loader opens this file and not a library of the
        # same name on its search path (nor another after a chdir).
        yield pathlib.Path(env).resolve()
        return
    here = pathlib.Path(__file__).resolve().parent
    found = _package_libraries(here)
    if found:
        yield from found
        return
    yield here / "_native" / "libemm_capi.so"
    # A source checkout (python/emm next to target/): the newest build first, so a
    # stale release build does not win.
    root = here.parent.parent
    built = [root / "target" / p / "libemm_capi.so" for p in ("release", "debug")]
    built.sort(key=lambda p: p.stat().st_mtime if p.is_file() else 0, reverse=True)
    yield from built


def library_path() -> pathlib.Path:
    """The path of the libemm_capi that :func:`load` uses: ``EMM_LIBRARY`` when set,
    else the one inside this package, else a build of the source tree."""
    tried = []
    for p in _candidates():
        if p.is_file():
            return p
        tried.append(str(p))
    raise EmmError(
        EMM_ERR_DRIVER,
        "libemm_capi.so not found; tried " + ", ".join(tried)
        + " (install emm-cuda's wheel, or `pip install <emm checkout>`, or set EMM_LIBRARY)",
    )


_LIB: Optional[ctypes.CDLL] = None
# The oldest C ABI (emm_abi_version) these bindings work with: 0.3.0, which added
# emm_configure, emm_last_oom and the warning queue; 301 the memory tools; 302
# EMM_ERR_INTERNAL and checked handles; 303 CuPy's C-function allocator; 304 managed
# memory; 305 emm_torch_record_stream; 306 emm_torch_release; 307 PyTorch's memory
# tools for the native object (emm_torch_memory_stats, ...); 308 its CUDA graph
# pools (emm_torch_graph_pool_begin, ...); 309 EMM_ERR_FORKED (ForkedError); 310
# tags, pause and resume (emm_region_enter, emm_pause, ...; TagStateError); 311
# emm_settings (the list of settings, which configure() and settings() read) and
# run-time settings; 312 torch.cuda.MemPool for the native object
# (emm_torch_graph_pool_create, emm_torch_graph_pool_info); 313
# emm_configure_check (PyTorch's settings checked before any is applied); 314
# emm_device_count (configure()'s devices checked before anything is applied).
ABI_NEEDED = 314

# emm_alloc_managed's flags (CU_MEM_ATTACH_GLOBAL / CU_MEM_ATTACH_HOST).
EMM_MEM_ATTACH_GLOBAL = 1
EMM_MEM_ATTACH_HOST = 2


class _Stats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "allocated_bytes", "allocated_bytes_peak", "reserved_bytes", "reserved_bytes_peak",
        "allocations", "upstream_allocs")]


class _Setting(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("env", ctypes.c_char_p), ("kind", ctypes.c_char_p),
                ("default_value", ctypes.c_char_p), ("doc", ctypes.c_char_p),
                ("runtime", ctypes.c_int)]


class _StatName(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("doc", ctypes.c_char_p), ("torch", ctypes.c_int)]


class _GraphPoolInfo(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "uses", "live_bytes", "live_blocks", "reserved_bytes", "segments", "peak_live_bytes",
        "peak_reserved_bytes")]


def _signatures() -> Dict[str, Tuple[List[Any], Any]]:
    """The ctypes argument and result types of every C function the bindings call
    (``python/tests/test_abi_table.py`` checks them against ``emm.h``)."""
    u64p = ctypes.POINTER(ctypes.c_uint64)
    szp = ctypes.POINTER(ctypes.c_size_t)
    intp = ctypes.POINTER(ctypes.c_int)
    vp = ctypes.c_void_p
    return {
        "emm_abi_version": ([], ctypes.c_int),
        "emm_last_error": ([ctypes.c_char_p, ctypes.c_size_t], ctypes.c_size_t),
        "emm_last_error_code": ([], ctypes.c_int),
        "emm_last_oom": ([szp, szp, szp], ctypes.c_int),
        "emm_configure": ([ctypes.c_char_p, ctypes.c_char_p], ctypes.c_int),
        "emm_device_count": ([ctypes.POINTER(ctypes.c_int)], ctypes.c_int),
        "emm_configure_check": ([ctypes.c_char_p, ctypes.c_char_p], ctypes.c_int),
        "emm_settings": ([ctypes.POINTER(_Setting), ctypes.c_size_t, szp], ctypes.c_int),
        "emm_stat_names": ([ctypes.POINTER(_StatName), ctypes.c_size_t, szp], ctypes.c_int),
        "emm_torch_graph_pool_info": ([ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                       ctypes.POINTER(_GraphPoolInfo)], ctypes.c_int),
        "emm_capture_warnings": ([ctypes.c_int], ctypes.c_int),
        "emm_take_warning": ([ctypes.c_char_p, ctypes.c_size_t, szp, intp], ctypes.c_int),
        "emm_manager_create": ([ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(vp)], ctypes.c_int),
        "emm_manager_destroy": ([vp], None),
        "emm_manager_name": ([vp], ctypes.c_char_p),
        "emm_alloc": ([vp, ctypes.c_size_t, vp, u64p], ctypes.c_int),
        "emm_alloc_ptr": ([vp, ctypes.c_size_t, vp], ctypes.c_uint64),
        "emm_free": ([vp, ctypes.c_uint64, vp], ctypes.c_int),
        "emm_host_alloc": ([vp, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(vp), u64p], ctypes.c_int),
        "emm_host_free": ([vp, vp], ctypes.c_int),
        "emm_alloc_managed": ([vp, ctypes.c_size_t, ctypes.c_uint, u64p], ctypes.c_int),
        "emm_free_managed": ([vp, ctypes.c_uint64], ctypes.c_int),
        "emm_memory_info": ([vp, szp, szp], ctypes.c_int),
        "emm_get_stats": ([vp, ctypes.POINTER(_Stats)], ctypes.c_int),
        "emm_trim": ([vp, szp], ctypes.c_int),
        "emm_ipc_export": ([vp, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_char_p,
                            ctypes.c_size_t, szp], ctypes.c_int),
        "emm_ipc_open": ([vp, ctypes.c_char_p, ctypes.c_size_t, u64p], ctypes.c_int),
        "emm_ipc_close": ([vp, ctypes.c_uint64], ctypes.c_int),
        "emm_array_create": ([vp, ctypes.c_uint8, ctypes.c_uint8, ctypes.c_int, szp, ctypes.POINTER(vp)],
                             ctypes.c_int),
        "emm_array_destroy": ([vp], None),
        "emm_array_move": ([vp, ctypes.c_int, vp, ctypes.c_int, intp], ctypes.c_int),
        "emm_array_info": ([vp, u64p, intp, intp, intp], ctypes.c_int),
        "emm_array_get": ([vp, szp, ctypes.c_int, vp, ctypes.c_size_t], ctypes.c_int),
        "emm_array_set": ([vp, szp, ctypes.c_int, vp, ctypes.c_size_t], ctypes.c_int),
        "emm_array_lock": ([vp, u64p], ctypes.c_int),
        "emm_array_unlock": ([vp, ctypes.c_uint64], ctypes.c_int),
        "emm_array_to_dlpack": ([vp, ctypes.c_int, ctypes.POINTER(vp)], ctypes.c_int),
        "emm_dlpack_delete": ([vp, ctypes.c_int], None),
        "emm_array_deleters_run": ([vp], ctypes.c_uint64),
        "emm_manager_report": ([vp, ctypes.c_char_p, ctypes.c_size_t, szp], ctypes.c_int),
        "emm_string_free": ([vp], None),
        "emm_memory_stat": ([vp, ctypes.c_char_p, u64p], ctypes.c_int),
        "emm_memory_stats_json": ([vp, ctypes.POINTER(vp), szp], ctypes.c_int),
        "emm_reset_peak_stats": ([vp], ctypes.c_int),
        "emm_record_memory_history": ([vp, ctypes.c_size_t], ctypes.c_int),
        "emm_memory_snapshot_json": ([vp, ctypes.POINTER(vp), szp], ctypes.c_int),
        "emm_torch_record_stream": ([vp, ctypes.c_int, vp], ctypes.c_int),
        "emm_torch_memory_stats": ([ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), u64p, ctypes.c_size_t, szp],
                                   ctypes.c_int),
        "emm_torch_reset_peak_stats": ([ctypes.c_int], ctypes.c_int),
        "emm_torch_empty_cache": ([ctypes.c_int, szp], ctypes.c_int),
        "emm_region_enter": ([ctypes.c_char_p, u64p], ctypes.c_int),
        "emm_region_exit": ([ctypes.c_uint64], ctypes.c_int),
        "emm_pause": ([ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.c_int, szp, szp],
                      ctypes.c_int),
        "emm_resume": ([ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, szp, szp], ctypes.c_int),
        "emm_tag_stats": ([ctypes.c_char_p, szp, szp, szp, szp, intp], ctypes.c_int),
    }


def load() -> ctypes.CDLL:
    """Loads libemm_capi once, checks its ABI version, declares its functions and
    routes its warnings to Python (see :class:`EmmWarning`)."""
    global _LIB
    if _LIB is not None:
        return _LIB
    path = library_path()
    try:
        lib = ctypes.CDLL(str(path))
        version = lib.emm_abi_version()
    except (OSError, AttributeError) as e:
        origin = " (EMM_LIBRARY)" if os.environ.get("EMM_LIBRARY") else ""
        raise EmmError(EMM_ERR_DRIVER,
                       f"{path}{origin} could not be loaded as emm's C library: {e} (point EMM_LIBRARY "
                       f"at libemm_capi.so, or rebuild it with `cargo build --release -p emm-capi`)") from e
    if version < ABI_NEEDED or version // 10000 != ABI_NEEDED // 10000:
        raise EmmError(EMM_ERR_UNSUPPORTED,
                       f"{path} has C ABI {version}; these bindings need {ABI_NEEDED} or a later "
                       f"minor version of the same major (reinstall the package, or rebuild with "
                       f"`cargo build --release -p emm-capi`)")
    sigs = _signatures()
    for name, (args, res) in sigs.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    # Warnings and errors of the library are queued for take_warnings() (and raised
    # through the warnings module) instead of printed on stderr. What paths that
    # run no Python (the native PyTorch allocator, CuPy's C allocator) queue is
    # taken at each later call of the bindings; what is left at exit goes to
    # stderr then, not lost with the queue.
    lib.emm_capture_warnings(1)
    atexit.register(_drain_at_exit, lib)
    _LIB = lib
    return lib


# Messages taken from the library but not yet raised: those after one that the
# warnings filter turned into an exception (``emit_warnings``), kept for the next
# take instead of lost. At most ``_NOT_RAISED_CAP``, the newest, as the library's
# own queue keeps; the first then says how many older ones were dropped.
_NOT_RAISED: List[Tuple[int, str]] = []
_NOT_RAISED_CAP = 256
_NOT_RAISED_LOCK = threading.Lock()


# The notice in ``_NOT_RAISED`` and the count it gives, while it is there: a
# later overflow adds to it instead of dropping it as a message.
_NOTICE: Optional[Tuple[Tuple[int, str], int]] = None


def _keep_not_raised(left: List[Tuple[int, str]]) -> None:
    """Puts ``left`` (oldest first) back before the messages kept already."""
    global _NOTICE
    with _NOT_RAISED_LOCK:
        kept = left + _NOT_RAISED
        earlier = 0
        # Another thread's notice may lie behind what this one puts back (it
        # kept an overflow between this thread's take and now): it is taken
        # out and its count carried into the one notice.
        if _NOTICE is not None:
            at = next((k for k, m in enumerate(kept) if m is _NOTICE[0]), None)
            if at is not None:
                earlier = _NOTICE[1]
                del kept[at]
        _NOTICE = None
        if earlier or len(kept) > _NOT_RAISED_CAP:
            # The notice takes one of the places: the newest CAP - 1 stay.
            dropped = max(len(kept) - (_NOT_RAISED_CAP - 1), 0)
            notice = (1, f"{earlier + dropped} earlier message(s) of emm were dropped: {_NOT_RAISED_CAP} "
                         "are kept while a warnings filter raises them one call at a time")
            kept = [notice] + kept[dropped:]
            _NOTICE = (notice, earlier + dropped)
        _NOT_RAISED[:] = kept


def take_warnings(lib: Optional[ctypes.CDLL] = None) -> List[Tuple[int, str]]:
    """Takes the library's queued warnings and errors, oldest first, as
    ``(level, message)`` pairs (level 1: error, 2: warning) without raising them."""
    global _NOTICE
    lib = lib or load()
    with _NOT_RAISED_LOCK:
        out: List[Tuple[int, str]] = _NOT_RAISED[:]
        del _NOT_RAISED[:]
        _NOTICE = None
    n, level = ctypes.c_size_t(), ctypes.c_int()
    buf = ctypes.create_string_buffer(256)
    while True:
        status = lib.emm_take_warning(buf, len(buf), ctypes.byref(n), ctypes.byref(level))
        if status == EMM_ERR_INVALID_ARGUMENT and n.value >= len(buf):
            buf = ctypes.create_string_buffer(n.value + 1)
            continue
        if status != EMM_OK or n.value == 0:
            return out
        out.append((level.value, buf.value.decode("utf-8", "replace")))


def _drain_at_exit(lib: ctypes.CDLL) -> None:
    """At interpreter exit: the library's messages still queued, on stderr, one
    line each."""
    try:
        left = take_warnings(lib)
    except Exception:  # noqa: BLE001 - at exit, the library may be gone
        return
    for level, message in left:
        kind = "ERROR" if level == 1 else "WARN"
        print(f"emm: {kind} (queued, not taken before exit): {message}", file=sys.stderr)


def emit_warnings(lib: Optional[ctypes.CDLL] = None, stacklevel: int = 3) -> None:
    """Raises the library's queued warnings as :class:`EmmWarning` (``warnings``
    module) and logs its errors on the ``emm`` logger. When the filter turns a
    warning into an exception, the messages after it stay queued for the next
    call (or :func:`take_warnings`)."""
    taken = take_warnings(lib)
    for i, (level, message) in enumerate(taken):
        try:
            if level == 1:
                _log.error("%s", message)
            else:
                warnings.warn(message, EmmWarning, stacklevel=stacklevel)
        except BaseException:
            _keep_not_raised(taken[i + 1:])
            raise


def _raise_last(lib: ctypes.CDLL, status: int) -> None:
    n = lib.emm_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    lib.emm_last_error(buf, n + 1)
    message = buf.value.decode("utf-8", "replace")
    # The out-of-memory figures first: taking warnings may set the last error.
    oom = None
    if status == EMM_ERR_OUT_OF_MEMORY:
        r, f, t = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        if lib.emm_last_oom(ctypes.byref(r), ctypes.byref(f), ctypes.byref(t)) == EMM_OK:
            oom = (r.value, f.value, t.value)
    if status == EMM_ERR_OUT_OF_MEMORY:
        error: EmmError = OutOfMemoryError(message, *oom) if oom else OutOfMemoryError(message)
    elif status == EMM_ERR_FORKED:
        error = ForkedError(message)
    elif status == EMM_ERR_TAG_STATE:
        error = TagStateError(message)
    else:
        error = EmmError(status, message)
    # The queued warnings go out first; one that the warnings filter turns into
    # an exception (``-W error``) does not take the failure's place: the failure
    # is raised, the warning's exception its context.
    try:
        emit_warnings(lib, stacklevel=4)
    except Warning as w:
        raise error from w
    raise error


def _check(lib: ctypes.CDLL, status: int) -> None:
    """Raises the failure that ``status`` reports (nothing for ``EMM_OK``)."""
    if status != EMM_OK:
        _raise_last(lib, status)


def _emit_queued(lib: ctypes.CDLL) -> None:
    """The library's queued warnings raised (:func:`emit_warnings`) before a
    call of these bindings makes its C call: the calls but the allocation paths
    (``alloc``, ``free`` and the like, which stay one C call). Before, not
    after: a warning the filter turns into an exception (``-W error``) then
    stops the call before it changed anything, never after (an IPC mapping
    opened and its address lost, a region entered and never left)."""
    emit_warnings(lib, stacklevel=4)


class Setting(NamedTuple):
    """One setting :func:`configure` knows, as the library declares it: ``name``
    (the keyword), ``env`` (the environment variable that wins over it), ``kind``
    (``"bytes"``, ``"bytes_or_max"``, ``"bool"``, ``"count"``, ``"ratio"`` or
    ``"manager"``), ``default`` (as users write it), ``runtime`` (``True``: it may
    change while managers serve) and ``doc``."""
    name: str
    env: str
    kind: str
    default: str
    runtime: bool
    doc: str


def settings() -> List[Setting]:
    """Every setting :func:`configure` takes, read from the library (each is declared
    once, by the Rust crate that reads it), in the order of the documentation."""
    lib = load()
    count = ctypes.c_size_t()
    _check(lib, lib.emm_settings(None, 0, ctypes.byref(count)))
    table = (_Setting * count.value)()
    _check(lib, lib.emm_settings(table, count.value, ctypes.byref(count)))
    text = lambda b: b.decode("utf-8", "replace") if b else ""
    return [Setting(text(e.name), text(e.env), text(e.kind), text(e.default_value), bool(e.runtime),
                    text(e.doc)) for e in table[:count.value]]


def stat_names() -> List[Tuple[str, str, bool]]:
    """Every statistic name :meth:`Manager.memory_stats` may report, from the
    library's one table: ``(name, what it counts, whether it is PyTorch's
    memory_stats key)``, in the library's order (``emm._stat_names`` holds them as
    constants)."""
    lib = load()
    count = ctypes.c_size_t()
    _check(lib, lib.emm_stat_names(None, 0, ctypes.byref(count)))
    table = (_StatName * count.value)()
    _check(lib, lib.emm_stat_names(table, count.value, ctypes.byref(count)))
    return [(e.name.decode(), e.doc.decode(), bool(e.torch)) for e in table[:count.value]]


# configure(): how a Python value of each kind is checked and spelled for the library.
def _bool_value(v: Any, name: str) -> str:
    if not isinstance(v, (bool, int)) or v not in (0, 1):
        raise TypeError(f"{name} must be a bool, not {v!r}")
    return "1" if v else "0"


def _bytes_value(v: Any, name: str) -> str:
    # Text is a size as the environment variables take it (``"8G"``,
    # ``"512MiB"``): the library parses it, and configure() has it checked
    # (``emm_configure_check``) before anything is applied.
    if isinstance(v, str):
        if not v.strip():
            raise ValueError(f"{name} must be a size, not an empty string")
        if "\0" in v:
            raise ValueError(f"{name} cannot hold a NUL character: {v!r}")
        return v
    return str(check_uint(v, name, SIZE_MAX))


def _count_value(v: Any, name: str) -> str:
    return str(check_uint(v, name, SIZE_MAX))


def _ratio_value(v: Any, name: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a number between 0 and 1, not {v!r}")
    if not 0.0 <= float(v) <= 1.0:
        raise ValueError(f"{name} must be between 0 and 1 (got {v!r})")
    return repr(float(v))


def _manager_value(v: Any, name: str) -> str:
    if not isinstance(v, str) or not v:
        raise TypeError(f"{name} must be a manager name (str), not {v!r}")
    if "\0" in v:
        raise ValueError(f"{name} cannot hold a NUL character: {v!r}")
    return v


# ``"max"`` is text the library reads for ``bytes_or_max`` settings.
_CONVERT = {"bool": _bool_value, "bytes": _bytes_value, "bytes_or_max": _bytes_value,
            "count": _count_value, "ratio": _ratio_value, "manager": _manager_value}

# Short keywords of configure() kept for the programs that use them.
_ALIASES = {
    "limit": "pool_limit",
    "thread_cache": "pool_thread_cache",
    "expandable": "pool_expandable",
    "release_threshold": "hostonly_release_threshold",
    "max_pending_count": "max_pending_deallocs_count",
    "max_pending_ratio": "max_pending_deallocs_ratio",
}


def configure(manager: Optional[str] = None, *, devices: Union[int, Sequence[int], None] = None,
              **values: Any) -> List["Manager"]:
    """Configures emm in code (as ``rmm.reinitialize`` or ``cupy.cuda.set_allocator``
    are called first).

    Every keyword is a setting of :func:`settings` (``emm.settings()`` lists them
    with their documentation), e.g. ``pool_limit``, ``pool_release_threshold``,
    ``pool_expandable``, ``pool_thread_cache``, ``hostonly_release_threshold``,
    ``max_pending_deallocs_count``; ``None`` leaves one alone. Sizes are ints
    or text as the environment variables take it (``"8G"``, ``"512MiB"``,
    ``"1.5g"``; ``bytes_or_max`` settings take ``"max"`` too). The short
    keywords ``limit``, ``thread_cache``, ``expandable``, ``release_threshold`` (the
    ``hostonly`` manager's), ``max_pending_count`` and ``max_pending_ratio`` are
    kept. A set environment variable still wins, with an :class:`EmmWarning`
    (NBEP 7's rule for ``EMM_MEMORY_MANAGER``).

    - ``manager``: ``"pool"`` (the default), ``"default"`` or ``"hostonly"``
      (``EMM_MEMORY_MANAGER``).
    - ``devices``: device ordinals whose managers are created now, with this
      configuration (so a mistake shows here, not at the first allocation); they are
      returned. Without ``devices`` nothing touches the driver and ``[]`` is returned.

    Every argument is checked before any is applied (``TypeError``, ``ValueError``,
    ``OverflowError``). Settings are read when a manager is created: after that,
    changing one raises :class:`EmmError` with code ``EMM_ERR_ALREADY_IN_USE``
    (repeating the value in effect is accepted), except for the run-time ones
    (``Setting.runtime``: ``pool_limit``, ``pool_release_threshold``), which every
    manager applies at once.
    """
    known = {s.name: s for s in settings()}
    pairs = []
    given: Dict[str, str] = {}
    if manager is not None:
        pairs.append(("manager", _manager_value(manager, "manager")))
        given["manager"] = "manager"
    for arg, value in values.items():
        key = _ALIASES.get(arg, arg)
        setting = known.get(key)
        if setting is None:
            raise TypeError(f"configure() got an unexpected keyword argument {arg!r}; the settings "
                            f"are {', '.join(sorted(known))}")
        if value is not None and key in given:
            raise TypeError(f"configure() got {given[key]!r} and {arg!r}, which both set {key!r}")
        if value is not None:
            given[key] = arg
            convert = _CONVERT.get(setting.kind, _manager_value)
            pairs.append((key, convert(value, arg)))
    if devices is None:
        ordinals: List[int] = []
    elif isinstance(devices, (list, tuple, range)):
        ordinals = [check_uint(d, "devices[]", INT_MAX) for d in devices]
    else:
        ordinals = [check_uint(devices, "devices", INT_MAX)]
    lib = load()
    # Everything checked before anything is applied: each value as the library
    # parses it (a value the pool would refuse at its creation, e.g. a growth
    # step of 0, is refused here), and the device ordinals against the driver's
    # count (a bad one used to fail after the settings were applied and the
    # first device's manager had frozen them).
    for key, value in pairs:
        _check(lib, lib.emm_configure_check(key.encode(), value.encode()))
    if ordinals:
        count = ctypes.c_int()
        _check(lib, lib.emm_device_count(ctypes.byref(count)))
        bad = [d for d in ordinals if d >= count.value]
        if bad:
            raise ValueError(f"devices {bad} are past the {count.value} device(s) the driver sees; "
                             "nothing was applied")
    # The settings read at a manager's creation first: once a manager serves,
    # one is refused unless unchanged, and that refusal then comes before any
    # run-time setting (which takes effect at once) was applied.
    runtime = {name for name, s in known.items() if s.runtime}
    for key, value in sorted(pairs, key=lambda kv: kv[0] in runtime):
        status = lib.emm_configure(key.encode(), value.encode())
        if status != EMM_OK:
            _raise_last(lib, status)
    emit_warnings(lib)
    return [Manager(None, d) for d in ordinals]


class _Owner:
    """Owns one C handle ``_h``, given back by ``close()`` (``_destroy``: the name of
    the C function) or when the object is collected. At interpreter exit the library
    may be unloaded already, so the handle is left to the process's end; otherwise a
    failure is reported by Python's unraisable hook, not swallowed. After
    ``close()`` every method raises :class:`ClosedError`."""

    _destroy: str = ""
    _lib: Any = None
    _h: Any = None

    def _handle(self) -> Any:
        h = self._h
        if not h:
            raise ClosedError(type(self).__name__)
        return h

    @property
    def closed(self) -> bool:
        """``True`` once ``close()`` gave the handle back."""
        return not self._h

    def close(self) -> None:
        """Gives the handle back now (later calls do nothing)."""
        h = self._h
        if h:
            self._h = None
            getattr(self._lib, self._destroy)(h)

    def __enter__(self) -> "_Owner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if not sys.is_finalizing():
            self.close()


class Manager(_Owner):
    """A handle on the manager of one device (shared with every emm user in the
    process). ``close()`` frees what this handle still holds."""

    _destroy = "emm_manager_destroy"
    device: int
    name: str

    def __init__(self, name: Optional[str] = None, device: int = 0) -> None:
        """``name``: ``"pool"``, ``"default"`` or ``"hostonly"``; ``None``:
        ``EMM_MEMORY_MANAGER``, else the one :func:`configure` set, else ``pool``.
        A process has one manager per device: asking for another name once one has
        served memory raises :class:`EmmError` (``EMM_ERR_ALREADY_IN_USE``)."""
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None, not {type(name).__name__}")
        if name is not None and "\0" in name:
            raise ValueError(f"a manager's name cannot hold a NUL character: {name!r}")
        device = check_uint(device, "device", INT_MAX)
        lib = load()
        h = ctypes.c_void_p()
        status = lib.emm_manager_create(None if name is None else name.encode(), device, ctypes.byref(h))
        if status != EMM_OK:
            _raise_last(lib, status)
        # Attached before the warnings go out: one raised as an exception
        # (``-W error``) leaves a handle this object destroys, not a lost one.
        self._attach(lib, h.value, device, lib.emm_manager_name(h).decode())
        emit_warnings(lib)

    def _attach(self, lib: Any, handle: int, device: int, name: str) -> None:
        self._lib = lib
        self._h = handle
        # The handle as a plain int (ctypes converts it faster than a c_void_p); 0
        # once closed, so nothing reaches the library after close().
        self._hv = handle
        self._alloc, self._free = lib.emm_alloc_ptr, lib.emm_free
        self.device = device
        self.name = name

    def close(self) -> None:
        """Gives the handle back, freeing every allocation it still holds; later
        calls of any method raise :class:`ClosedError`."""
        self._hv = 0
        super().close()

    def alloc(self, size: int, stream: int = 0) -> int:
        """Device memory of ``size`` bytes ordered on ``stream`` (a ``CUstream`` as
        an int; 0: the legacy default stream); returns its address (0 for size 0).
        Raises :class:`OutOfMemoryError` when the device is full."""
        if size.__class__ is not int or not 0 <= size <= SIZE_MAX:
            size = check_uint(size, "size", SIZE_MAX)
        if stream and (stream.__class__ is not int or not 0 < stream <= POINTER_MAX):
            stream = check_uint(stream, "stream", POINTER_MAX)
        h = self._hv
        if not h:
            raise ClosedError("Manager")
        ptr = self._alloc(h, size, stream or None)
        if not ptr and size:
            _check(self._lib, self._lib.emm_last_error_code())
        return ptr

    def free(self, ptr: int, stream: int = 0) -> None:
        """Frees ``ptr`` (from :meth:`alloc` of this handle) ordered on ``stream``
        (0: the stream it was allocated on)."""
        if ptr.__class__ is not int or not 0 <= ptr <= U64_MAX:
            ptr = check_uint(ptr, "ptr", U64_MAX)
        if stream and (stream.__class__ is not int or not 0 < stream <= POINTER_MAX):
            stream = check_uint(stream, "stream", POINTER_MAX)
        h = self._hv
        if not h:
            raise ClosedError("Manager")
        status = self._free(h, ptr, stream or None)
        if status:
            _check(self._lib, status)

    def host_alloc(self, size: int, mapped: bool = False, portable: bool = False,
                   wc: bool = False) -> Tuple[int, int]:
        """Pinned host memory of ``size`` bytes: returns ``(host_ptr,
        device_ptr_or_0)`` (the device address when ``mapped``)."""
        size = check_uint(size, "size", SIZE_MAX)
        h = self._handle()
        host, dev = ctypes.c_void_p(), ctypes.c_uint64()
        flags = (1 if mapped else 0) | (2 if portable else 0) | (4 if wc else 0)
        _check(self._lib, self._lib.emm_host_alloc(h, size, flags, ctypes.byref(host), ctypes.byref(dev)))
        return host.value or 0, dev.value

    def host_free(self, host: int) -> None:
        """Frees pinned host memory from :meth:`host_alloc` of this handle."""
        p = _pointer(host, "host")
        h = self._handle()
        _check(self._lib, self._lib.emm_host_free(h, p))

    def alloc_managed(self, size: int, attach_global: bool = True) -> int:
        """Managed memory of ``size`` bytes: one address valid on the host and on
        every device (Numba's ``memallocmanaged``); returns it (0 for size 0).
        ``attach_global``: accessible from any stream on any device (else attached
        to the host). Never pooled; counted apart from :meth:`stats`, under
        ``emm.managed_*`` in :meth:`memory_stats`. Free it with
        :meth:`free_managed`. Raises :class:`OutOfMemoryError`, or
        :class:`EmmError` with ``EMM_ERR_UNSUPPORTED`` where the device has no
        managed memory."""
        size = check_uint(size, "size", SIZE_MAX)
        if not isinstance(attach_global, (bool, int)) or attach_global not in (0, 1):
            raise TypeError(f"attach_global must be a bool, not {attach_global!r}")
        flags = EMM_MEM_ATTACH_GLOBAL if attach_global else EMM_MEM_ATTACH_HOST
        h = self._handle()
        out = ctypes.c_uint64()
        _check(self._lib, self._lib.emm_alloc_managed(h, size, flags, ctypes.byref(out)))
        return out.value

    def free_managed(self, ptr: int) -> None:
        """Frees managed memory from :meth:`alloc_managed` of this handle (0 does
        nothing; device memory from :meth:`alloc` is refused)."""
        ptr = check_uint(ptr, "ptr", U64_MAX)
        h = self._handle()
        _check(self._lib, self._lib.emm_free_managed(h, ptr))

    def memory_info(self) -> Tuple[int, int]:
        """``(free, total)`` bytes of the device."""
        h = self._handle()
        f, t = ctypes.c_size_t(), ctypes.c_size_t()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_memory_info(h, ctypes.byref(f), ctypes.byref(t)))
        return f.value, t.value

    def stats(self) -> Dict[str, int]:
        """The manager's statistics (PyTorch's names where they fit)."""
        h = self._handle()
        s = _Stats()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_get_stats(h, ctypes.byref(s)))
        return {n: getattr(s, n) for n, _ in _Stats._fields_}

    def report(self) -> str:
        """Every counter the manager keeps, as one line of text (for profiling)."""
        h = self._handle()
        n = ctypes.c_size_t()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_manager_report(h, None, 0, ctypes.byref(n)))
        # Counters may gain digits between the two calls (other threads work on):
        # asked again with room to spare until the whole line fits.
        cap = n.value + 64
        while True:
            buf = ctypes.create_string_buffer(cap)
            _check(self._lib, self._lib.emm_manager_report(h, buf, cap, ctypes.byref(n)))
            if n.value < cap:
                return buf.value.decode("utf-8", "replace")
            cap = n.value + 64

    def _json(self, fn: str) -> Any:
        h = self._handle()
        out, n = ctypes.c_void_p(), ctypes.c_size_t()
        _emit_queued(self._lib)
        _check(self._lib, getattr(self._lib, fn)(h, ctypes.byref(out), ctypes.byref(n)))
        try:
            text = ctypes.string_at(out.value, n.value).decode("utf-8")
        finally:
            self._lib.emm_string_free(out)
        import json

        return json.loads(text)

    def memory_stats(self) -> Dict[str, int]:
        """Every counter the manager keeps, under PyTorch's ``memory_stats`` names
        where they mean the same (``allocated_bytes.all.current``, ...), emm's own
        under ``emm.``."""
        return dict(self._json("emm_memory_stats_json"))

    def reset_peak_stats(self) -> None:
        """Sets every peak counter to its current value."""
        h = self._handle()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_reset_peak_stats(h))

    def record_history(self, max_entries: int) -> None:
        """Records the allocation history in a ring of the latest ``max_entries``
        entries (0: stop and drop it)."""
        max_entries = check_uint(max_entries, "max_entries", SIZE_MAX)
        h = self._handle()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_record_memory_history(h, max_entries))

    def snapshot(self) -> Dict[str, Any]:
        """Segments, blocks, the recorded history and the counters, as emm's JSON
        (``emm.torch.snapshot()`` turns it into PyTorch's format)."""
        return dict(self._json("emm_memory_snapshot_json"))

    def trim(self) -> int:
        """Gives cached memory back to the device; returns the bytes released."""
        h = self._handle()
        n = ctypes.c_size_t()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_trim(h, ctypes.byref(n)))
        return n.value

    def ipc_export(self, ptr: int, offset: int, length: int) -> bytes:
        """IPC handle bytes for ``[ptr+offset, ptr+offset+length)`` of an allocation
        of this handle."""
        ptr = check_uint(ptr, "ptr", U64_MAX)
        offset = check_uint(offset, "offset", SIZE_MAX)
        length = check_uint(length, "length", SIZE_MAX)
        h = self._handle()
        n = ctypes.c_size_t()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_ipc_export(h, ptr, offset, length, None, 0, ctypes.byref(n)))
        buf = ctypes.create_string_buffer(n.value)
        _check(self._lib, self._lib.emm_ipc_export(h, ptr, offset, length, buf, n.value, ctypes.byref(n)))
        return buf.raw[: n.value]

    def ipc_open(self, handle: bytes) -> int:
        """Opens IPC handle bytes from another process; returns the device address
        (close it with :meth:`ipc_close`)."""
        if not isinstance(handle, (bytes, bytearray)):
            raise TypeError(f"handle must be bytes, not {type(handle).__name__}")
        h = self._handle()
        out = ctypes.c_uint64()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_ipc_open(h, bytes(handle), len(handle), ctypes.byref(out)))
        return out.value

    def ipc_close(self, ptr: int) -> None:
        """Closes memory opened by :meth:`ipc_open` of this handle: one close for
        each open (a driver may give every open of a handle one address). A
        close the driver refuses raises and keeps the memory's record, to be
        closed again (it may be partly closed: do not use it)."""
        ptr = check_uint(ptr, "ptr", U64_MAX)
        h = self._handle()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_ipc_close(h, ptr))
