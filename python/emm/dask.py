"""Dask through emm: every worker of a cluster allocates its GPU memory through emm.

:class:`EmmPlugin` is a ``distributed.WorkerPlugin`` that does on each worker what
Dask-CUDA's ``RMMSetup`` plugin does for RMM: it configures emm (:func:`emm.configure`)
and opens the manager of the worker's device, makes Numba use emm's NBEP 7 plugin
(``numba.cuda.set_memory_manager`` and ``NUMBA_CUDA_MEMORY_MANAGER``), makes CuPy
allocate through emm (:func:`emm.cupy.install`) and, when asked, makes emm RMM's
current device resource (``emm.rmm.install()``). Its ``teardown`` gives cached
memory back (a trim) and reports the manager's figures.

Three ways to put it on every worker:

- At worker start, as Dask-CUDA applies its own plugins:
  ``cluster = emm.dask.local_cuda_cluster(EmmPlugin(), protocol="tcp")`` (a
  ``dask_cuda.LocalCUDACluster`` whose workers get the plugin in their
  ``plugins=``, set up before they register with the scheduler), or
  ``distributed.Worker(plugins={EmmPlugin()})`` / ``Nanny(plugins=...)``.
- As a preload module, for workers started from the command line (one per node
  and GPU: ``dask cuda worker <scheduler> --preload emm.dask``) or
  ``LocalCUDACluster(preload=["emm.dask"])``: :func:`dask_setup` adds
  :func:`plugin_from_env` (``EMM_DASK_NUMBA``, ``EMM_DASK_CUPY``, ``EMM_DASK_RMM``;
  the manager's settings from emm's own ``EMM_*`` variables) to the plugins the
  worker sets up at start.
- On a running cluster: ``client.register_plugin(EmmPlugin())``. The scheduler
  keeps it, so workers that join later, or restart, get it too. A worker that has
  already allocated through emm keeps the configuration it started with (emm's
  settings are fixed at first use): the same settings are accepted, different ones
  raise (restart the workers with ``client.restart()`` to apply them).

:func:`worker_stats` (``client.run(emm.dask.worker_stats)``) returns each worker's
figures: device, manager, allocated and reserved bytes (current and peak),
allocation counts, which allocator CuPy, Numba and RMM use. :func:`verify_routes`
allocates through each framework the plugin set up and says whether emm served it;
:func:`trim` gives the calling thread's cached memory back.

Importing this module imports ``distributed`` when it is installed, and none of
Numba, CuPy, RMM or PyTorch. Without ``distributed`` it still imports (the
functions work in any process), and :class:`EmmPlugin` raises an ``ImportError``
naming the missing package when it is created.

Dask-CUDA's ``LocalCUDACluster`` replaces the ``plugins`` and ``env`` options of
its workers (``new_worker_spec``), so ``LocalCUDACluster(plugins=...)`` loses the
plugin and ``env=`` is not passed on: :func:`local_cuda_cluster` adds the plugin to
Dask-CUDA's own set, and environment variables reach the workers from the calling
process's environment (Nanny processes inherit it).
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
import socket
import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ._lib import EMM_ERR_ALREADY_IN_USE, EmmError, Manager, configure as _configure

try:
    from distributed import WorkerPlugin as _WorkerPlugin

    _DISTRIBUTED_ERROR: Optional[ImportError] = None
except ImportError as _e:  # distributed is optional until EmmPlugin is used
    _WorkerPlugin = object  # type: ignore[assignment,misc]
    _DISTRIBUTED_ERROR = _e

__all__ = [
    "EmmPlugin",
    "dask_setup",
    "local_cuda_cluster",
    "plugin_from_env",
    "setup_worker",
    "teardown_worker",
    "trim",
    "verify_routes",
    "worker_stats",
]

_log = logging.getLogger("emm.dask")

# The Numba plugin module NUMBA_CUDA_MEMORY_MANAGER names.
NUMBA_PLUGIN_MODULE = "emm.numba_plugin"


class _State:
    """What the plugin set up in this process (one per process: emm's managers,
    CuPy's allocator and Numba's memory manager are per process too)."""

    def __init__(self) -> None:
        self.managers: Dict[int, Manager] = {}
        self.options: Dict[str, Any] = {}
        self.cupy_allocator: Any = None
        self.cupy_path: Optional[str] = None  # what emm.cupy.install() took: "c" or "python"
        self.numba = False
        self.rmm = False
        self.set_up = False
        self.torn_down = False
        self.warnings: List[str] = []
        self.teardown: List[Dict[str, Any]] = []


_STATE = _State()


def _missing_distributed() -> ImportError:
    return ImportError(
        "emm.dask.EmmPlugin needs the `distributed` package (Dask's distributed "
        "scheduler: pip install 'emm-cuda[dask]' or pip install distributed, and dask-cuda "
        f"for GPU clusters): {_DISTRIBUTED_ERROR}"
    )


class EmmPlugin(_WorkerPlugin):  # type: ignore[misc,valid-type]
    """A Dask worker plugin: the worker allocates GPU memory through emm.

    Arguments:

    - ``manager``: emm's manager, ``"pool"`` (the default), ``"default"`` or
      ``"hostonly"``; ``None`` leaves the choice to ``EMM_MEMORY_MANAGER`` and
      :func:`emm.configure`.
    - ``numba``: Numba allocates through emm's NBEP 7 plugin (``emm.numba_plugin``).
      Numba chooses its memory manager when it creates its CUDA context, so a
      worker where Numba already made one with another manager makes ``setup``
      raise. The pool keeps its expandable segment: that module configures
      ``pool_exportable`` unless ``EMM_POOL_EXPORTABLE`` is set, so Numba's IPC
      handles of its blocks export by file descriptor (``configure={"expandable": False}`` gives
      legacy CUDA IPC handles for every block instead; add ``"pool_initial_size"``,
      bytes as an int or as text such as ``"10G"`` (the role of Dask-CUDA's
      ``rmm_pool_size``; emm's units are binary, 10 GiB here, where Dask-CUDA
      reads ``"10GB"`` as 10**10 bytes), to hold such a pool in one segment
      sized from a previous run: ``emm replay TRACE -m pool --initial-size``
      names it).
    - ``cupy``: CuPy allocates through emm (:func:`emm.cupy.install`); blocks CuPy's
      own pool cached before are given back.
    - ``rmm``: emm becomes RMM's resource of ``device`` (``emm.rmm.install``).
      Where RMM is installed, ``distributed`` allocates the CuPy arrays a worker
      receives from others as ``rmm.DeviceBuffer`` (else through Numba's
      ``cuda.to_device``): pass ``rmm=True`` there (``setup`` warns otherwise).
    - ``configure``: keyword arguments of :func:`emm.configure` (``limit``,
      ``expandable``, ``release_threshold``, ...), applied before the manager of
      ``device`` is created.
    - ``device``: the device ordinal the worker uses (0: under Dask-CUDA each
      worker sees its own GPU first in ``CUDA_VISIBLE_DEVICES``).
    - ``name``: the plugin's name on the workers (registering another plugin of the
      same name replaces it: its ``teardown`` runs, then the new ``setup``).

    The object holds only these options (it is pickled to the workers); what it
    sets up lives in the worker process.
    """

    idempotent = False

    def __init__(
        self,
        manager: Optional[str] = "pool",
        *,
        numba: bool = True,
        cupy: bool = True,
        rmm: bool = False,
        configure: Optional[Mapping[str, Any]] = None,
        device: int = 0,
        name: str = "emm",
    ) -> None:
        if _DISTRIBUTED_ERROR is not None:
            raise _missing_distributed()
        config = dict(configure or {})
        for key in ("manager", "devices"):
            if key in config:
                raise TypeError(f"configure must not hold {key!r}: it is EmmPlugin's own argument")
        self.manager = manager
        self.numba = bool(numba)
        self.cupy = bool(cupy)
        self.rmm = bool(rmm)
        self.configure = config
        self.device = device
        self.name = name
        self._active = False  # set up on this worker (the copy there)

    def __repr__(self) -> str:
        return (f"EmmPlugin(manager={self.manager!r}, numba={self.numba}, cupy={self.cupy}, "
                f"rmm={self.rmm}, configure={self.configure!r}, device={self.device}, name={self.name!r})")

    def setup(self, worker: Any = None) -> None:
        """Configures emm and routes the frameworks through it (see the class);
        raises when the worker already uses emm with other settings, or Numba
        already has a CUDA context with another memory manager."""
        self._active = False
        setup_worker(manager=self.manager, numba=self.numba, cupy=self.cupy, rmm=self.rmm,
                     configure=self.configure, device=self.device)
        self._active = True
        if worker is not None and hasattr(worker, "log_event"):
            worker.log_event("emm", {"action": "setup", "stats": _stats_of(_STATE.managers)})

    def teardown(self, worker: Any = None) -> None:
        """Collects garbage, gives the cached memory back (a trim) and records the
        manager's figures (``worker_stats()["plugin"]["teardown"]``, the worker's
        log, and the scheduler's ``emm`` events). Does nothing where ``setup``
        failed (a plugin refused for conflicting settings leaves the one in effect
        alone)."""
        if not getattr(self, "_active", False):
            return
        self._active = False
        report = teardown_worker()
        if worker is not None and hasattr(worker, "log_event"):
            try:
                worker.log_event("emm", {"action": "teardown", "stats": report})
            except Exception:  # the worker may be closing: the log has it
                pass


def setup_worker(
    manager: Optional[str] = "pool",
    *,
    numba: bool = True,
    cupy: bool = True,
    rmm: bool = False,
    configure: Optional[Mapping[str, Any]] = None,
    device: int = 0,
) -> Dict[str, Any]:
    """What :meth:`EmmPlugin.setup` does, in any process (no Dask needed); returns
    :func:`worker_stats` afterwards. Calling it again with the same settings is
    harmless."""
    config = dict(configure or {})
    opts = {"manager": manager, "numba": numba, "cupy": cupy, "rmm": rmm, "configure": config, "device": device}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if numba:
            os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = NUMBA_PLUGIN_MODULE
            # Before the manager is made below: the pool's pieces become exportable.
            _numba_plugin_module().ask_exportable()
        try:
            mgr = _configure(manager, devices=[device], **config)[0]
        except EmmError as e:
            if e.code != EMM_ERR_ALREADY_IN_USE:
                raise
            raise RuntimeError(
                f"emm already serves memory in this process (pid {os.getpid()}) with other settings than "
                f"EmmPlugin({manager=}, configure={config}) asks for, and its settings are fixed at first use: "
                "register the plugin before anything on the worker allocates through emm (at worker start: "
                "emm.dask.local_cuda_cluster(plugin) or Worker(plugins=...)), or restart the workers "
                f"(client.restart()) so the registered plugin sets them up afresh. emm said: {e}"
            ) from e
        old = _STATE.managers.get(device)
        _STATE.managers[device] = mgr
        if old is not None:
            old.close()
        if numba:
            _route_numba()
        if cupy:
            _route_cupy(device)
        if rmm:
            _route_rmm(device)
        elif importlib.util.find_spec("rmm") is not None:
            warnings.warn(
                "RMM is installed but EmmPlugin(rmm=False): distributed deserializes CuPy arrays received "
                "from other workers into rmm.DeviceBuffer (RMM's current resource), so those allocations "
                "bypass emm; pass rmm=True", stacklevel=2)
    _STATE.options = opts
    _STATE.numba, _STATE.rmm = numba, rmm
    _STATE.set_up, _STATE.torn_down = True, False
    _STATE.warnings = [str(w.message) for w in caught]
    for message in _STATE.warnings:
        _log.warning("emm on pid %d: %s", os.getpid(), message)
    return worker_stats()


def teardown_worker() -> List[Dict[str, Any]]:
    """What :meth:`EmmPlugin.teardown` does: a garbage collection, then each device's
    manager gives its cached memory back; returns each device's figures after
    (also kept in ``worker_stats()["plugin"]["teardown"]``).

    The worker goes on allocating through emm afterwards: emm's configuration and
    the memory manager of Numba's existing context cannot be changed in a running
    process (restart the worker for that)."""
    gc.collect()
    released = {d: m.trim() for d, m in _STATE.managers.items() if not m.closed}
    report = _stats_of(_STATE.managers)
    for entry in report:
        entry["trimmed_bytes"] = released.get(entry["device"], 0)
        _log.info("emm on pid %d, device %d (%s): allocated %d B (peak %d), reserved %d B (peak %d), "
                  "%d allocations, %d from the driver; trim gave back %d B", os.getpid(), entry["device"],
                  entry["manager"], entry["allocated_bytes"], entry["allocated_bytes_peak"],
                  entry["reserved_bytes"], entry["reserved_bytes_peak"], entry["allocations"],
                  entry["upstream_allocs"], entry["trimmed_bytes"])
    _STATE.teardown = report
    _STATE.torn_down = True
    return report


def _numba_plugin_module() -> Any:
    if importlib.util.find_spec("numba") is None:
        raise ImportError("EmmPlugin(numba=True) needs Numba (numba-cuda) on the worker; pass numba=False")
    return importlib.import_module(NUMBA_PLUGIN_MODULE)


def _numba_contexts() -> List[Any]:
    """Numba's existing CUDA contexts (none created here)."""
    drv = sys.modules.get("numba.cuda.cudadrv.driver")
    if drv is None:
        return []
    devices = getattr(getattr(drv, "driver", None), "devices", None) or {}
    return [c for c in (getattr(d, "primary_context", None) for d in list(devices.values())) if c is not None]


