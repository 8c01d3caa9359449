"""``emm.replay``: what ``emm replay --json`` reports, as Python objects, so a
notebook never shells out. It runs the ``emm`` program of this installation (the
wheel's, or a checkout's newest build), which keeps the replay out of the C ABI."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, Iterable, List, Optional, Union

from . import _install

PathLike = Union[str, "os.PathLike[str]"]


def replay(
    traces: Union[PathLike, Iterable[PathLike], None] = None,
    managers: Optional[Iterable[str]] = None,
    passes: Optional[int] = None,
    device_memory: Union[int, str, None] = None,
    fit: bool = False,
    as_fraction: bool = False,
    overhead: Union[int, str, None] = None,
    pytorch_conf: Optional[str] = None,
    device_lag: int = 0,
    timeout: Optional[float] = None,
) -> Dict[str, Any]:
    """Replays allocation traces (PyTorch snapshots, RMM logs, emm's CSV; none:
    the bundled GPT training trace) through emm's managers and the models of
    PyTorch's allocator, as ``emm replay --json`` does, and returns its document:
    ``doc["traces"][i]["managers"]`` (``peak_reserved_bytes``,
    ``reserved_over_live``, ``failed``, ...), ``["fit"]`` with ``fit=True``, and
    ``doc["exit_status"]`` (1 when a manager failed or did not fit, as the command)
    and ``doc["messages"]`` (what the command said on stderr).

    ``managers``: names among ``default``, ``pool``, ``hostonly``,
    ``pytorch-native``, ``pytorch-expandable`` (default: all). ``passes``: exactly
    that many (default: until the footprint holds). ``device_memory``: bytes, or a
    size such as ``"24G"``. ``as_fraction``: with ``device_memory`` or ``fit``, cap
    the PyTorch models as ``torch.cuda.set_per_process_memory_fraction`` does
    rather than as a device of that size. ``device_lag``: over the host stand-in,
    the pool's events complete that many requests after they are recorded, as on
    a GPU running behind the host (``--device-lag``). Raises ``ValueError`` for arguments the command refuses
    and ``FileNotFoundError`` when this installation has no ``emm`` program."""
    exe = _install.binary()
    if exe is None:
        raise FileNotFoundError(
            "emm.replay needs the `emm` program of emm-cuda's wheel (or, in a checkout, "
            "`cargo build --release -p emm-cli`), and none was found"
        )
    if traces is None:
        paths: List[str] = []
    elif isinstance(traces, (str, os.PathLike)):
        paths = [os.fspath(traces)]
    else:
        paths = [os.fspath(t) for t in traces]
    args: List[str] = [str(exe), "replay", "--json", *paths]
    # One name is a list of one, as for ``traces`` (a str would otherwise be
    # taken letter by letter).
    for m in [managers] if isinstance(managers, str) else managers or ():
        args += ["-m", str(m)]
    if passes is not None:
        args += ["--passes", str(int(passes))]
    if device_memory is not None:
        args += ["--device-memory", str(device_memory)]
    if fit:
        args.append("--fit")
    if as_fraction:
        args.append("--as-fraction")
    if overhead is not None:
        args += ["--overhead", str(overhead)]
    if pytorch_conf is not None:
        args += ["--pytorch-conf", pytorch_conf]
    if device_lag:
        args += ["--device-lag", str(int(device_lag))]
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    messages = [line for line in p.stderr.splitlines() if line.strip()]
    if p.returncode == 2 or not p.stdout.strip():
        raise ValueError(
            f"emm replay refused the request (exit status {p.returncode}): "
            + ("; ".join(messages) or "no output")
        )
    doc: Dict[str, Any] = json.loads(p.stdout)
    doc["exit_status"] = p.returncode
    doc["messages"] = messages
    return doc
