"""emm.rmm: importing it without RMM, the error when RMM is missing, the callback pair
(over a fake manager; over emm's manager on a driver, `-m standin`), and, where RMM's
Python package imports, install/uninstall and RMM's statistics adaptor over emm."""

import ctypes
import subprocess
import sys

import pytest

import emm
from conftest import HAS_GPU, ON_STANDIN

needs_driver = pytest.mark.skipif(not (ON_STANDIN or HAS_GPU),
                                  reason="needs a driver: a GPU, or emm-standin through EMM_CUDA_DRIVER")


class Stream:
    """Stands for rmm.pylibrmm.stream.Stream: only __cuda_stream__ is used."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class FakeManager:
    def __init__(self, fail_free=None, fail_alloc=None):
        self.calls, self.fail_free, self.fail_alloc = [], fail_free, fail_alloc

    def alloc(self, size, stream=0):
        self.calls.append(("alloc", size, stream))
        if self.fail_alloc:
            raise self.fail_alloc
        return 0x4000

    def free(self, ptr, stream=0):
        self.calls.append(("free", ptr, stream))
        if self.fail_free:
            raise self.fail_free


def test_importing_emm_rmm_does_not_import_rmm():
    code = "import sys, emm.rmm; print(sorted(m for m in sys.modules if m == 'rmm' or m.startswith('rmm.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out


@pytest.mark.parametrize("call", ["install", "resource", "using"])
def test_without_rmm_the_error_names_the_package(monkeypatch, call):
    import emm.rmm as er

    for name in ("rmm", "rmm.mr"):
        monkeypatch.setitem(sys.modules, name, None)  # `import rmm` now fails
    with pytest.raises(ModuleNotFoundError) as e:
        if call == "using":
            with er.using(device=0):
                pass
        else:
            getattr(er, call)(device=0)
    assert isinstance(e.value, ImportError)
    assert e.value.name == "rmm"
    assert "'rmm'" in str(e.value) and "emm-cuda[rmm]" in str(e.value) and "rmm-cu12" in str(e.value)
    assert er.installed() == {}


def test_uninstall_without_anything_installed_needs_no_rmm(monkeypatch):
    import emm.rmm as er

    monkeypatch.setitem(sys.modules, "rmm", None)
    er.uninstall()
    er.uninstall(3)


def test_allocate_orders_on_the_callers_stream():
    from emm.rmm import callbacks

    mgr = FakeManager()
    allocate, _ = callbacks(mgr)
    assert allocate(100, Stream(0)) == 0x4000
    assert allocate(200, Stream(0x77)) == 0x4000
    assert mgr.calls == [("alloc", 100, 0), ("alloc", 200, 0x77)]


def test_deallocate_orders_on_the_given_stream_and_stream_0_is_the_legacy_stream():
    from emm.rmm import callbacks

    mgr = FakeManager()
    _, deallocate = callbacks(mgr)
    assert deallocate(0x4000, 100, Stream(0x77)) is None
    deallocate(0x5000, 100, Stream(0))
    # 0 would mean "the block's own stream" to emm_free; RMM's stream 0 is the legacy
    # default stream (CU_STREAM_LEGACY, 1).
    assert mgr.calls == [("free", 0x4000, 0x77), ("free", 0x5000, 1)]


def test_a_failing_allocation_raises_to_rmm():
    from emm.rmm import callbacks

    oom = emm.OutOfMemoryError("out of device memory: requested 1 TiB", 1 << 40, 0, 0)
    allocate, _ = callbacks(FakeManager(fail_alloc=oom))
    with pytest.raises(MemoryError) as e:  # RMM turns a MemoryError into rmm::out_of_memory
        allocate(1 << 40, Stream(0))
    assert e.value is oom


def test_a_failing_free_is_reported_not_raised(monkeypatch):
    from emm.rmm import callbacks

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    _, deallocate = callbacks(FakeManager(fail_free=emm.EmmError(1, "emm_free: 0x4000 was not allocated")))
    assert deallocate(0x4000, 100, Stream(5)) is None
    assert len(seen) == 1
    assert isinstance(seen[0].exc_value, emm.EmmError)
    assert "0x4000" in str(seen[0].exc_value)


def test_manager_and_device_must_agree():
    import emm.rmm as er

    class NotAManager:
        device = 0

    with pytest.raises(TypeError):
        er._manager_and_device(NotAManager(), None)
    with pytest.raises(ValueError):
        er._manager_and_device(None, -1)


# ---- over emm's manager, on a driver (the stand-in in CI) ----


@pytest.fixture
def mgr():
    m = emm.Manager(None, 0)
    yield m
    m.close()


@pytest.mark.standin
@needs_driver
def test_callbacks_over_emm_allocate_free_and_stats_return(mgr):
    from emm.rmm import callbacks

    allocate, deallocate = callbacks(mgr)
    before = mgr.stats()
    sizes = [1, 255, 256, 4097, 1 << 20, (3 << 20) + 5]
    ptrs = [allocate(s, Stream(0)) for s in sizes]
    assert all(p and p % 256 == 0 for p in ptrs)
    during = mgr.stats()
    assert during["allocations"] - before["allocations"] == len(sizes)
    assert during["allocated_bytes"] - before["allocated_bytes"] >= sum(sizes)
    if ON_STANDIN:  # device memory is host memory here
        for p, s in zip(ptrs, sizes):
            ctypes.memset(p, 0xA5, s)
            assert ctypes.string_at(p + s - 1, 1) == b"\xa5"
    for p, s in zip(ptrs, sizes):
        deallocate(p, s, Stream(0))
    assert mgr.stats()["allocated_bytes"] == before["allocated_bytes"]
    assert allocate(0, Stream(0)) == 0
    deallocate(0, 0, Stream(0))


@pytest.mark.standin
@needs_driver
def test_callbacks_over_emm_out_of_memory_and_double_free(mgr, monkeypatch):
    from emm.rmm import callbacks

    allocate, deallocate = callbacks(mgr)
    _, total = mgr.memory_info()
    with pytest.raises(emm.OutOfMemoryError) as e:
        allocate(total + (1 << 30), Stream(0))
    assert isinstance(e.value, MemoryError)
    assert e.value.requested == total + (1 << 30)
    p = allocate(4096, Stream(0))
    deallocate(p, 4096, Stream(0))
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    deallocate(p, 4096, Stream(0))  # freed already
    assert len(seen) == 1 and seen[0].exc_value.code == 1, seen


# ---- with RMM's Python package (skipped where it does not import) ----


def _rmm():
    try:
        import rmm.mr
    except ImportError as e:
        pytest.skip(f"RMM's Python package does not import here: {e}")
    return rmm


@pytest.fixture
def rmm_mod():
    import emm.rmm as er

    r = _rmm()
    yield r
    er.uninstall()


@pytest.mark.standin
@needs_driver
def test_install_sets_and_uninstall_restores_rmms_resource(rmm_mod, mgr):
    import emm.rmm as er

    before = rmm_mod.mr.get_per_device_resource(0)
    mr = er.install(device=0)
    assert isinstance(mr, rmm_mod.mr.CallbackMemoryResource)
    assert rmm_mod.mr.get_per_device_resource(0) is mr
    assert er.install(device=0) is mr  # in place: the same resource
    assert er.installed() == {0: mr}
    p = mr.allocate(1000)
    assert mgr.stats()["allocated_bytes"] >= 1000
    mr.deallocate(p, 1000)
    er.uninstall()
    assert rmm_mod.mr.get_per_device_resource(0) is before
    assert er.installed() == {}
    with er.using(device=0) as inner:
        assert rmm_mod.mr.get_per_device_resource(0) is inner
    assert rmm_mod.mr.get_per_device_resource(0) is before
    # Someone else's resource set after install() stays; emm forgets its own.
    er.install(device=0)
    theirs = rmm_mod.mr.CallbackMemoryResource(lambda n, s: 0, lambda p, n, s: None)
    rmm_mod.mr.set_per_device_resource(0, theirs)
    er.uninstall(0)
    assert rmm_mod.mr.get_per_device_resource(0) is theirs
    assert er.installed() == {}
    rmm_mod.mr.set_per_device_resource(0, before)


@pytest.mark.standin
@needs_driver
def test_rmms_statistics_over_emm_agree_with_emms(rmm_mod, mgr):
    import emm.rmm as er

    stats = rmm_mod.mr.StatisticsResourceAdaptor(er.resource(mgr))
    base = mgr.stats()
    sizes = [1, 4097, 1 << 20]
    ptrs = [stats.allocate(s) for s in sizes]
    c = stats.allocation_counts
    assert (c.current_bytes, c.current_count, c.total_count) == (sum(sizes), 3, 3)
    now = mgr.stats()
    assert now["allocations"] - base["allocations"] == 3
    assert sum(sizes) <= now["allocated_bytes"] - base["allocated_bytes"] <= sum(sizes) + 3 * 512
    for p, s in zip(ptrs, sizes):
        stats.deallocate(p, s)
    c = stats.allocation_counts
    assert (c.current_bytes, c.current_count, c.peak_bytes) == (0, 0, sum(sizes))
    assert mgr.stats()["allocated_bytes"] == base["allocated_bytes"]


@pytest.mark.standin
@needs_driver
def test_out_of_memory_reaches_rmms_caller_as_memory_error(rmm_mod, mgr):
    import emm.rmm as er

    _, total = mgr.memory_info()
    mr = er.resource(mgr)
    with pytest.raises(MemoryError) as e:
        mr.allocate(total + (1 << 30))
    assert "EMM_ERR_OUT_OF_MEMORY" in str(e.value)