def _route_numba() -> None:
    plugin = _numba_plugin_module()
    from numba import cuda

    others = [c for c in _numba_contexts()
              if not isinstance(getattr(c, "memory_manager", None), plugin.EmmNumbaManager)]
    if others:
        kinds = sorted({type(getattr(c, "memory_manager", None)).__name__ for c in others})
        raise RuntimeError(
            f"Numba already has a CUDA context in this process (pid {os.getpid()}) with memory manager "
            f"{', '.join(kinds)}; Numba chooses it when it creates the context, so its allocations would "
            "not go through emm. Register the plugin before the worker uses Numba (at worker start: "
            "emm.dask.local_cuda_cluster(plugin) or Worker(plugins=...)), restart the workers, or pass "
            "numba=False."
        )
    cuda.set_memory_manager(plugin.EmmNumbaManager)


def _route_cupy(device: int) -> None:
    if importlib.util.find_spec("cupy") is None:
        raise ImportError("EmmPlugin(cupy=True) needs CuPy on the worker; pass cupy=False")
    import cupy

    from . import cupy as emm_cupy

    with cupy.cuda.Device(device):
        _STATE.cupy_path = emm_cupy.install()
        # Blocks CuPy's own pool cached before go back to the device.
        cupy.get_default_memory_pool().free_all_blocks()
    get = getattr(cupy.cuda, "get_allocator", None)
    _STATE.cupy_allocator = get() if get is not None else None


