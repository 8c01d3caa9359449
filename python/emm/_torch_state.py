"""What ``emm.torch`` and the routes it installs in PyTorch's namespace
(``_torch_routes.py``) share: the process's manager handle of each device (one per
device, kept), the device index PyTorch's arguments name, and emm's snapshot in
PyTorch's format. Both modules import this one; neither imports the other.
Importing it does not import PyTorch.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List

from ._lib import INT_MAX, Manager, check_uint

# The process's manager handle of each device, made on first use by :func:`manager`.
MANAGERS: Dict[int, Manager] = {}


def device_index(device: Any = None) -> int:
    """An ordinal from ``None`` (PyTorch's current device, else 0), an int, a
    ``torch.device`` or a string such as ``"cuda:1"``. An ordinal that is not an
    integer in ``0..=INT_MAX`` raises (``TypeError``, ``ValueError`` or
    ``OverflowError``) before it reaches C, where it would wrap."""
    if device is None:
        torch = sys.modules.get("torch")
        return int(torch.cuda.current_device()) if torch is not None else 0
    if isinstance(device, str):
        if ":" not in device:
            return device_index(None)
        text = device.split(":", 1)[1]
        try:
            index: Any = int(text)
        except ValueError:
            raise ValueError(f"device {device!r} names no ordinal after ':'") from None
    else:
        index = getattr(device, "index", device)
        if index is None:
            return device_index(None)
    return check_uint(index, "device", INT_MAX)


def manager(device: Any = None) -> Manager:
    """The handle on the process's manager of ``device`` (one per device, kept)."""
    d = device_index(device)
    m = MANAGERS.get(d)
    if m is None:
        m = MANAGERS[d] = Manager(device=d)
    return m


def to_torch_snapshot(raw: Dict[str, Any], device: int = 0) -> Dict[str, Any]:
    """emm's snapshot JSON (as ``Manager.snapshot()`` returns it) as PyTorch's
    snapshot dict: ``segments`` (with ``blocks``), ``device_traces`` (one list per
    device up to ``device``) and ``allocator_settings``. Live blocks are
    ``active_allocated``, free ones ``inactive``; sizes are the pool's rounded
    sizes; no stack frames are recorded."""
    segments: List[Dict[str, Any]] = []
    for seg in raw.get("segments", []):
        blocks = []
        allocated = requested = 0
        for b in seg["blocks"]:
            active = bool(b["allocated"])
            if active:
                allocated += b["size"]
                requested += b["requested_size"]
            blocks.append({
                "address": b["address"],
                "size": b["size"],
                "requested_size": b["requested_size"] if active else b["size"],
                "state": "active_allocated" if active else "inactive",
                "frames": [],
            })
        segments.append({
            "device": device,
            "address": seg["address"],
            "total_size": seg["total_size"],
            "allocated_size": allocated,
            "active_size": allocated,
            "requested_size": requested,
            "stream": seg["stream"],
            "segment_type": "large" if seg["large"] else "small",
            "segment_pool_id": (0, 0),
            "is_expandable": bool(seg["expandable"]),
            "frames": [],
            "blocks": blocks,
        })
    trace = []
    for e in raw.get("trace", []):
        entry = {
            "action": e["action"],
            "addr": e["addr"],
            "size": e["size"],
            "stream": e["stream"],
            "time_us": e["time_us"],
            "frames": [],
        }
        if e["action"] == "oom":
            entry["device_free"] = e.get("device_free", 0)
        trace.append(entry)
    device_traces: List[List[Dict[str, Any]]] = [[] for _ in range(device)]
    device_traces.append(trace)
    return {"segments": segments, "device_traces": device_traces, "allocator_settings": {}}


def snapshot(device: Any = None) -> Dict[str, Any]:
    """The manager's segments, blocks and recorded history in PyTorch's snapshot
    format (``emm.torch.snapshot``)."""
    m = manager(device)
    return to_torch_snapshot(m.snapshot(), m.device)
