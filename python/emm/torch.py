"""PyTorch through emm: ``emm.torch.install()`` swaps PyTorch's CUDA allocator for
emm's. Call it before PyTorch allocates any CUDA memory; PyTorch allows one swap per
process. The allocator object is emm's own where it can be built: a subclass of
PyTorch's pluggable allocator (``_torch_native.cpp``, compiled against the PyTorch
in use on first use and cached) whose tensors are allocated and freed by
``emm_torch_alloc`` / ``emm_torch_release`` directly. Otherwise it is PyTorch's
``torch.cuda.memory.CUDAPluggableAllocator`` over ``emm_torch_alloc`` /
``emm_torch_free``, which also keeps a map of every live address under a lock of
its own; :func:`installed` says which. The manager is the process's (``pool``
unless ``emm.configure`` or ``EMM_MEMORY_MANAGER`` names another). Importing this
module does not import PyTorch.

PyTorch's own memory tools keep working with emm's object:
``torch.cuda.memory_stats()`` and everything built on it (``memory_allocated``,
``max_memory_allocated``, ``memory_reserved``, ``memory_summary``, ...),
``reset_peak_memory_stats``, ``reset_accumulated_memory_stats`` (for PyTorch's
figures; emm's own count from the start), ``empty_cache``,
cuDNN's workspace sizing and ``record_stream`` (from Python and from C++) are
answered by emm's counters and manager. ``install()`` also points PyTorch's
allocation-history tools (``torch.cuda.memory._record_memory_history``,
``_snapshot``, ``_dump_snapshot``, ``memory_snapshot``) at emm's history, with
either object, and under PyTorch's pluggable object (which raises for them) its
statistics, resets and ``empty_cache`` as well (``_torch_routes.py``).

This module offers the same tools over emm's counters under their own names, with
either object (kept in Rust; nothing is counted here), plus emm's own counters
(``emm.*``): :func:`memory_stats`, :func:`memory_summary`, :func:`memory_allocated`,
:func:`max_memory_allocated`, :func:`memory_reserved`, :func:`max_memory_reserved`,
:func:`reset_peak_memory_stats`, :func:`empty_cache`, and
:func:`record_memory_history` / :func:`snapshot` / :func:`dump_snapshot`, whose
snapshots are in PyTorch's format (``torch.cuda._memory_viz`` renders them). The
manager handles they read, one per device, are kept in ``_torch_state.py``, which
``_torch_routes.py`` shares.

What the pool's figures mean: "allocated" is what PyTorch holds; blocks a thread
keeps cached for reuse count as "active", not "allocated" (PyTorch's "active" is
likewise held-or-not-yet-reusable). The allocated peaks are sampled at every
allocation that takes the pool's lock and at every query. In a snapshot, the blocks
of the calling thread's cache go back to the pool first; blocks cached by other
threads (PyTorch's autograd thread, say) show as ``active_allocated``, so the
``active_allocated`` blocks sum to ``active_bytes.all.current``.
"""

from __future__ import annotations

import os
import pickle
import warnings
from typing import Any, Dict, Optional

from . import _stat_names as _n
from . import _torch_native, _torch_routes, _torch_settings, _torch_state
from ._lib import EmmWarning, library_path, load
from ._require import require
from ._torch_state import to_torch_snapshot  # noqa: F401  (public here; defined beside the state it converts)

__all__ = [
    "dump_snapshot",
    "empty_cache",
    "install",
    "installed",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_summary",
    "mem_pool_stats",
    "record_memory_history",
    "reset_peak_memory_stats",
    "snapshot",
]

_INSTALLED: Optional[str] = None


