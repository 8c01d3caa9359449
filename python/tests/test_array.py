"""MemArray rules that need no GPU, through the C ABI."""

import ctypes
import warnings

import pytest

import emm
from emm.array import MemArray


def test_checked_access_locks_and_unsupported_types():
    a = MemArray((3, 4), "int32", host_only=True)
    a[2, 3] = 7
    assert a[2, 3] == 7
    with pytest.raises(emm.EmmError, match="out of bounds"):
        a[3, 0]
    lid = a.lock()
    with pytest.raises(emm.EmmError, match="locked"):
        a[0, 0] = 1
    a.unlock(lid)
    a[0, 0] = 1
    with pytest.raises(emm.EmmError, match="supported: int8"):
        MemArray((2,), "complex64", host_only=True)
    with pytest.raises(emm.EmmError):
        MemArray((1, 1, 1, 1, 1), "float32", host_only=True)
    assert a.__dlpack_device__() == (1, 0)


def test_an_unconsumed_capsule_runs_its_deleter_once():
    a = MemArray((8,), "float64", host_only=True)
    cap = a.__dlpack__(max_version=(1, 0))
    with pytest.raises(emm.EmmError):
        a[0] = 1.0  # the export locks the array
    del cap
    assert a.deleters_run == 1
    a[0] = 1.0
    legacy = a.__dlpack__()
    del legacy
    assert a.deleters_run == 2
    with pytest.raises(BufferError):
        a.__dlpack__(copy=True)


def test_a_host_array_too_large_for_the_heap_is_an_out_of_memory_error():
    # 2**60 bytes: refused by the heap (an error, never an abort of the interpreter).
    with pytest.raises(emm.OutOfMemoryError) as e:
        MemArray((2**57,), "float64", host_only=True)
    assert isinstance(e.value, MemoryError) and isinstance(e.value, emm.EmmError)
    assert e.value.code == 2
    assert e.value.requested == 2**60
    assert "out of host memory" in str(e.value)


def _queue_a_message(n: int = 1) -> None:
    """Queues ``n`` messages of the library as a native PyTorch free of an
    address emm did not hand out does (no Python runs there, no driver needed)."""
    lib = emm._lib.load()
    lib.emm_torch_release.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.emm_torch_release.restype = None
    for i in range(n):
        lib.emm_torch_release(0x5000_0000_1234 + 16 * i, -1)


def test_queued_messages_are_raised_before_an_arrays_calls_act():
    """Under ``-W error`` a queued message raises at an array's next call that
    is not an element access, before that call acts: no array made, no lock
    taken or released, no capsule made, no move; then the calls act again."""
    emm.take_warnings()
    a = MemArray((4,), "int32", host_only=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _queue_a_message()
        with pytest.raises(emm.EmmWarning, match="not an emm allocation"):
            MemArray((4,), "int32", host_only=True)
        _queue_a_message()
        with pytest.raises(emm.EmmWarning):
            a.lock()
        a[0] = 3  # no lock was taken; an element write is one C call, nothing queued raised
        _queue_a_message()
        a[1] = 5
        assert a[1] == 5
        with pytest.raises(emm.EmmWarning):
            a.to_device()
        assert a.side == "host", "the refused move did not run"
        lid = a.lock()
        _queue_a_message()
        with pytest.raises(emm.EmmWarning):
            a.unlock(lid)
        with pytest.raises(emm.EmmError, match="locked"):
            a[0] = 4  # the refused unlock left the lock in place
        a.unlock(lid)
        _queue_a_message()
        with pytest.raises(emm.EmmWarning):
            a.__dlpack__()
        assert a.deleters_run == 0, "no capsule was made"
        a[0] = 4  # and no lock either
    assert a[0] == 4
    assert emm.take_warnings() == []
