"""The bindings against a driver: managers (alloc, free, stats, trim, IPC, out of
memory) and MemArray through the device. `cargo xtask ci` runs these with
``EMM_CUDA_DRIVER=<target>/debug/libemm_standin.so`` (emm-standin: host memory, not
a GPU; ``-m standin``); on a GPU machine they run on the GPU. Without either they
are skipped."""

import ctypes
import os

import pytest

import emm
from emm.array import MemArray
from conftest import HAS_GPU, ON_STANDIN

pytestmark = [
    pytest.mark.standin,
    pytest.mark.skipif(not (ON_STANDIN or HAS_GPU),
                       reason="needs a driver: a GPU, or emm-standin through EMM_CUDA_DRIVER"),
]


@pytest.fixture
def mgr():
    m = emm.Manager(None, 0)
    yield m
    m.close()


def test_the_driver_is_what_it_says(mgr):
    free, total = mgr.memory_info()
    assert 0 < free <= total
    if ON_STANDIN:
        print(f"driver: emm-standin (host memory, not a GPU), {total} bytes per device")
        assert total == 8 << 30  # the stand-in's default capacity


def test_alloc_free_and_stats_return_to_where_they_were(mgr):
    before = mgr.stats()
    sizes = [1, 256, 4096, 1 << 20, 3 << 20]
    ptrs = [mgr.alloc(s) for s in sizes]
    assert all(p and p % 256 == 0 for p in ptrs)
    assert len(set(ptrs)) == len(ptrs)
    during = mgr.stats()
    assert during["allocated_bytes"] - before["allocated_bytes"] >= sum(sizes)
    assert during["allocated_bytes_peak"] >= during["allocated_bytes"]
    assert during["reserved_bytes"] >= during["allocated_bytes"]
    assert during["allocations"] - before["allocations"] == len(sizes)
    if ON_STANDIN:  # device memory is host memory: write and read it back
        for p, s in zip(ptrs, sizes):
            ctypes.memset(p, 0x5A, s)
            assert ctypes.string_at(p + s - 1, 1) == b"\x5a"
    for p in ptrs:
        mgr.free(p)
    after = mgr.stats()
    assert after["allocated_bytes"] == before["allocated_bytes"]
    assert after["allocated_bytes_peak"] >= during["allocated_bytes"]
    with pytest.raises(emm.EmmError) as e:
        mgr.free(ptrs[0])  # freed already
    assert e.value.code == 1
    assert mgr.alloc(0) == 0


def test_trim_gives_cached_memory_back(mgr):
    p = mgr.alloc(8 << 20)
    mgr.free(p)
    cached = mgr.stats()["reserved_bytes"]
    released = mgr.trim()
    s = mgr.stats()
    assert s["reserved_bytes"] == cached - released
    if mgr.name in ("pool", "default"):  # a cache, or a queue of frees, to give back
        assert released >= 8 << 20
    assert mgr.trim() == 0  # nothing left to give back


def test_out_of_memory_is_typed_and_says_how_much(mgr):
    _, total = mgr.memory_info()
    with pytest.raises(emm.OutOfMemoryError) as e:
        mgr.alloc(total + (1 << 30))
    assert isinstance(e.value, MemoryError)
    assert e.value.requested == total + (1 << 30)
    assert e.value.total in (0, total)
    # The manager still works.
    p = mgr.alloc(1024)
    mgr.free(p)


def test_a_refused_configure_applies_no_setting(mgr):
    """Once the pool serves, a setting read at its creation can only be
    repeated: changing it is refused (``EMM_ERR_ALREADY_IN_USE``), and a
    run-time setting in the same call is not applied either (it was, when it
    came first in the keywords)."""
    p = mgr.alloc(1 << 20)
    mgr.free(p)
    refused = 0
    for expandable in (False, True):  # one of them is the value in effect
        try:
            emm.configure(pool_limit=1 << 20, pool_expandable=expandable)
        except emm.EmmError as e:
            assert e.code == 7, e
            refused += 1
            q = mgr.alloc(8 << 20)  # past a 1 MiB limit: the limit was not applied
            mgr.free(q)
        finally:
            emm.configure(pool_limit="max")
    assert refused == 1