def _route_rmm(device: int) -> None:
    # emm.rmm is part of this package; without RMM its install() raises an
    # ImportError naming the extra to install.
    importlib.import_module("emm.rmm").install(device=device)


def _stats_of(managers: Mapping[int, Manager]) -> List[Dict[str, Any]]:
    out = []
    for device, m in sorted(managers.items()):
        if m.closed:
            continue
        entry: Dict[str, Any] = {"device": device, "manager": m.name}
        entry.update(m.stats())
        entry["free"], entry["total"] = m.memory_info()
        out.append(entry)
    return out


def _cupy_route() -> Optional[str]:
    """``"emm"`` when CuPy's current allocator is the one the plugin (or
    :func:`emm.cupy.install`) installed, ``"other"`` when not, ``None`` when CuPy is
    not imported."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    get = getattr(cupy.cuda, "get_allocator", None)
    if get is None:
        return "unknown"
    current = get()
    emm_cupy = sys.modules.get("emm.cupy")
    if current is not None and (
        (_STATE.cupy_allocator is not None and current == _STATE.cupy_allocator)
        or (emm_cupy is not None and current == getattr(emm_cupy, "allocator", None))
    ):
        return "emm"
    return "other"


def _numba_route() -> Optional[str]:
    """The class name of the memory manager of Numba's contexts (or the one Numba
    will use for its first context); ``None`` when Numba's CUDA driver module is not
    imported."""
    drv = sys.modules.get("numba.cuda.cudadrv.driver")
    if drv is None:
        return None
    names = sorted({type(getattr(c, "memory_manager", None)).__name__ for c in _numba_contexts()})
    if names:
        return ",".join(names)
    chosen = getattr(drv, "_memory_manager", None)
    if chosen is not None:
        return str(getattr(chosen, "__name__", chosen))
    env = os.environ.get("NUMBA_CUDA_MEMORY_MANAGER", "default")
    return f"not chosen yet (NUMBA_CUDA_MEMORY_MANAGER={env})"


def _rmm_route() -> Optional[str]:
    """``"emm"`` when RMM's current device resource is the one ``emm.rmm.install``
    set, else the resource's class name; ``None`` when RMM is not imported."""
    rmm = sys.modules.get("rmm")
    if rmm is None:
        return None
    try:
        current = rmm.mr.get_current_device_resource()
    except Exception as e:  # pragma: no cover - rmm without a device
        return f"unknown ({e})"
    emm_rmm = sys.modules.get("emm.rmm")
    if emm_rmm is not None and any(current is r for r in emm_rmm.installed().values()):
        return "emm"
    return type(current).__name__


