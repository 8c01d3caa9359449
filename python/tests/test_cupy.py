"""The object that frees a CuPy allocation, and the allocator pair (no CuPy needed)."""

import sys

import pytest


class FakeManager:
    def __init__(self, fail):
        self.fail, self.freed = fail, []

    def alloc(self, size, stream):
        self.allocated = (size, stream)
        return 0x3000

    def free(self, ptr, stream=0):
        self.freed.append((ptr, stream))
        if self.fail:
            raise RuntimeError(f"free of {ptr:#x} refused")


def test_the_block_is_freed_once_on_its_stream():
    from emm.cupy import _Block

    mgr = FakeManager(fail=False)
    b = _Block(mgr, 0x1000, 7)
    del b
    assert mgr.freed == [(0x1000, 7)]


def test_a_failing_free_is_reported_not_swallowed(monkeypatch):
    from emm.cupy import _Block

    mgr = FakeManager(fail=True)
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    b = _Block(mgr, 0x2000, 0)
    del b
    assert mgr.freed == [(0x2000, 0)]
    assert len(seen) == 1
    assert "0x2000" in str(seen[0].exc_value)


def test_the_python_function_allocator_pair(monkeypatch):
    import emm.cupy as ec

    class Stream:
        ptr = 42

    mgr = FakeManager(fail=False)
    monkeypatch.setattr(ec, "_current_stream", Stream)
    monkeypatch.setitem(ec._managers, 5, mgr)
    assert ec.malloc(100, 5) == 0x3000
    assert mgr.allocated == (100, 42)  # CuPy's current stream
    ec.free(0x3000, 5)
    assert mgr.freed == [(0x3000, 0)]  # 0: the block's own stream


def test_install_refuses_an_unknown_path():
    import emm.cupy

    with pytest.raises(ValueError, match="'auto', 'c' or 'python'"):
        emm.cupy.install(path="fast")


def test_the_c_path_errors_take_their_details_from_the_library(lib):
    """What emm_cupy_malloc raises is built from the message alone; the code and
    the out-of-memory numbers come from the thread's last failure."""
    import emm
    import emm._lib
    from emm.cupy import _CError, _COutOfMemoryError

    # A failure the library records: an unknown configuration key.
    assert lib.emm_configure(b"no_such_key", b"1") == emm._lib.EMM_ERR_INVALID_ARGUMENT
    e = _CError("no_such_key refused")
    assert e.code == emm._lib.EMM_ERR_INVALID_ARGUMENT
    assert "no_such_key refused" in str(e)
    oom = _COutOfMemoryError("out of memory")
    assert isinstance(oom, MemoryError) and isinstance(oom, emm.OutOfMemoryError)
    assert (oom.requested, oom.free, oom.total) == (0, 0, 0)  # the last failure was no OOM


def test_threads_racing_to_a_devices_first_allocation_share_one_manager(monkeypatch):
    """Eight threads making a device's first allocation at once get one manager
    handle: with one each, all but the last went unreferenced, and collecting
    them freed the blocks CuPy still held (the later frees then failed)."""
    import threading

    import emm.cupy as ec

    made = []

    class SlowManager(FakeManager):
        def __init__(self, *args):
            super().__init__(fail=False)
            made.append(self)
            time.sleep(0.05)  # as creating a handle releases the GIL

    import time

    class Stream:
        ptr = 0

    monkeypatch.setattr(ec, "_current_stream", Stream)
    monkeypatch.setattr(ec, "Manager", SlowManager)
    monkeypatch.setattr(ec, "_managers", {})
    n = 8
    barrier = threading.Barrier(n)
    got = [None] * n

    def first(i):
        barrier.wait()
        got[i] = ec.malloc(64, 3)

    threads = [threading.Thread(target=first, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1, f"{len(made)} handles made for one device"
    assert got == [0x3000] * n
    assert ec._managers[3] is made[0]