@pytest.mark.skipif(not ON_STANDIN, reason="reads device memory through host pointers")
def test_ipc_round_trip_within_the_process(mgr):
    p = mgr.alloc(4096)
    ctypes.memmove(p, bytes(range(256)) * 16, 4096)
    handle = mgr.ipc_export(p, 1024, 512)
    assert handle[:6] == b"EMMIPC"
    q = mgr.ipc_open(handle)
    assert ctypes.string_at(q, 512) == (bytes(range(256)) * 2)
    mgr.ipc_close(q)
    garbled = bytearray(handle)
    garbled[20] ^= 0xFF
    with pytest.raises(emm.EmmError) as e:
        mgr.ipc_open(bytes(garbled))
    assert e.value.code == 6  # EMM_ERR_IPC
    with pytest.raises(emm.EmmError):
        mgr.ipc_export(p, 4000, 512)  # outside the allocation
    mgr.free(p)


def test_memarray_round_trip_through_the_device(mgr):
    before = mgr.stats()["allocated_bytes"]
    a = MemArray((4, 8), "float32", manager=mgr)
    for i in range(4):
        for j in range(8):
            a[i, j] = i * 8 + j + 0.5
    assert a.to_device()
    assert a.side == "device"
    dev = a.data_ptr
    assert mgr.stats()["allocated_bytes"] - before >= 4 * 8 * 4
    if ON_STANDIN:
        # The device copy holds the data; change it there, and see it come back.
        vals = (ctypes.c_float * 32).from_address(dev)
        assert [vals[k] for k in range(32)] == [k + 0.5 for k in range(32)]
        vals[5] = -7.25
    assert a.to_host()
    assert a.side == "host"
    assert a[0, 0] == 0.5 and a[3, 7] == 31.5
    if ON_STANDIN:
        assert a[0, 5] == -7.25
    a.close()
    assert mgr.stats()["allocated_bytes"] == before


def _managed_bytes(mgr):
    return mgr.memory_stats()["emm.managed_bytes.current"]


def test_managed_memory_round_trips_and_is_counted_apart(mgr):
    before, device_before = _managed_bytes(mgr), mgr.stats()["allocated_bytes"]
    sizes = [1, 4097, 1 << 20]
    ptrs = [mgr.alloc_managed(s, attach_global=bool(i % 2)) for i, s in enumerate(sizes)]
    assert all(p and p % 256 == 0 for p in ptrs)
    assert len(set(ptrs)) == len(ptrs)
    assert _managed_bytes(mgr) == before + sum(sizes)
    assert mgr.memory_stats()["emm.managed_allocations.current"] >= len(sizes)
    # Managed memory is not device memory in stats().
    assert mgr.stats()["allocated_bytes"] == device_before
    if ON_STANDIN:  # one address for host and device: the host writes and reads it
        for p, s in zip(ptrs, sizes):
            ctypes.memset(p, 0xA5, s)
            assert ctypes.string_at(p, s) == b"\xa5" * s
    with pytest.raises(emm.EmmError) as e:
        mgr.free(ptrs[0])  # emm_free refuses managed memory
    assert e.value.code == 1 and "emm_free_managed" in str(e.value)
    for p in ptrs:
        mgr.free_managed(p)
    assert _managed_bytes(mgr) == before
    with pytest.raises(emm.EmmError) as e:
        mgr.free_managed(ptrs[0])  # freed already
    assert e.value.code == 1
    assert mgr.alloc_managed(0) == 0
    mgr.free_managed(0)
    d = mgr.alloc(256)
    with pytest.raises(emm.EmmError):
        mgr.free_managed(d)  # device memory is freed by free()
    mgr.free(d)


def test_managed_out_of_memory_is_typed(mgr):
    _, total = mgr.memory_info()
    if ON_STANDIN:
        # (A GPU's driver lets managed memory oversubscribe the device: more
        # than its total is no error there.)
        with pytest.raises(emm.OutOfMemoryError) as e:
            mgr.alloc_managed(total + (1 << 30))
        assert e.value.requested == total + (1 << 30)
    with pytest.raises(emm.EmmError) as e:
        mgr.alloc_managed(2**63)  # no machine holds it: refused before the driver
    assert e.value.code in (1, 2)
    p = mgr.alloc_managed(4096, attach_global=False)
    mgr.free_managed(p)