def worker_stats(devices: Optional[Sequence[int]] = None, dask_worker: Any = None) -> Dict[str, Any]:
    """This process's emm figures, as plain data (JSON-ready); for
    ``client.run(emm.dask.worker_stats)``, which passes ``dask_worker``.

    ``devices``: whose managers to report; by default those the plugin set up (none
    before it ran: asking for a device opens its manager, which fixes emm's
    configuration). Each device's entry: ``device``, ``manager`` (its name),
    ``allocated_bytes``, ``allocated_bytes_peak``, ``reserved_bytes``,
    ``reserved_bytes_peak``, ``allocations`` (served, all threads), ``upstream_allocs``
    (from the driver), ``free`` and ``total`` (the device's), ``report`` (every
    counter, one line). Besides: ``pid``, ``host``, ``worker`` (address) and
    ``name``, ``cuda_visible_devices``, ``cupy`` (``"emm"``, ``"other"`` or ``None``:
    not imported), ``cupy_path`` (``"c"`` or ``"python"``: how ``emm.cupy`` hooked
    in), ``numba`` (the memory manager's class), ``rmm`` (``"emm"``, or the current
    device resource's class), and ``plugin`` (options, set up or torn down,
    warnings, the teardown's figures).
    """
    if devices is None:
        managers: Dict[int, Manager] = dict(_STATE.managers)
    else:
        managers = {}
        for d in devices:
            m = _STATE.managers.get(d)
            managers[d] = m if m is not None and not m.closed else Manager(None, d)
    entries = _stats_of(managers)
    for entry in entries:
        entry["report"] = managers[entry["device"]].report()
    out: Dict[str, Any] = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "worker": getattr(dask_worker, "address", None),
        "name": None if dask_worker is None else str(getattr(dask_worker, "name", "")),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "devices": entries,
        "cupy": _cupy_route(),
        "cupy_path": _STATE.cupy_path,
        "numba": _numba_route(),
        "rmm": _rmm_route(),
        "plugin": {
            "set_up": _STATE.set_up,
            "torn_down": _STATE.torn_down,
            "options": dict(_STATE.options),
            "warnings": list(_STATE.warnings),
            "teardown": list(_STATE.teardown),
        },
    }
    return out


