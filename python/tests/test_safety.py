"""The bindings never hand the library a wrapped integer or a closed handle.

ctypes wraps integers silently (``2**64 + 100`` becomes 100), so every integer is
checked in Python first. Most of these run without a GPU: a stub library stands
in for libemm_capi behind a Manager, and records what would have reached C.
"""

import pytest

import emm
from emm._lib import SIZE_MAX
from emm.array import MemArray


class StubLib:
    """Records the calls a Manager makes into the library."""

    def __init__(self):
        self.calls = []

    def emm_alloc_ptr(self, h, size, stream):
        self.calls.append(("alloc", h, size, stream))
        return 0x1000

    def emm_free(self, h, ptr, stream):
        self.calls.append(("free", h, ptr, stream))
        return 0

    def emm_manager_destroy(self, h):
        self.calls.append(("destroy", h))

    def __getattr__(self, name):
        raise AssertionError(f"{name} reached the library")


@pytest.fixture
def stub():
    m = emm.Manager.__new__(emm.Manager)
    lib = StubLib()
    m._attach(lib, 0xABC, 0, "pool")
    return m, lib


@pytest.mark.parametrize("size, error", [
    (2**64 + 100, OverflowError), (SIZE_MAX + 1, OverflowError), (-1, ValueError), (1.5, TypeError),
    ("8", TypeError), (None, TypeError),
])
def test_alloc_sizes_are_checked_before_c(stub, size, error):
    m, lib = stub
    with pytest.raises(error):
        m.alloc(size)
    assert lib.calls == []


def test_valid_arguments_reach_c_unchanged(stub):
    m, lib = stub
    assert m.alloc(100) == 0x1000
    assert m.alloc(SIZE_MAX, stream=7) == 0x1000
    assert m.alloc(True) == 0x1000  # an index-able int
    m.free(0x1000)
    m.free(0x1000, stream=7)
    assert lib.calls == [("alloc", 0xABC, 100, None), ("alloc", 0xABC, SIZE_MAX, 7), ("alloc", 0xABC, 1, None),
                         ("free", 0xABC, 0x1000, None), ("free", 0xABC, 0x1000, 7)]


@pytest.mark.parametrize("call, error", [
    (lambda m: m.alloc(16, stream=-1), ValueError),
    (lambda m: m.alloc(16, stream=2**64), OverflowError),
    (lambda m: m.free(2**64 + 1), OverflowError),
    (lambda m: m.free(-5), ValueError),
    (lambda m: m.free(0x1000, stream=-3), ValueError),
    (lambda m: m.host_alloc(-1), ValueError),
    (lambda m: m.host_alloc(2**64), OverflowError),
    (lambda m: m.ipc_export(0x1000, -1, 16), ValueError),
    (lambda m: m.ipc_export(0x1000, 0, 2**64), OverflowError),
    (lambda m: m.ipc_close(-1), ValueError),
    (lambda m: m.ipc_open("not bytes"), TypeError),
    (lambda m: m.alloc_managed(-1), ValueError),
    (lambda m: m.alloc_managed(2**64), OverflowError),
    (lambda m: m.alloc_managed(1.5), TypeError),
    (lambda m: m.alloc_managed(16, attach_global=2), TypeError),
    (lambda m: m.alloc_managed(16, attach_global="yes"), TypeError),
    (lambda m: m.free_managed(-1), ValueError),
    (lambda m: m.free_managed(2**64), OverflowError),
])
def test_other_integer_arguments_are_checked_before_c(stub, call, error):
    m, lib = stub
    with pytest.raises(error):
        call(m)
    assert lib.calls == []


def test_a_closed_manager_raises_and_never_reaches_c_again(stub):
    m, lib = stub
    assert not m.closed
    m.close()
    m.close()  # once only
    assert lib.calls == [("destroy", 0xABC)]
    assert m.closed
    for call in (lambda: m.alloc(16), lambda: m.free(0x1000), m.stats, m.trim, m.memory_info,
                 lambda: m.host_alloc(16), lambda: m.ipc_close(0x1000), lambda: m.alloc_managed(16),
                 lambda: m.free_managed(0x1000)):
        with pytest.raises(emm.ClosedError) as e:
            call()
        assert isinstance(e.value, ValueError) and isinstance(e.value, emm.EmmError)
        assert "Manager is closed" in str(e.value)
    assert lib.calls == [("destroy", 0xABC)]


def test_a_manager_as_a_context_manager_closes(stub):
    m, lib = stub
    with m as same:
        assert same is m
    assert m.closed and lib.calls == [("destroy", 0xABC)]


@pytest.mark.parametrize("kwargs, error", [
    ({"device": -1}, ValueError), ({"device": 2**31}, OverflowError), ({"device": 2**64}, OverflowError),
    ({"name": 5}, TypeError), ({"device": "0"}, TypeError),
])
def test_manager_arguments_are_checked_before_the_driver(kwargs, error):
    with pytest.raises(error):
        emm.Manager(**kwargs)


@pytest.mark.parametrize("shape, error", [
    ((2**64 + 5,), OverflowError), ((4, -1), ValueError), ((2**64,), OverflowError), ((1.5,), TypeError),
])
def test_array_extents_do_not_wrap(shape, error):
    with pytest.raises(error):
        MemArray(shape, "float32", host_only=True)


def test_array_indices_and_values_do_not_wrap():
    b = MemArray((2, 3), "int8", host_only=True)
    b[1, 1] = 5
    with pytest.raises(OverflowError):
        b[2**64 + 1, 1]
    with pytest.raises(ValueError):
        b[-1, 0]
    with pytest.raises(OverflowError):
        b[0, 0] = 300  # ctypes would store 44
    with pytest.raises(OverflowError):
        b[0, 0] = -129
    with pytest.raises(TypeError):
        b[0, 0] = 1.5
    with pytest.raises(IndexError):
        b[1]  # rank 2 needs two indices
    assert b[1, 1] == 5 and b[0, 0] == 0
    u = MemArray((2,), "uint64", host_only=True)
    u[0] = 2**64 - 1
    assert u[0] == 2**64 - 1
    with pytest.raises(OverflowError):
        u[1] = 2**64
    with pytest.raises(OverflowError):
        u[1] = -1
    with pytest.raises(ValueError):
        u.to_device(stream=-1)
    f = MemArray(3, "float64", host_only=True)
    f[2] = 1e300
    assert f[2] == 1e300 and f.shape == (3,)


def test_a_closed_array_raises():
    a = MemArray((2,), "float32", host_only=True)
    a.close()
    a.close()
    for call in (lambda: a[0], lambda: a.__setitem__(0, 1.0), a.lock, a.to_host, a.__dlpack__,
                 lambda: a.data_ptr, lambda: a.deleters_run):
        with pytest.raises(emm.ClosedError, match="MemArray is closed"):
            call()


def test_a_memarray_checks_its_device_before_the_driver():
    with pytest.raises(ValueError):
        MemArray((2,), "float32", device=-1)