def install(native: Optional[bool] = None) -> Any:
    """Makes PyTorch allocate CUDA memory through emm; returns PyTorch's allocator
    object (``torch.cuda.memory._get_current_allocator()``).

    ``native`` picks the allocator object:

    - ``None`` (the default): emm's own, built on first use (a C++ compiler,
      PyTorch's headers and a CUDA runtime header are needed; seconds to a minute,
      once per PyTorch build), else PyTorch's pluggable allocator with an
      :class:`~emm.EmmWarning` saying why.
    - ``True``: emm's own, or :class:`emm._torch_native.NativeUnavailable`.
    - ``False``, or the environment variable ``EMM_TORCH_NATIVE=0``: PyTorch's
      pluggable allocator.

    Both run the same manager; emm's own skips the pluggable allocator's second map
    of live addresses (a heap node and a process-wide lock on every allocation and
    free), and raises ``torch.OutOfMemoryError`` with emm's reason when memory runs
    out. When PyTorch refuses the swap (it has handed out memory already),
    :class:`emm._torch_native.Refused` is raised whatever ``native`` says. A second
    call returns the allocator the first installed.

    emm's own object answers PyTorch's memory tools (``torch.cuda.memory_stats()``,
    ``empty_cache()``, ...) and ``recordStream``, and keeps a private pool of emm's
    for each CUDA graph capture (``torch.cuda.graph``, ``make_graphed_callables``),
    so the memory a graph was captured with stays the graph's, and for each
    ``torch.cuda.MemPool``: ``use_mem_pool`` routes the calling thread's tensors to
    it, its memory goes back once the pool dies and nothing in it lives
    (:func:`mem_pool_stats` reads it), and ``MemPool(allocator=X)`` keeps X's
    memory (each new block routed there is one call of X's; freed blocks stay the
    pool's until its last release, then go back to X). ``MemPool(use_on_oom=True)`` is
    refused. Under PyTorch's
    pluggable object, which cannot keep one, CUDA graph capture and
    ``torch.cuda.use_mem_pool`` raise ``RuntimeError`` instead: every replay would
    write into memory handed to other tensors. With PyTorch's pluggable object,
    ``torch.Tensor.record_stream`` and PyTorch's memory statistics are routed to
    emm in Python (``emm._torch_routes``): that object drops the first, which would
    let memory still in use on another stream be handed out again, and raises for
    the second. Either way PyTorch's allocation-history tools are pointed at emm's,
    and ``torch.cuda.memory._set_allocator_settings`` at emm's settings
    (``emm._torch_settings``: the keys that mean one of emm's are applied, the
    others refused with a message)."""
    global _INSTALLED
    torch = require("torch", "emm.torch.install()")

    if _INSTALLED is not None:
        return torch.cuda.memory._get_current_allocator()
    if native is None and os.environ.get("EMM_TORCH_NATIVE", "").strip() == "0":
        native = False
    kind = "pluggable"
    if native is not False:
        try:
            _torch_native.install(torch, load())
            kind = "native"
        except _torch_native.Refused:
            raise  # PyTorch's pluggable allocator would be refused as well
        except _torch_native.NativeUnavailable as e:
            if native:
                raise
            warnings.warn(
                f"emm.torch: emm's own allocator object is unavailable ({e}); using PyTorch's "
                "CUDAPluggableAllocator over emm instead (EMM_TORCH_NATIVE=0 skips the attempt)",
                EmmWarning,
                stacklevel=2,
            )
    if kind == "pluggable":
        alloc = torch.cuda.memory.CUDAPluggableAllocator(str(library_path()), "emm_torch_alloc", "emm_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)
    _INSTALLED = kind
    if kind == "pluggable":
        _torch_routes.route_record_stream(torch)
        _torch_routes.route_memory_stats(torch)
        _torch_routes.refuse_graph_capture(torch)
    _torch_routes.route_memory_history(torch)
    _torch_settings.route_allocator_settings(torch)
    return torch.cuda.memory._get_current_allocator()


def installed() -> Optional[str]:
    """Which allocator object :func:`install` gave PyTorch in this process: ``"native"``
    (emm's own), ``"pluggable"`` (PyTorch's CUDAPluggableAllocator), or ``None``."""
    return _INSTALLED


def memory_stats(device: Any = None) -> Dict[str, int]:
    """The manager's counters under PyTorch's ``memory_stats`` names where they mean
    the same (``allocated_bytes.all.current``, ``reserved_bytes.all.peak``,
    ``num_ooms``, ...), emm's own under ``emm.``; sorted by name as PyTorch's."""
    return dict(sorted(_torch_state.manager(device).memory_stats().items()))


def memory_allocated(device: Any = None) -> int:
    """Bytes PyTorch holds (``allocated_bytes.all.current``)."""
    return memory_stats(device).get(_n.ALLOCATED_BYTES_CURRENT, 0)


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last reset."""
    return memory_stats(device).get(_n.ALLOCATED_BYTES_PEAK, 0)


def memory_reserved(device: Any = None) -> int:
    """Bytes the manager holds from the device (``reserved_bytes.all.current``)."""
    return memory_stats(device).get(_n.RESERVED_BYTES_CURRENT, 0)


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved` since the start or the last reset."""
    return memory_stats(device).get(_n.RESERVED_BYTES_PEAK, 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Sets every peak counter to its current value."""
    _torch_state.manager(device).reset_peak_stats()


def mem_pool_stats(pool: Any, device: Any = None) -> Dict[str, int]:
    """What the private pool of a ``torch.cuda.MemPool`` (or a CUDA graph's pool,
    given as its id pair) holds on ``device`` under emm's own allocator object:
    ``uses`` (PyTorch's ``use_count``), ``live_bytes``, ``live_blocks``,
    ``reserved_bytes``, ``segments`` and the peaks of live and reserved bytes. All
    zero for a pool not in use (never made, or released by every user). A pool made
    with ``MemPool(allocator=X)`` keeps X's memory, which X counts, not emm."""
    import ctypes

    from ._lib import U64_MAX, _emit_queued, _GraphPoolInfo, _raise_last, check_uint

    pool_id = tuple(getattr(pool, "id", pool))
    if len(pool_id) != 2:
        raise ValueError(f"a pool is a torch.cuda.MemPool or an id pair, not {pool!r}")
    first = check_uint(pool_id[0], "the pool id's first half", U64_MAX)
    second = check_uint(pool_id[1], "the pool id's second half", U64_MAX)
    d = _torch_state.device_index(device)
    lib = load()
    info = _GraphPoolInfo()
    _emit_queued(lib)
    status = lib.emm_torch_graph_pool_info(d, first, second, ctypes.byref(info))
    if status != 0:
        _raise_last(lib, status)
    return {name: int(getattr(info, name)) for name, _ in _GraphPoolInfo._fields_}


def empty_cache() -> None:
    """Gives cached memory back to the device, on every device used so far: each
    device PyTorch's allocator hooks allocated on (``emm_torch_empty_cache``) and
    each one this module's functions opened. It opens no device itself."""
    from ._lib import EMM_OK, _raise_last

    lib = load()
    status = lib.emm_torch_empty_cache(-1, None)
    if status != EMM_OK:
        _raise_last(lib, status)
    for m in _torch_state.MANAGERS.values():
        m.trim()


def _fmt(n: int) -> str:
    """Bytes as PyTorch's summary writes them (``512 B``, ``1.50 MiB``)."""
    v = float(n)
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or unit == "TiB":
            break
        v /= 1024
    return f"{int(v)} {unit}" if unit == "B" else f"{v:.2f} {unit}"


def format_summary(stats: Dict[str, int], device: int = 0, manager: str = "pool") -> str:
    """A table of ``stats`` (as :func:`memory_stats` returns) laid out as PyTorch's
    ``memory_summary``."""
    g = stats.get
    width = 75
    line = "|" + "-" * width + "|"
    rule = "|" + "=" * width + "|"
    out = [rule, "|" + f"emm CUDA memory summary ({manager}), device ID {device}".center(width) + "|", line]
    out.append("|" + " Metric".ljust(23) + "| Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |")
    out.append(line)

    def row(name: str, cur: Optional[int], peak: Optional[int], alloc: Optional[int], freed: Optional[int],
            fmt: Any) -> str:
        cells = [fmt(v) if v is not None else "" for v in (cur, peak, alloc, freed)]
        return "|" + f" {name}".ljust(23) + "".join(f"| {c:>10} " for c in cells) + "|"

    def count(n: int) -> str:
        return str(n)

    out.append(row("Allocated memory", g(_n.ALLOCATED_BYTES_CURRENT), g(_n.ALLOCATED_BYTES_PEAK),
                   g(_n.ALLOCATED_BYTES_ALLOCATED), g(_n.ALLOCATED_BYTES_FREED), _fmt))
    out.append(row("Active memory", g(_n.ACTIVE_BYTES_CURRENT), g(_n.ACTIVE_BYTES_PEAK), None, None, _fmt))
    out.append(row("Reserved memory", g(_n.RESERVED_BYTES_CURRENT), g(_n.RESERVED_BYTES_PEAK), None, None,
                   _fmt))
    out.append(row("Non-releasable memory", g(_n.INACTIVE_SPLIT_BYTES_CURRENT), None, None, None, _fmt))
    out.append(row("Thread-cached memory", g(_n.THREAD_CACHED_BYTES), None, None, None, _fmt))
    out.append(line)
    out.append(row("Allocations", g(_n.ALLOCATION_CURRENT), g(_n.ALLOCATION_PEAK),
                   g(_n.ALLOCATION_ALLOCATED), g(_n.ALLOCATION_FREED), count))
    out.append(row("GPU reserved segments", g(_n.SEGMENT_CURRENT), g(_n.SEGMENT_PEAK),
                   g(_n.NUM_DEVICE_ALLOC), g(_n.NUM_DEVICE_FREE), count))
    out.append(line)
    tail = (f" Allocation retries: {g(_n.NUM_ALLOC_RETRIES, 0)}   OOMs: {g(_n.NUM_OOMS, 0)}"
            f"   Thread-cache hits: {g(_n.THREAD_CACHE_HITS, 0)}")
    out.append("|" + tail.ljust(width) + "|")
    out.append(rule)
    return "\n".join(out) + "\n"


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of :func:`memory_stats`, laid out as PyTorch's
    ``torch.cuda.memory_summary`` (``abbreviated`` is accepted and ignored)."""
    m = _torch_state.manager(device)
    return format_summary(m.memory_stats(), m.device, m.name)


def record_memory_history(enabled: Any = True, max_entries: int = 100_000, **_: Any) -> None:
    """Starts (``enabled`` true, or PyTorch's ``"all"`` / ``"state"``) or stops
    (``False`` / ``None``) recording the allocation history of the current device,
    keeping the latest ``max_entries`` events. Other PyTorch arguments (``context``,
    ``stacks``) are accepted and ignored: emm records no stack frames."""
    on = bool(enabled) and enabled != "None"
    _torch_state.manager(None).record_history(max_entries if on else 0)


def snapshot(device: Any = None) -> Dict[str, Any]:
    """The manager's segments, blocks and recorded history in PyTorch's snapshot
    format (what ``torch.cuda.memory._snapshot()`` returns)."""
    return _torch_state.snapshot(device)


def dump_snapshot(path: str, device: Any = None) -> Dict[str, Any]:
    """Pickles :func:`snapshot` to ``path`` (as
    ``torch.cuda.memory._dump_snapshot``); returns the snapshot."""
    s = snapshot(device)
    with open(path, "wb") as f:
        pickle.dump(s, f)
    return s