def trim(dask_worker: Any = None) -> Dict[int, int]:
    """A garbage collection, then each manager the plugin opened gives its cached
    memory back; returns the bytes released per device. The pool's per-thread
    caches are flushed for the calling thread only (``client.run`` runs on the
    worker's event-loop thread; submit a task to reach its executor thread)."""
    gc.collect()
    return {d: m.trim() for d, m in sorted(_STATE.managers.items()) if not m.closed}


def verify_routes(size: int = 1 << 20, dask_worker: Any = None) -> Dict[str, Optional[bool]]:
    """Allocates ``size`` bytes through each framework the plugin routed (CuPy,
    Numba, RMM) on its device and says whether emm served it (its allocation count
    went up); ``None`` for a framework it did not set up."""
    out: Dict[str, Optional[bool]] = {"cupy": None, "numba": None, "rmm": None}
    if not _STATE.managers:
        return out
    device, mgr = sorted(_STATE.managers.items())[0]
    opts = _STATE.options

    def served(make: Any) -> bool:
        before = mgr.stats()["allocations"]
        obj = make()
        after = mgr.stats()["allocations"]
        del obj
        return after > before

    if opts.get("cupy"):
        import cupy

        with cupy.cuda.Device(device):
            out["cupy"] = served(lambda: cupy.empty(size, dtype=cupy.uint8))
    if opts.get("numba"):
        from numba import cuda

        with cuda.gpus[device]:
            out["numba"] = served(lambda: cuda.device_array(size, dtype="u1"))
    if opts.get("rmm"):
        import rmm

        out["rmm"] = served(lambda: rmm.DeviceBuffer(size=size))
    return out


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: expected 0 or 1")