def test_closing_a_manager_frees_its_managed_memory():
    m = emm.Manager(None, 0)
    base = _managed_bytes(m)
    m.alloc_managed(1 << 16)
    assert _managed_bytes(m) == base + (1 << 16)
    m.close()
    with emm.Manager(None, 0) as again:
        assert _managed_bytes(again) == base


def test_record_stream_reaches_emm_and_orders_the_free():
    """``emm.torch`` routes ``Tensor.record_stream`` to ``emm_torch_record_stream``
    (PyTorch's pluggable allocator drops it): the free then waits for the other
    stream. A stand-in for ``torch`` here; the GPU check is
    ``python/gpu/checks/record_stream_check.py``."""
    import os
    import types

    import emm.torch as et

    lib = emm._lib.load()
    lib.emm_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.emm_torch_alloc.restype = ctypes.c_void_p
    lib.emm_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.emm_torch_free.restype = None
    seen = []

    class Tensor:
        def record_stream(self, stream):
            seen.append(stream)

    fake_torch = types.SimpleNamespace(Tensor=Tensor)
    from emm import _torch_routes

    _torch_routes.route_record_stream(fake_torch)
    routed = fake_torch.Tensor.record_stream
    _torch_routes.route_record_stream(fake_torch)  # a second install routes nothing twice
    assert fake_torch.Tensor.record_stream is routed

    def tensor(ptr):
        t = Tensor()
        t.untyped_storage = lambda: types.SimpleNamespace(data_ptr=lambda: ptr)
        t.device = types.SimpleNamespace(type="cuda", index=0)
        return t

    side = types.SimpleNamespace(cuda_stream=2)  # the per-thread default stream
    p = lib.emm_torch_alloc(4096, 0, None)
    assert p
    tensor(p).record_stream(side)
    tensor(0x10).record_stream(side)  # not emm's memory: ignored, as PyTorch does
    tensor(0).record_stream(side)  # empty storage
    assert seen == [side, side, side], "PyTorch's own record_stream still runs"

    waits = None
    if ON_STANDIN:
        control = ctypes.CDLL(os.environ["EMM_CUDA_DRIVER"]).emmStandinControl
        control.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]

        def calls(fn):
            out = ctypes.c_uint64()
            assert control(f"calls {fn}".encode(), ctypes.byref(out)) == 0
            return out.value

        waits = calls("cuStreamWaitEvent")
    lib.emm_torch_free(p, 4096, 0, None)
    if waits is not None:
        assert calls("cuStreamWaitEvent") == waits + 1


def test_pytorch_allocator_settings_reach_emm_or_are_refused(mgr):
    """``torch.cuda.memory._set_allocator_settings`` under ``emm.torch`` goes to
    emm's settings (``emm._torch_settings``): run-time ones apply at once, the one
    read when the pool was made accepts only its value in effect, and PyTorch's
    keys without a meaning for emm are refused before anything is applied. A
    stand-in for ``torch`` here."""
    import os
    import types

    from emm import _torch_settings

    if mgr.name != "pool":
        pytest.skip(f"the process's manager is {mgr.name}; the settings are the pool's")
    if os.environ.get("EMM_POOL_LIMIT") or os.environ.get("EMM_POOL_RELEASE_THRESHOLD"):
        pytest.skip("EMM_POOL_LIMIT or EMM_POOL_RELEASE_THRESHOLD is set: the environment wins")
    calls = []
    memory = types.SimpleNamespace(_set_allocator_settings=calls.append)
    props = types.SimpleNamespace(total_memory=8 << 30)
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        memory=memory, current_device=lambda: 0, get_device_properties=lambda d: props))
    _torch_settings.route_allocator_settings(fake_torch)
    routed = memory._set_allocator_settings
    _torch_settings.route_allocator_settings(fake_torch)  # routed once
    assert memory._set_allocator_settings is routed
    setting = memory._set_allocator_settings
    try:
        with pytest.raises(ValueError, match=r"max_split_size_mb \(emm's pool splits") as e:
            setting("per_process_memory_fraction:0.01,max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2]")
        assert "roundup_power2_divisions" in str(e.value) and "nothing was applied" in str(e.value)
        p = mgr.alloc(256 << 20)  # the fraction above was not applied
        mgr.free(p)
        if not os.environ.get("EMM_POOL_EXPANDABLE"):
            setting("expandable_segments:True")  # the value in effect
            with pytest.raises(emm.EmmError, match="pool_expandable"):
                setting("expandable_segments:False")
        setting("per_process_memory_fraction:0.01")  # 82 MiB of the stand-in's 8 GiB
        assert mgr.stats()["reserved_bytes"] <= 82 << 20, "lowering the limit trims"
        with pytest.raises(emm.OutOfMemoryError, match="byte limit"):
            mgr.alloc(256 << 20)
        setting("pool_limit:max")
        p = mgr.alloc(256 << 20)
        mgr.free(p)
        setting("garbage_collection_threshold:0.002")  # 16 MiB: the cache above it goes back
        assert mgr.stats()["reserved_bytes"] <= 17 << 20
        with pytest.raises(ValueError, match="expandable_segments must be True or False"):
            setting("expandable_segments:yes")
        # A bad value of emm's own (PyTorch's text, which the library parses)
        # after a good one: refused before either is applied.
        with pytest.raises(emm.EmmError, match="pool_release_threshold") as e:
            setting("pool_limit:1M,pool_release_threshold:banana")
        assert e.value.code == 1, e.value
        p = mgr.alloc(256 << 20)  # a 1 MiB limit was not applied
        mgr.free(p)
    finally:
        setting("pool_limit:max,pool_release_threshold:max")
    assert calls == [], "PyTorch's own function never ran"


