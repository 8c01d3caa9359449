"""What ``emm.torch.install()`` changes in PyTorch's own namespace, so that code
written for PyTorch's allocator keeps working over emm: ``Tensor.record_stream``
and PyTorch's memory statistics under PyTorch's pluggable object (emm's own
object answers both in C++), PyTorch's allocation-history tools with either
object, and the refusal of CUDA graph capture under the pluggable object. Each
keeps PyTorch's function as ``_emm_original`` and is applied once.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any, Dict, List

from . import _torch_state
from ._lib import EMM_ERR_INVALID_ARGUMENT, EMM_OK, SIZE_MAX, _emit_queued, _raise_last, load


def _wrap(owner: Any, name: str, fn: Any, doc_prefix: str = "") -> None:
    """Puts ``fn`` in place of ``owner.name``, keeping PyTorch's function (as
    ``_emm_original``) and its docstring."""
    original = getattr(owner, name)
    fn.__doc__ = doc_prefix + (original.__doc__ or "")
    fn._emm_routed = True
    fn._emm_original = original
    setattr(owner, name, fn)


def route_record_stream(torch: Any) -> None:
    """Makes ``Tensor.record_stream(stream)`` reach emm (``emm_torch_record_stream``).

    Under a pluggable allocator PyTorch's ``recordStream`` calls a hook only C++ can
    set, so ``record_stream`` would do nothing: a tensor used on a side stream and
    freed meanwhile would be reused on its own stream while the side stream still
    works on it. With this, its free first makes its own stream wait for the side
    stream's work. Calls from PyTorch's C++ code (rather than through
    ``Tensor.record_stream``) still go nowhere; PyTorch's NCCL process group no
    longer makes them (it keeps the tensors of a collective alive until the
    collective is done instead). Memory emm did not allocate is ignored, as PyTorch's
    own allocator ignores it."""
    original = torch.Tensor.record_stream
    if getattr(original, "_emm_routed", False):
        return
    lib = load()

    def record_stream(self: Any, stream: Any) -> None:
        original(self, stream)  # PyTorch's argument checks; it records nothing here
        ptr = self.untyped_storage().data_ptr()
        if ptr == 0 or self.device.type != "cuda":
            return
        status = lib.emm_torch_record_stream(ptr, self.device.index, stream.cuda_stream)
        if status not in (EMM_OK, EMM_ERR_INVALID_ARGUMENT):
            _raise_last(lib, status)

    _wrap(torch.Tensor, "record_stream", record_stream)


NO_GRAPH_POOLS = (
    "PyTorch's pluggable allocator object over emm keeps no private memory pools for CUDA graphs or "
    "torch.cuda.MemPool: memory a graph was captured with would be handed to other tensors after the capture, "
    "and every replay would write into them. emm's own allocator object keeps them; emm.torch.install() "
    "uses it unless EMM_TORCH_NATIVE=0 or it could not be built (its warning said why)"
)
"""Why CUDA graph capture is refused under PyTorch's pluggable object over emm."""


