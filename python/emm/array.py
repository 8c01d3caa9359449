"""MemArray from Python: a typed n-dimensional array on emm with DLPack export.

    a = emm.array.MemArray((4, 8), "float32")      # memory from emm's manager of device 0
    t = torch.from_dlpack(a)                         # zero copy, on the current side
    a.to_device(); c = cupy.from_dlpack(a)           # same pointer as the array's

Supported dtypes: int8/16/32/64, uint8/16/32/64, float32/64; ranks 1 to 4. A
mutation while a lock (an explicit one, or a DLPack export that has not been
released) lives raises ``EmmError`` instead of corrupting data.
"""

import ctypes

from ._lib import EmmError, Manager, _Owner, _check, default_name, load

DTYPES = {
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


def _destroy(capsule, name, versioned):
    # Runs when the capsule dies: only an unconsumed capsule still owns the tensor.
    if _is_valid(capsule, name):
        ptr = _get_pointer(capsule, name)
        load().emm_dlpack_delete(ptr, versioned)


@_DESTRUCTOR
def _destroy_versioned(capsule):
    _destroy(capsule, _NAME_V, 1)


@_DESTRUCTOR
def _destroy_legacy(capsule):
    _destroy(capsule, _NAME, 0)


class MemArray(_Owner):
    """A typed array with a host mirror and a device copy from an emm manager."""

    _destroy = "emm_array_destroy"

    def __init__(self, shape, dtype="float32", device=0, manager=None, host_only=False):
        if dtype not in DTYPES:
            raise EmmError(1, f"unsupported dtype {dtype!r}; supported: {', '.join(DTYPES)}")
        shape = tuple(int(s) for s in shape)
        if not 1 <= len(shape) <= 4:
            raise EmmError(1, f"unsupported rank {len(shape)}: arrays have 1 to 4 dimensions")
        self._lib = lib = load()
        self.dtype, self.shape = dtype, shape
        code, bits, self._ctype = DTYPES[dtype]
        self._manager = None if host_only else (manager or Manager(default_name(), device))
        dims = (ctypes.c_size_t * len(shape))(*shape)
        h = ctypes.c_void_p()
        _check(lib, lib.emm_array_create(self._manager._h if self._manager else None, code, bits, len(shape),
                                         dims, ctypes.byref(h)))
        self._h = h

    def _info(self):
        data, side, dt, di = ctypes.c_uint64(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _check(self._lib, self._lib.emm_array_info(self._h, ctypes.byref(data), ctypes.byref(side), ctypes.byref(dt),
                                                   ctypes.byref(di)))
        return data.value, ("device" if side.value else "host"), (dt.value, di.value)

    @property
    def data_ptr(self):
        """The raw pointer of the current side."""
        return self._info()[0]

    @property
    def side(self):
        """``"host"`` or ``"device"``."""
        return self._info()[1]

    def _move(self, side, stream, wait):
        moved = ctypes.c_int()
        _check(self._lib, self._lib.emm_array_move(self._h, side, stream or None, int(bool(wait)), ctypes.byref(moved)))
        return bool(moved.value)

    def to_device(self, stream=0, wait=True):
        """Moves the data to the device (returns False when it was there already)."""
        return self._move(1, stream, wait)

    def to_host(self, stream=0, wait=True):
        """Moves the data to the host (returns False when it was there already)."""
        return self._move(0, stream, wait)

    def _index(self, idx):
        idx = (idx,) if isinstance(idx, int) else tuple(idx)
        return (ctypes.c_size_t * len(idx))(*idx), len(idx)

    def __getitem__(self, idx):
        i, n = self._index(idx)
        v = self._ctype()
        _check(self._lib, self._lib.emm_array_get(self._h, i, n, ctypes.byref(v), ctypes.sizeof(v)))
        return v.value

    def __setitem__(self, idx, value):
        i, n = self._index(idx)
        v = self._ctype(value)
        _check(self._lib, self._lib.emm_array_set(self._h, i, n, ctypes.byref(v), ctypes.sizeof(v)))

    def lock(self):
        """Takes a lock; returns its id."""
        i = ctypes.c_uint64()
        _check(self._lib, self._lib.emm_array_lock(self._h, ctypes.byref(i)))
        return i.value

    def unlock(self, lock_id):
        _check(self._lib, self._lib.emm_array_unlock(self._h, lock_id))

    @property
    def deleters_run(self):
        """DLPack deleters run so far for this array's exports."""
        return self._lib.emm_array_deleters_run(self._h)

    def __dlpack_device__(self):
        return self._info()[2]

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("emm's MemArray exports without copying (copy=True was asked)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"the array is on {self.__dlpack_device__()}, not {tuple(dl_device)}; move it first")
        # Pending copies are waited for inside the export, so the data is ready on
        # any consumer stream.
        versioned = max_version is not None and max_version[0] >= 1
        out = ctypes.c_void_p()
        _check(self._lib, self._lib.emm_array_to_dlpack(self._h, int(versioned), ctypes.byref(out)))
        if versioned:
            return _api.PyCapsule_New(out.value, _NAME_V, _destroy_versioned)
        return _api.PyCapsule_New(out.value, _NAME, _destroy_legacy)