def test_mem_pool_stats_follow_a_private_pool_through_its_life():
    """``emm.torch.mem_pool_stats`` reads what ``torch.cuda.MemPool`` makes under
    emm's own object: the C++ object calls ``emm_torch_graph_pool_create`` for
    ``MemPool()``, begin/end around ``use_mem_pool``, release when the pool dies.
    Called directly here, as the object would (the GPU check is
    ``python/gpu/checks/mem_pool_check.py``)."""
    import emm.torch as et

    lib = emm._lib.load()
    pool = (0, 4242)
    u64 = ctypes.c_uint64
    for name in ("emm_torch_graph_pool_create", "emm_torch_graph_pool_begin",
                 "emm_torch_graph_pool_end", "emm_torch_graph_pool_release"):
        getattr(lib, name).argtypes = [ctypes.c_int, u64, u64]
        getattr(lib, name).restype = ctypes.c_int
    lib.emm_torch_graph_pool_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, u64, u64]
    lib.emm_torch_graph_pool_alloc.restype = ctypes.c_void_p
    lib.emm_torch_release.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.emm_torch_release.restype = ctypes.c_int

    assert et.mem_pool_stats(pool, 0)["uses"] == 0, "never made"
    assert lib.emm_torch_graph_pool_create(0, *pool) == 0
    assert lib.emm_torch_graph_pool_begin(0, *pool) == 0
    p = lib.emm_torch_graph_pool_alloc(3 << 20, 0, None, *pool)
    assert p
    assert lib.emm_torch_graph_pool_end(0, *pool) == 0
    assert lib.emm_torch_graph_pool_release(0, *pool) == 0
    s = et.mem_pool_stats(pool, 0)
    assert s["uses"] == 1 and s["live_bytes"] >= 3 << 20 and s["live_blocks"] == 1, s
    assert s["reserved_bytes"] >= s["live_bytes"] and s["segments"] >= 1, s
    assert lib.emm_torch_release(p, 0) == 0
    assert et.mem_pool_stats(pool, 0)["live_bytes"] == 0
    assert lib.emm_torch_graph_pool_release(0, *pool) == 0  # the MemPool dies
    assert et.mem_pool_stats(pool, 0) == {k: 0 for k in s}, "released by every user"
    with pytest.raises(ValueError):
        et.mem_pool_stats((1, 2, 3), 0)


def test_messages_queued_by_c_paths_arrive_at_the_next_binding_call(mgr, caplog):
    """An error logged where no Python runs (CuPy's C free of an address emm did
    not hand out) reaches the ``emm`` logger at the next call of these bindings
    that is not an allocation itself, not only at a failure or at exit."""
    lib = emm._lib.load()
    lib.emm_cupy_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.emm_cupy_free.restype = None
    lib.emm_cupy_free(None, 0x5000_0000_1234, 0)
    p = mgr.alloc(256)  # an allocation call stays one C call: nothing taken
    mgr.free(p)
    with caplog.at_level("ERROR", logger="emm"):
        mgr.stats()
    assert any("0x500000001234" in r.getMessage() for r in caplog.records), caplog.records
    assert emm.take_warnings() == []