def refuse_graph_capture(torch: Any) -> None:
    """Under PyTorch's pluggable object, which would let a capture or a
    ``torch.cuda.MemPool`` go ahead with no pool to keep its memory, makes them
    raise :data:`NO_GRAPH_POOLS` before anything of them happens:
    ``torch.cuda.graph``'s ``__enter__`` (which would otherwise make the capture
    stream current first and leave it so), ``CUDAGraph.capture_begin`` and
    ``use_mem_pool``. (emm's own object keeps a private pool for each capture.)"""
    def refusal() -> Any:
        def refused(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(NO_GRAPH_POOLS)
        return refused

    targets = [(torch.cuda.graph, "__enter__"), (torch.cuda.CUDAGraph, "capture_begin"),
               (torch.cuda.memory, "use_mem_pool")]
    for owner, name in targets:
        if hasattr(owner, name) and not getattr(getattr(owner, name), "_emm_routed", False):
            fn = refusal()
            _wrap(owner, name, fn)
            if owner is torch.cuda.memory and hasattr(torch.cuda, name):
                setattr(torch.cuda, name, fn)


def route_memory_history(torch: Any) -> None:
    """Points PyTorch's allocation-history tools at emm's:
    ``torch.cuda.memory._record_memory_history`` (either of PyTorch's forms; its
    ``max_entries``, ``device`` and ``clear_history`` are honoured) starts and stops
    emm's history of that device, and ``torch.cuda.memory._snapshot`` (which
    ``_dump_snapshot`` pickles) and ``torch.cuda.memory_snapshot`` return the
    current device's segments and history in PyTorch's format (``emm.torch.snapshot``;
    PyTorch's cover every device). Stopping drops emm's history, so take the
    snapshot first, as PyTorch's own example does. Neither of
    PyTorch's allocator objects over emm keeps a history of its own: the pluggable
    one raises, and PyTorch's snapshot types differ between its versions, which a
    compiled override would have to follow."""
    memory = torch.cuda.memory
    if getattr(memory._snapshot, "_emm_routed", False):
        return

    def _record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
        legacy = isinstance(enabled, bool)  # PyTorch's older form takes a bool first
        names = (("record_context", "trace_alloc_max_entries", "trace_alloc_record_context", "device",
                  "record_context_cpp", "clear_history") if legacy
                 else ("context", "stacks", "max_entries", "device", "clear_history"))
        given = dict(zip(names, args))
        given.update(kwargs)
        on = enabled if legacy else enabled not in (None, "None")
        max_entries = (given.get("trace_alloc_max_entries", 1) if legacy
                       else given.get("max_entries", sys.maxsize))
        m = _torch_state.manager(given.get("device"))
        if on and given.get("clear_history"):
            m.record_history(0)  # drops what was recorded
        # Context and stacks: emm records no stack frames.
        m.record_history(min(int(max_entries), SIZE_MAX) if on else 0)

    def _snapshot(device: Any = None, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        del args, kwargs  # augment_with_fx_traces, ...: emm has none to add
        return _torch_state.snapshot(device)

    def memory_snapshot(*args: Any, **kwargs: Any) -> List[Dict[str, Any]]:
        del args, kwargs  # mempool_id: emm keeps none of PyTorch's pools
        return list(_torch_state.snapshot(None)["segments"])

    prefix = "emm's allocation history in place of PyTorch's (emm.torch.install()).\n\n"
    for name, fn in (("_record_memory_history", _record_memory_history), ("_snapshot", _snapshot),
                     ("memory_snapshot", memory_snapshot)):
        _wrap(memory, name, fn, prefix)
    torch.cuda.memory_snapshot = memory.memory_snapshot


# PyTorch's memory_stats layout: arrays of statistics per pool, and single counts.
_STAT_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                "active_bytes", "inactive_split_bytes", "requested_bytes")
_POOLS = ("all", "large_pool", "small_pool")
_FIELDS = ("current", "peak", "allocated", "freed")
_OVERSIZE = ("oversize_allocations", "oversize_segments")
_COUNTS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free",
           "max_split_size")
_ACCUMULATED = ("allocated", "freed")

# The names emm is asked for: the "all" entries (emm keeps no pools of PyTorch's
# kinds) and the single counts.
_ASKED = tuple(f"{a}.all.{f}" for a in _STAT_ARRAYS for f in _FIELDS) + _COUNTS

# Each device's accumulated counts at its last reset_accumulated_memory_stats.
_RESET_BASE: Dict[int, Dict[str, int]] = {}


def _accumulated(key: str) -> bool:
    """Whether PyTorch's ``reset_accumulated_memory_stats`` zeroes ``key``."""
    return key.rsplit(".", 1)[-1] in _ACCUMULATED or (key in _COUNTS and key != "max_split_size")


