"""MemArray from Python: a typed n-dimensional array on emm with DLPack export.

    a = emm.array.MemArray((4, 8), "float32")      # memory from emm's manager of device 0
    t = torch.from_dlpack(a)                         # zero copy, on the current side
    a.to_device(); c = cupy.from_dlpack(a)           # same pointer as the array's

Supported dtypes: int8/16/32/64, uint8/16/32/64, float32/64; ranks 1 to 4. A
mutation while a lock (an explicit one, or a DLPack export that has not been
released) lives raises ``EmmError`` instead of corrupting data. Extents, indices,
streams and integer values are checked before they reach C: negative ones raise
``ValueError``, ones too large for their C type ``OverflowError``.

The library's queued warnings (see :func:`emm.take_warnings`) are raised before an
array is made, moved, locked, unlocked or exported, as before a manager's calls;
element reads and writes, like allocations, stay one C call each.
"""

from __future__ import annotations

import ctypes
import operator
from typing import Any, Dict, Optional, Sequence, Tuple, Type, Union

from ._lib import (
    INT_MAX,
    POINTER_MAX,
    SIZE_MAX,
    U64_MAX,
    EmmError,
    Manager,
    _check,
    _emit_queued,
    _Owner,
    check_uint,
    load,
)

__all__ = ["DTYPES", "MemArray"]

DTYPES: Dict[str, Tuple[int, int, Type[Any]]] = {
    "int8": (0, 8, ctypes.c_int8), "int16": (0, 16, ctypes.c_int16), "int32": (0, 32, ctypes.c_int32),
    "int64": (0, 64, ctypes.c_int64), "uint8": (1, 8, ctypes.c_uint8), "uint16": (1, 16, ctypes.c_uint16),
    "uint32": (1, 32, ctypes.c_uint32), "uint64": (1, 64, ctypes.c_uint64), "float32": (2, 32, ctypes.c_float),
    "float64": (2, 64, ctypes.c_double),
}

_api = ctypes.pythonapi
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR]
_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_NAME_V = b"dltensor_versioned"
_NAME = b"dltensor"


def _destroy(capsule: int, name: bytes, versioned: int) -> None:
    # Runs when the capsule dies: only an unconsumed capsule still owns the tensor.
    if _is_valid(capsule, name):
        ptr = _get_pointer(capsule, name)
        load().emm_dlpack_delete(ptr, versioned)


@_DESTRUCTOR
def _destroy_versioned(capsule: int) -> None:
    _destroy(capsule, _NAME_V, 1)


@_DESTRUCTOR
def _destroy_legacy(capsule: int) -> None:
    _destroy(capsule, _NAME, 0)


def _value_range(dtype: str) -> Optional[Tuple[int, int]]:
    kind, bits, _ = DTYPES[dtype]
    if kind == 0:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if kind == 1:
        return 0, 2**bits - 1
    return None


