"""RMM through emm: ``emm.rmm.install()`` makes emm RMM's device memory resource.

RMM's Python package (``rmm``, RAPIDS Memory Manager) allocates through a memory
resource per device. :func:`install` sets, for one device, an
``rmm.mr.CallbackMemoryResource`` whose two callbacks are emm's allocation and free
(:func:`callbacks`), so ``rmm.DeviceBuffer``, ``rmm.allocators.cupy``,
``rmm.allocators.numba`` and every RAPIDS library built on RMM (cuDF, cuML, ...)
get their device memory from emm's manager of that device: the process's (``pool``
unless ``emm.configure`` or ``EMM_MEMORY_MANAGER`` names another), shared with
emm's other users. RMM's adaptors compose over it as over any resource, e.g.
``rmm.mr.StatisticsResourceAdaptor(emm.rmm.install())``.

Importing this module does not import RMM; :func:`resource` and :func:`install` do,
and raise ``ModuleNotFoundError`` naming the ``rmm`` package when it is missing.

Streams: RMM passes each callback the stream of the request
(``rmm.pylibrmm.stream.Stream``); memory is allocated ordered on it, and freed
ordered on the stream RMM frees on (a ``DeviceBuffer`` frees on its own stream).
RMM's ``DEFAULT_STREAM`` (handle 0) is CUDA's legacy default stream.

Errors: emm's :class:`emm.OutOfMemoryError` is a ``MemoryError``, which RMM turns
into a C++ ``rmm::out_of_memory`` and its callers back into a ``MemoryError``
(with emm's message: requested, free and total bytes); other failures reach RMM's
callers as ``RuntimeError``. RMM cannot take an exception from a free (its C++
``deallocate`` is ``noexcept``; an exception left there surfaces later as an
unrelated ``SystemError``), so a failing free is reported through
``sys.unraisablehook`` (printed by default) and not raised.

Cost: every allocation and free is a call into Python (RMM's callback resource) and
one into emm's C library (ctypes); ``python/gpu/benchmarks/rmm_bench.py`` measures it beside
RMM's own resources, and ``docs/rmm.md`` records the figures. C++ users of RMM use
the compiled adaptor ``emm/rmm_resource.hpp`` instead (no Python on the path).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Tuple

from ._lib import INT_MAX, Manager, check_uint
from ._require import missing

__all__ = [
    "callbacks",
    "install",
    "installed",
    "resource",
    "uninstall",
    "using",
]

# CUstream of the legacy default stream. A free ordered on "stream 0" goes there:
# emm_free reads a null stream as "the stream the block was allocated on".
_LEGACY_STREAM = 1

_finalizing = sys.is_finalizing


class _Installed(NamedTuple):
    resource: Any  # rmm.mr.CallbackMemoryResource
    manager: Manager
    previous: Any  # the resource this device had before emm's


# device -> what install() set there (and what it replaced).
_installed: Dict[int, _Installed] = {}


class _Unraisable:
    """Hands an exception to ``sys.unraisablehook`` (Python calls the hook for an
    exception raised by ``__del__``): the one way to report from a callback whose
    caller cannot take an exception."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __del__(self) -> None:
        raise self.exc


def _report(exc: BaseException) -> None:
    _Unraisable(exc)  # reported when the temporary goes, at once (reference counting)


def _import_rmm() -> Any:
    try:
        import rmm.mr
    except ImportError as e:
        raise missing("rmm", "emm.rmm", e) from e
    return rmm


def callbacks(manager: Manager) -> Tuple[Callable[[int, Any], int], Callable[[int, int, Any], None]]:
    """The ``(allocate, deallocate)`` pair ``rmm.mr.CallbackMemoryResource`` takes,
    over ``manager`` (an :class:`emm.Manager`; it stays alive while they do).

    ``allocate(nbytes, stream)`` returns the address of ``nbytes`` bytes ordered on
    ``stream`` (any object with ``__cuda_stream__``, as RMM's ``Stream``); it raises
    :class:`emm.OutOfMemoryError` (a ``MemoryError``) when the device is full.
    ``deallocate(ptr, nbytes, stream)`` frees ``ptr`` ordered on ``stream`` and never
    raises: a failure (a pointer emm did not hand out through ``manager``, a closed
    manager) goes to ``sys.unraisablehook``. Neither needs RMM.
    """
    alloc, free = manager.alloc, manager.free

    def allocate(nbytes: int, stream: Any) -> int:
        return alloc(nbytes, stream.__cuda_stream__()[1])

    def deallocate(ptr: int, nbytes: int, stream: Any) -> None:
        if _finalizing():
            return  # the library may be unloaded; the driver frees with the context
        try:
            free(ptr, stream.__cuda_stream__()[1] or _LEGACY_STREAM)
        except Exception as e:  # RMM's deallocate is noexcept: report, do not raise
            _report(e)

    return allocate, deallocate