def nested_stats(flat: Dict[str, int], base: Dict[str, int]) -> Dict[str, Any]:
    """emm's counters (PyTorch's flat names) in the nested layout of PyTorch's
    ``memory_stats_as_nested_dict``, every key PyTorch's tools read present (0
    where emm keeps no such count: the large and small pools' rows, the oversize
    counts), accumulated counts less ``base``."""
    def value(key: str) -> int:
        return max(0, flat.get(key, 0) - base.get(key, 0))

    out: Dict[str, Any] = {a: {p: {f: value(f"{a}.{p}.{f}") for f in _FIELDS} for p in _POOLS}
                           for a in _STAT_ARRAYS}
    out.update({o: {f: value(f"{o}.{f}") for f in _FIELDS} for o in _OVERSIZE})
    out.update({c: value(c) for c in _COUNTS})
    return out


def torch_counters(lib: Any, device: int) -> Dict[str, int]:
    """The counters of the manager behind PyTorch's allocations on ``device``
    (``emm_torch_memory_stats``: a device emm has not set up reads 0 and is not set
    up by the question), under PyTorch's flat names."""
    keys = (ctypes.c_char_p * len(_ASKED))(*(k.encode() for k in _ASKED))
    values = (ctypes.c_uint64 * len(_ASKED))()
    status = lib.emm_torch_memory_stats(device, keys, values, len(_ASKED), None)
    if status != EMM_OK:
        _raise_last(lib, status)
    return dict(zip(_ASKED, values))


def route_memory_stats(torch: Any) -> None:
    """Under PyTorch's pluggable object, whose statistics raise: makes
    ``torch.cuda.memory_stats()`` and everything built on it (``memory_allocated``,
    ``max_memory_reserved``, ``memory_summary``, ...), ``reset_peak_memory_stats``,
    ``reset_accumulated_memory_stats`` and ``empty_cache`` answer from the manager
    behind PyTorch's allocations (the first through ``memory_stats_as_nested_dict``,
    which PyTorch's ``memory_stats`` reads). As PyTorch's own, they start nothing:
    before CUDA is initialized they report nothing and do nothing, and a device
    emm has not set up reads 0. The accumulated reset is PyTorch's view:
    ``emm.torch.memory_stats()`` still counts from the start. (``torch.accelerator``'s
    statistics go through PyTorch's C++ and still raise.)"""
    memory = torch.cuda.memory
    if getattr(memory.memory_stats_as_nested_dict, "_emm_routed", False):
        return
    lib = load()

    def memory_stats_as_nested_dict(device: Any = None) -> Dict[str, Any]:
        if not torch.cuda.is_initialized():
            return {}
        d = _torch_state.device_index(device)
        _emit_queued(lib)
        return nested_stats(torch_counters(lib, d), _RESET_BASE.get(d, {}))

    def reset_peak_memory_stats(device: Any = None) -> None:
        if torch.cuda.is_initialized():
            d = _torch_state.device_index(device)
            _emit_queued(lib)
            status = lib.emm_torch_reset_peak_stats(d)
            if status != EMM_OK:
                _raise_last(lib, status)

    def reset_accumulated_memory_stats(device: Any = None) -> None:
        if torch.cuda.is_initialized():
            d = _torch_state.device_index(device)
            _RESET_BASE[d] = {k: v for k, v in torch_counters(lib, d).items() if _accumulated(k)}

    def empty_cache() -> None:
        if torch.cuda.is_initialized():
            _emit_queued(lib)
            status = lib.emm_torch_empty_cache(-1, None)
            if status != EMM_OK:
                _raise_last(lib, status)

    prefix = "emm's counters in place of PyTorch's (emm.torch.install()).\n\n"
    for name, fn in (("memory_stats_as_nested_dict", memory_stats_as_nested_dict),
                     ("reset_peak_memory_stats", reset_peak_memory_stats),
                     ("reset_accumulated_memory_stats", reset_accumulated_memory_stats),
                     ("empty_cache", empty_cache)):
        _wrap(memory, name, fn, prefix)
        if hasattr(torch.cuda, name):
            setattr(torch.cuda, name, fn)
