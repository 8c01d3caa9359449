"""Tags, pause and resume: a part of a program's GPU memory given back to the
device and taken again at the same addresses (sleep mode for RL and serving).

::

    with emm.region("weights"):
        model = build_model().cuda()
    with emm.region("kv_cache"):
        cache = allocate_kv_cache()

    emm.pause("kv_cache")                      # memory back to the device, contents dropped
    emm.pause("weights", keep="host")          # contents copied to pinned host memory first
    ...                                        # another phase uses the GPU
    emm.resume(["weights", "kv_cache"])        # same addresses; weights' bytes restored

- A region tags every allocation made while it is open: process-wide, from every
  thread and stream (autograd's backward threads included), on every device.
  Regions nest (the most recently opened one still open is current; threads may
  close theirs in any order); outside every region allocations carry
  ``"default"``.
- Tags share no physical page, so a pause gives back whole pages and touches no
  other tag's blocks. Tensors and CUDA graphs keep their addresses across a pause
  and a resume. Freeing a block while its tag is paused is allowed.
- Allocating under a paused tag, pausing ``"default"`` or a paused tag, resuming
  an active tag, pausing memory that cannot be paused (the pool without virtual
  memory management) and exporting a tagged block to another process raise
  :class:`TagStateError`.
- CUDA graphs: the memory of a graph's private pool (``torch.cuda.graph`` under
  emm's allocator object) is not tagged and is never paused; a graph captured
  before a pause replays correctly after the resume when what it reads was kept
  (``keep="host"``). A pause while a capture is in progress raises
  :class:`TagStateError` (it would synchronize the device and invalidate the
  capture).
- A pause of a tag that keeps its contents keeps its pinned host buffers after
  the resume, for the next pause (an RL loop pauses the same tensors every step:
  copies then run at the link's speed instead of pinning memory each time);
  ``torch.cuda.empty_cache()`` or a trim gives them back; ``tag_stats`` counts
  them.
- Only emm's ``pool`` manager keeps tags (``default`` and ``hostonly`` refuse a
  pause once they have allocated).
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Dict, Iterable, Iterator, List, Union

from ._lib import _check, _emit_queued, load

__all__ = ["pause", "region", "resume", "tag_stats"]

_KEEP = {"none": 0, "host": 1}


def _tag_bytes(tag: object) -> bytes:
    """``tag`` as the C ABI takes it: a str without NUL (C would read a tag cut
    at the NUL, another tag's name)."""
    if not isinstance(tag, str):
        raise TypeError(f"a tag is a str, not {type(tag).__name__}")
    if "\0" in tag:
        raise ValueError(f"a tag cannot hold a NUL character: {tag!r}")
    return tag.encode("utf-8")


def _names(tags: Union[str, Iterable[str]]) -> List[bytes]:
    if isinstance(tags, (bytes, bytearray)):
        raise TypeError(f"a tag is a str, not {type(tags).__name__}")
    if isinstance(tags, str):
        tags = [tags]
    out = [_tag_bytes(t) for t in tags]
    if not out:
        raise ValueError("no tag given")
    return out


def _array(names: List[bytes]) -> "ctypes.Array[ctypes.c_char_p]":
    return (ctypes.c_char_p * len(names))(*names)


@contextlib.contextmanager
def region(tag: str) -> Iterator[None]:
    """Tags the allocations made while the ``with`` block runs (see the module's
    documentation). Open regions form one process-wide stack: the most recently
    opened one still open is current, and a region closed out of order (another
    thread's) is taken out wherever it is."""
    name = _tag_bytes(tag)
    lib = load()
    region_id = ctypes.c_uint64()
    _emit_queued(lib)
    _check(lib, lib.emm_region_enter(name, ctypes.byref(region_id)))
    try:
        yield
    finally:
        _check(lib, lib.emm_region_exit(region_id.value))


def pause(tags: Union[str, Iterable[str]], keep: str = "none") -> Dict[str, int]:
    """Gives back to the device the memory of the blocks allocated under ``tags``
    (a name or several), on every device, keeping their addresses; with
    ``keep="host"`` their bytes are copied to pinned host memory first and come
    back with :func:`resume`. Refusals change nothing; after a driver failure in
    the middle, a tag some manager could not give its memory back to stays
    paused (``tag_stats(tag)["paused"]``) and :func:`resume` finishes the job.
    Returns ``{"bytes": given back, "copied_bytes": copied}``."""
    if keep not in _KEEP:
        raise ValueError(f"keep must be 'none' or 'host', not {keep!r}")
    names = _names(tags)
    lib = load()
    n, c = ctypes.c_size_t(), ctypes.c_size_t()
    _emit_queued(lib)
    _check(lib, lib.emm_pause(_array(names), len(names), _KEEP[keep], ctypes.byref(n), ctypes.byref(c)))
    return {"bytes": n.value, "copied_bytes": c.value}


def resume(tags: Union[str, Iterable[str]]) -> Dict[str, int]:
    """Maps fresh device memory under the paused blocks of ``tags``, at the same
    addresses, and copies back what :func:`pause` kept; then they allocate again.
    Out of device memory raises :class:`OutOfMemoryError` and leaves them paused
    (call again once memory is free). Returns ``{"bytes": mapped, "copied_bytes":
    copied back}``."""
    names = _names(tags)
    lib = load()
    n, c = ctypes.c_size_t(), ctypes.c_size_t()
    _emit_queued(lib)
    _check(lib, lib.emm_resume(_array(names), len(names), ctypes.byref(n), ctypes.byref(c)))
    return {"bytes": n.value, "copied_bytes": c.value}


def tag_stats(tag: str) -> Dict[str, int]:
    """The memory under ``tag`` over every device: ``allocated_bytes``,
    ``reserved_bytes`` (paused memory excluded), ``paused_bytes``,
    ``host_copy_bytes`` (pinned host memory held for its copies) and ``paused``
    (0 or 1)."""
    name = _tag_bytes(tag)
    lib = load()
    a, r, p, h = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    paused = ctypes.c_int()
    _emit_queued(lib)
    _check(lib, lib.emm_tag_stats(name, ctypes.byref(a), ctypes.byref(r), ctypes.byref(p),
                                  ctypes.byref(h), ctypes.byref(paused)))
    return {"allocated_bytes": a.value, "reserved_bytes": r.value, "paused_bytes": p.value,
            "host_copy_bytes": h.value, "paused": paused.value}