def _current_device() -> int:
    from cuda.bindings import runtime  # a dependency of rmm

    err, device = runtime.cudaGetDevice()
    if err != runtime.cudaError_t.cudaSuccess:
        raise RuntimeError(f"emm.rmm: cudaGetDevice failed: {err!r}")
    return int(device)


def _manager_and_device(manager: Optional[Manager], device: Optional[int]) -> Tuple[Manager, int]:
    if manager is not None:
        if not isinstance(manager, Manager):
            raise TypeError(f"manager must be an emm.Manager or None, not {type(manager).__name__}")
        if device is not None and check_uint(device, "device", INT_MAX) != manager.device:
            raise ValueError(f"device {device} given with a manager of device {manager.device}")
        return manager, manager.device
    if device is None:
        device = _current_device()
    device = check_uint(device, "device", INT_MAX)
    return Manager(None, device), device


def resource(manager: Optional[Manager] = None, device: Optional[int] = None) -> Any:
    """A new ``rmm.mr.CallbackMemoryResource`` over emm, not installed anywhere: for
    ``mr=`` arguments and RMM's adaptors.

    ``manager``: the :class:`emm.Manager` to allocate from; ``None``: a new handle
    on the manager of ``device`` (``None``: CUDA's current device). Raises
    ``ModuleNotFoundError`` (name ``"rmm"``) when RMM is missing, ``ValueError`` when
    ``device`` disagrees with ``manager.device``.
    """
    rmm = _import_rmm()
    manager, _ = _manager_and_device(manager, device)
    allocate, deallocate = callbacks(manager)
    return rmm.mr.CallbackMemoryResource(allocate, deallocate)


def install(manager: Optional[Manager] = None, device: Optional[int] = None) -> Any:
    """Makes emm RMM's memory resource of one device (``rmm.mr.set_per_device_resource``);
    returns the resource (an ``rmm.mr.CallbackMemoryResource``).

    ``device``: the CUDA device (``None``: the current one, or ``manager.device``);
    ``manager``: as for :func:`resource`. For several devices call it once per
    device. Installing again on a device where emm is installed returns the resource
    in place when ``manager`` is ``None``, else replaces it (:func:`uninstall` still
    restores what the device had before emm). Allocations made before stay with the
    resource that made them (RMM's buffers keep their resource).
    """
    rmm = _import_rmm()
    if manager is None and device is None:
        device = _current_device()
    if manager is None and device is not None:
        done = _installed.get(check_uint(device, "device", INT_MAX))
        if done is not None:
            return done.resource
    manager, device = _manager_and_device(manager, device)
    allocate, deallocate = callbacks(manager)
    mr = rmm.mr.CallbackMemoryResource(allocate, deallocate)
    done = _installed.get(device)
    previous = done.previous if done is not None else rmm.mr.get_per_device_resource(device)
    rmm.mr.set_per_device_resource(device, mr)
    _installed[device] = _Installed(mr, manager, previous)
    return mr


def uninstall(device: Optional[int] = None) -> None:
    """Gives each device where emm is installed (``device``: that one only) back the
    resource it had before :func:`install`. Buffers allocated through emm stay valid
    and are freed through emm when they go. Does nothing where emm is not installed;
    where RMM's resource was changed since (``rmm.reinitialize``,
    ``set_per_device_resource``), that resource stays and emm only forgets its own.
    """
    if device is None:
        devices = list(_installed)
    else:
        devices = [check_uint(device, "device", INT_MAX)]
    if not any(d in _installed for d in devices):
        return
    rmm = _import_rmm()
    for d in devices:
        done = _installed.pop(d, None)
        if done is not None and rmm.mr.get_per_device_resource(d) is done.resource:
            rmm.mr.set_per_device_resource(d, done.previous)


def installed() -> Dict[int, Any]:
    """The devices where emm is installed, each with its resource."""
    return {d: i.resource for d, i in _installed.items()}


@contextmanager
def using(manager: Optional[Manager] = None, device: Optional[int] = None) -> Iterator[Any]:
    """``with emm.rmm.using() as mr:`` installs emm (as :func:`install`) for the
    block, and afterwards gives the device the resource it had when the block began
    (emm's, when emm was installed already)."""
    rmm = _import_rmm()
    if manager is not None:
        manager, key = _manager_and_device(manager, device)
    else:
        key = _current_device() if device is None else check_uint(device, "device", INT_MAX)
    was = _installed.get(key)
    mr = install(manager, key)
    try:
        yield mr
    finally:
        if was is None:
            uninstall(key)
        else:
            rmm.mr.set_per_device_resource(key, was.resource)
            _installed[key] = was
