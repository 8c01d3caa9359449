"""Tags, pause and resume through the bindings (``emm.region``, ``emm.pause``,
``emm.resume``, ``emm.tag_stats``) against a driver: emm-standin in CI (its
device memory is host memory, so contents are checked byte for byte), or a GPU.
The current tag is process-wide: these tests open regions only around their own
allocations."""

import ctypes

import pytest

import emm
from conftest import HAS_GPU, ON_STANDIN

pytestmark = [
    pytest.mark.standin,
    pytest.mark.skipif(not (ON_STANDIN or HAS_GPU),
                       reason="needs a driver: a GPU, or emm-standin through EMM_CUDA_DRIVER"),
]

MIB = 1 << 20


@pytest.fixture
def mgr():
    m = emm.Manager(None, 0)
    yield m
    m.close()


def fill(ptr, size, seed):
    data = bytes((seed + i) % 251 for i in range(4096)) * (size // 4096)
    ctypes.memmove(ptr, data, len(data))
    return data


def test_pause_keeps_addresses_and_contents(mgr):
    with emm.region("py-weights"):
        w = [mgr.alloc(s) for s in (4 * MIB, 12 * MIB)]
    with emm.region("py-kv"):
        kv = mgr.alloc(32 * MIB)
    plain = mgr.alloc(MIB)
    kept = []
    if ON_STANDIN:
        kept = [fill(p, s, i) for i, (p, s) in enumerate(zip(w, (4 * MIB, 12 * MIB)))]
    stats = emm.tag_stats("py-weights")
    assert stats["allocated_bytes"] >= 16 * MIB and stats["paused"] == 0
    free_before, _ = mgr.memory_info()

    r = emm.pause(["py-weights", "py-kv"], keep="host")
    assert r["copied_bytes"] >= 48 * MIB
    assert r["bytes"] >= 48 * MIB
    free_after, _ = mgr.memory_info()
    assert free_after - free_before >= r["bytes"]
    s = emm.tag_stats("py-kv")
    assert s["paused"] == 1 and s["reserved_bytes"] == 0 and s["paused_bytes"] >= 32 * MIB

    with emm.region("py-kv"):
        with pytest.raises(emm.TagStateError) as e:
            mgr.alloc(MIB)
    assert "py-kv" in str(e.value) and "paused" in str(e.value)
    with pytest.raises(emm.TagStateError):
        emm.pause("py-kv")
    with pytest.raises(emm.TagStateError):
        emm.pause("default")
    with pytest.raises(emm.TagStateError):
        emm.resume("py-never-paused")
    other = mgr.alloc(2 * MIB)  # untagged allocations go on

    held = emm.tag_stats("py-weights")["host_copy_bytes"]
    assert held >= 16 * MIB
    r2 = emm.resume(["py-weights", "py-kv"])
    assert r2["bytes"] == r["bytes"] and r2["copied_bytes"] == r["copied_bytes"]
    # The pinned buffers stay for the next pause.
    assert emm.tag_stats("py-weights")["host_copy_bytes"] == held
    if ON_STANDIN:
        for p, data in zip(w, kept):
            assert ctypes.string_at(p, len(data)) == data
    with emm.region("py-kv"):
        again = mgr.alloc(MIB)
    for p in w + [kv, plain, other, again]:
        mgr.free(p)
    mgr.trim()
    assert emm.tag_stats("py-weights")["host_copy_bytes"] == 0


def test_regions_nest_and_check_their_arguments(mgr):
    with emm.region("py-outer"):
        a = mgr.alloc(MIB)
        with emm.region("py-inner"):
            b = mgr.alloc(MIB)
        c = mgr.alloc(MIB)
    assert emm.tag_stats("py-outer")["allocated_bytes"] >= 2 * MIB
    assert emm.tag_stats("py-inner")["allocated_bytes"] >= MIB
    with pytest.raises(TypeError):
        with emm.region(3):
            pass
    with pytest.raises(emm.EmmError):
        with emm.region(""):
            pass
    with pytest.raises(ValueError):
        emm.pause("py-outer", keep="disk")
    with pytest.raises(ValueError):
        emm.pause([])
    for p in (a, b, c):
        mgr.free(p)


def test_a_tag_that_c_would_misread_is_refused():
    """Bytes are refused as bytes (they used to be named by their first
    element's type, int); a NUL in a tag is refused, since C would read the tag
    cut there, another tag's name."""
    for call in (emm.pause, emm.resume):
        with pytest.raises(TypeError, match="not bytes"):
            call(b"py-weights")
        with pytest.raises(ValueError, match="NUL"):
            call("py-weights\0-v2")
    with pytest.raises(ValueError, match="NUL"):
        emm.tag_stats("py-weights\0-v2")
    with pytest.raises(ValueError, match="NUL"):
        with emm.region("py-weights\0-v2"):
            pass