def plugin_from_env() -> "EmmPlugin":
    """An :class:`EmmPlugin` configured by the environment: ``EMM_DASK_NUMBA``
    (default 1), ``EMM_DASK_CUPY`` (default 1) and ``EMM_DASK_RMM`` (default 0) say
    which frameworks to route; the manager and its settings are emm's own variables
    (``EMM_MEMORY_MANAGER``, ``EMM_POOL_LIMIT``, ``EMM_POOL_EXPANDABLE``, ...)."""
    return EmmPlugin(None, numba=_env_flag("EMM_DASK_NUMBA", True), cupy=_env_flag("EMM_DASK_CUPY", True),
                     rmm=_env_flag("EMM_DASK_RMM", False))


async def dask_setup(worker: Any) -> None:
    """Dask's preload hook (``--preload emm.dask``, ``preload=["emm.dask"]``): the
    worker sets :func:`plugin_from_env` up with its other start-up plugins, after
    the preloads (so after Dask-CUDA's ``dask_cuda.initialize`` has made the CUDA
    context) and before it registers with the scheduler. Preload arguments are
    ignored (Dask-CUDA passes its own to every preload)."""
    if not hasattr(worker, "plugin_add"):
        raise TypeError(f"emm.dask is a worker preload (--preload), not one for a {type(worker).__name__}")
    plugin = plugin_from_env()
    pending = getattr(worker, "_pending_plugins", None)
    if pending is not None:
        # distributed's Worker sets these up in start_unsafe, after the preloads.
        worker._pending_plugins = tuple(pending) + (plugin,)
    else:  # another distributed: set it up now
        await worker.plugin_add(plugin=plugin, catch_errors=False)


def local_cuda_cluster(plugin: Optional["EmmPlugin"] = None, **kwargs: Any) -> Any:
    """A ``dask_cuda.LocalCUDACluster(**kwargs)`` (one worker per GPU) whose workers
    set ``plugin`` (default: ``EmmPlugin()``) up at start, before they register with
    the scheduler: the way Dask-CUDA applies its ``RMMSetup`` plugin.

    Dask-CUDA sets each worker's ``plugins`` (and ``env``) itself, so a ``plugins=``
    argument would be dropped; this adds ``plugin`` to Dask-CUDA's set. Environment
    variables for the workers (``NCCL_*``, ``EMM_*``) must be in this process's
    environment when the cluster starts: the worker processes inherit it."""
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError as e:
        raise ImportError(f"emm.dask.local_cuda_cluster needs the `dask-cuda` package: {e}") from e
    if plugin is None:
        plugin = EmmPlugin()
    if "plugins" in kwargs:
        raise TypeError("LocalCUDACluster replaces its workers' plugins: pass the plugin as `plugin`")

    class EmmLocalCUDACluster(LocalCUDACluster):  # type: ignore[misc,valid-type]
        """LocalCUDACluster whose workers set emm up at start."""

        def new_worker_spec(self) -> Dict[str, Any]:
            spec: Dict[str, Any] = super().new_worker_spec()
            for s in spec.values():
                options = s.setdefault("options", {})
                options["plugins"] = set(options.get("plugins") or ()) | {plugin}
            return spec

    return EmmLocalCUDACluster(**kwargs)