def test_report_is_whole_while_other_threads_allocate(mgr):
    import threading

    stop = threading.Event()

    def churn():
        while not stop.is_set():
            mgr.free(mgr.alloc(4096))

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        reports = [mgr.report() for _ in range(300)]
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert all(r.rstrip().endswith("}") for r in reports), [r[-40:] for r in reports if not r.rstrip().endswith("}")][:3]


def _queue_a_warning(n: int = 1) -> None:
    """Queues ``n`` warnings of the library the way a native PyTorch free of an
    address emm did not hand out does (no Python runs there)."""
    lib = emm._lib.load()
    lib.emm_torch_release.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.emm_torch_release.restype = None
    for i in range(n):
        lib.emm_torch_release(0x5000_0000_1234 + 16 * i, -1)


def test_a_warning_raised_as_an_error_stops_a_call_before_it_acts(mgr):
    """Under ``-W error`` a queued warning raises at the next binding call: before
    the call does anything (a region raising after it was entered stayed
    entered, an IPC mapping raising after it was opened lost its address), and
    the messages taken with it stay queued for the calls after."""
    import warnings

    emm.take_warnings()
    _queue_a_warning(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(emm.EmmWarning):
            with emm.region("w"):
                pass
        with pytest.raises(emm.EmmWarning):
            mgr.stats()
        with pytest.raises(emm.EmmWarning):
            mgr.memory_info()
        q = mgr.alloc(256)  # the three raised: the calls act again
        assert mgr.stats()["allocated_bytes"] >= 256
    assert emm.tag_stats("w")["allocated_bytes"] == 0, "no region was left entered"
    mgr.free(q)
    assert emm.take_warnings() == []


def test_trim_under_an_error_filter_gives_nothing_back_before_it_raises(mgr):
    import warnings

    emm.take_warnings()
    mgr.free(mgr.alloc(64 << 20))
    reserved = mgr.stats()["reserved_bytes"]
    _queue_a_warning()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(emm.EmmWarning):
            mgr.trim()
    assert mgr.stats()["reserved_bytes"] == reserved, "the raise came before the trim"
    assert mgr.trim() >= 0


def test_messages_kept_past_a_raised_one_stay_bounded(mgr):
    """Under ``-W error`` each call raises one queued message and keeps the rest;
    native paths queuing faster than that do not grow what is kept past the
    library's own 256, and the first kept says how many were dropped."""
    import warnings

    emm.take_warnings()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            _queue_a_warning(300)
            with pytest.raises(emm.EmmWarning):
                mgr.stats()
    assert len(emm._lib._NOT_RAISED) <= 256
    left = emm.take_warnings()
    assert left[0][0] == 1 and "dropped" in left[0][1], left[0]
    assert emm.take_warnings() == []


def test_the_notice_of_dropped_messages_counts_every_one():
    """What is kept past a raised message holds the newest 255 and a notice
    of how many went, counted again when the notice itself is kept once more."""
    emm.take_warnings()
    keep = emm._lib._keep_not_raised
    keep([(2, f"m{i}") for i in range(300)])
    kept = emm._lib._NOT_RAISED[:]
    assert len(kept) == 256 and kept[1] == (2, "m45") and kept[-1] == (2, "m299"), kept[:2]
    assert kept[0][1].startswith("45 earlier message(s) of emm were dropped"), kept[0]
    # Another thread that took its messages before that puts 20 older ones
    # back in front: 20 more go, and the one notice says 65, not 20 or 45.
    keep([(2, f"b{i}") for i in range(20)])
    kept = emm._lib._NOT_RAISED[:]
    assert len(kept) == 256 and kept[1] == (2, "m45") and kept[-1] == (2, "m299"), kept[:2]
    assert kept[0][1].startswith("65 earlier message(s)"), kept[0]
    assert sum("earlier message(s)" in m for _, m in kept) == 1
    assert emm.take_warnings()[:2] == kept[:2]
    assert emm._lib._NOT_RAISED == [] and emm.take_warnings() == []