class MemArray(_Owner):
    """A typed array with a host mirror and a device copy from an emm manager."""

    _destroy = "emm_array_destroy"
    dtype: str
    shape: Tuple[int, ...]

    def __init__(self, shape: Union[int, Sequence[int]], dtype: str = "float32", device: int = 0,
                 manager: Optional[Manager] = None, host_only: bool = False) -> None:
        """A zeroed array of ``shape`` (1 to 4 extents) and ``dtype`` (see
        :data:`DTYPES`); its memory comes from ``manager`` (default: the process's
        manager of ``device``), or from the host heap with ``host_only``."""
        if dtype not in DTYPES:
            raise EmmError(1, f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
        dims = (shape,) if not isinstance(shape, (tuple, list)) else tuple(shape)
        shape = tuple(check_uint(s, f"shape[{i}]", SIZE_MAX) for i, s in enumerate(dims))
        if not 1 <= len(shape) <= 4:
            raise EmmError(1, f"unsupported rank {len(shape)}: arrays have 1 to 4 dimensions")
        device = check_uint(device, "device", INT_MAX)
        self._lib = lib = load()
        self.dtype, self.shape = dtype, shape
        code, bits, self._ctype = DTYPES[dtype]
        self._range = _value_range(dtype)
        self._manager = None if host_only else (manager or Manager(None, device))
        mh = self._manager._handle() if self._manager is not None else None
        cdims = (ctypes.c_size_t * len(shape))(*shape)
        h = ctypes.c_void_p()
        _emit_queued(lib)
        _check(lib, lib.emm_array_create(mh, code, bits, len(shape), cdims, ctypes.byref(h)))
        self._h = h.value

    def _info(self) -> Tuple[int, str, Tuple[int, int]]:
        h = self._handle()
        data, side, dt, di = ctypes.c_uint64(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _check(self._lib, self._lib.emm_array_info(h, ctypes.byref(data), ctypes.byref(side), ctypes.byref(dt),
                                                   ctypes.byref(di)))
        return data.value, ("device" if side.value else "host"), (dt.value, di.value)

    @property
    def data_ptr(self) -> int:
        """The raw pointer of the current side."""
        return self._info()[0]

    @property
    def side(self) -> str:
        """``"host"`` or ``"device"``."""
        return self._info()[1]

    def _move(self, side: int, stream: int, wait: bool) -> bool:
        s = check_uint(stream or 0, "stream", POINTER_MAX)
        h = self._handle()
        moved = ctypes.c_int()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_array_move(h, side, s or None, int(bool(wait)), ctypes.byref(moved)))
        return bool(moved.value)

    def to_device(self, stream: int = 0, wait: bool = True) -> bool:
        """Moves the data to the device ordered on ``stream`` (returns False when it
        was there already)."""
        return self._move(1, stream, wait)

    def to_host(self, stream: int = 0, wait: bool = True) -> bool:
        """Moves the data to the host ordered on ``stream`` (returns False when it
        was there already)."""
        return self._move(0, stream, wait)

    def _index(self, idx: Union[int, Sequence[int]]) -> Tuple[Any, int]:
        if isinstance(idx, tuple):
            parts = idx
        else:
            try:
                parts = (operator.index(idx),)
            except TypeError:
                parts = tuple(idx)
        if len(parts) != len(self.shape):
            raise IndexError(f"{len(parts)} indices for an array of rank {len(self.shape)}")
        checked = [check_uint(v, f"index[{k}]", SIZE_MAX) for k, v in enumerate(parts)]
        return (ctypes.c_size_t * len(checked))(*checked), len(checked)

    def __getitem__(self, idx: Union[int, Sequence[int]]) -> Union[int, float]:
        """The element at ``idx`` (one non-negative index per dimension)."""
        i, n = self._index(idx)
        h = self._handle()
        v = self._ctype()
        _check(self._lib, self._lib.emm_array_get(h, i, n, ctypes.byref(v), ctypes.sizeof(v)))
        return v.value

    def __setitem__(self, idx: Union[int, Sequence[int]], value: Union[int, float]) -> None:
        """Sets the element at ``idx``; an integer value outside the dtype's range
        raises ``OverflowError`` (ctypes would wrap it)."""
        i, n = self._index(idx)
        if self._range is not None:
            try:
                iv = operator.index(value)
            except TypeError:
                raise TypeError(f"a {self.dtype} element must be an integer, not {type(value).__name__}") from None
            lo, hi = self._range
            if not lo <= iv <= hi:
                raise OverflowError(f"{iv} does not fit in {self.dtype} ({lo}..{hi})")
            value = iv
        h = self._handle()
        v = self._ctype(value)
        _check(self._lib, self._lib.emm_array_set(h, i, n, ctypes.byref(v), ctypes.sizeof(v)))

    def lock(self) -> int:
        """Takes a lock (mutations fail while it lives); returns its id."""
        h = self._handle()
        i = ctypes.c_uint64()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_array_lock(h, ctypes.byref(i)))
        return i.value

    def unlock(self, lock_id: int) -> None:
        """Releases the lock ``lock_id`` from :meth:`lock`."""
        lock_id = check_uint(lock_id, "lock_id", U64_MAX)
        h = self._handle()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_array_unlock(h, lock_id))

    @property
    def deleters_run(self) -> int:
        """DLPack deleters run so far for this array's exports."""
        h = self._handle()
        return self._lib.emm_array_deleters_run(h)

    def __dlpack_device__(self) -> Tuple[int, int]:
        """``(device_type, device_id)`` of the current side (DLPack)."""
        return self._info()[2]

    def __dlpack__(self, *, stream: Optional[int] = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the current side, without a copy (the array stays
        locked until the consumer releases it)."""
        if copy:
            raise BufferError("emm's MemArray exports without copying (copy=True was asked)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"the array is on {self.__dlpack_device__()}, not {tuple(dl_device)}; move it first")
        h = self._handle()
        # Pending copies are waited for inside the export, so the data is ready on
        # any consumer stream.
        versioned = max_version is not None and max_version[0] >= 1
        out = ctypes.c_void_p()
        _emit_queued(self._lib)
        _check(self._lib, self._lib.emm_array_to_dlpack(h, int(versioned), ctypes.byref(out)))
        if versioned:
            return _api.PyCapsule_New(out.value, _NAME_V, _destroy_versioned)
        return _api.PyCapsule_New(out.value, _NAME, _destroy_legacy)
