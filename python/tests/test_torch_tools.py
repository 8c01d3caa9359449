"""emm.torch's memory tools without PyTorch or a GPU: emm's snapshot JSON (as the
pool writes it) becomes PyTorch's snapshot dict, which pickles and satisfies the
invariants of ``torch.cuda._memory_viz`` (blocks tile segments; segsum's sums);
the summary table names every figure."""

import pickle

import pytest

from conftest import HAS_GPU

KIB = 1024

# As PoolManager::snapshot().to_json() writes it: a small segment with one live and
# one free block, the expandable segment with one live block, a short history.
RAW = {
    "segments": [
        {"address": 4096, "total_size": 4 * KIB, "stream": 0, "large": False, "expandable": False,
         "blocks": [
             {"address": 4096, "size": KIB, "requested_size": KIB, "allocated": True},
             {"address": 5120, "size": 3 * KIB, "requested_size": 3 * KIB, "allocated": False},
         ]},
        {"address": 1 << 40, "total_size": 2 << 20, "stream": 0, "large": True, "expandable": True,
         "blocks": [{"address": 1 << 40, "size": 2 << 20, "requested_size": 2 << 20, "allocated": True}]},
    ],
    "trace": [
        {"action": "segment_alloc", "addr": 4096, "size": 4 * KIB, "stream": 0, "time_us": 1, "device_free": 0},
        {"action": "alloc", "addr": 4096, "size": KIB, "stream": 0, "time_us": 2, "device_free": 0},
        {"action": "segment_map", "addr": 1 << 40, "size": 2 << 20, "stream": 7, "time_us": 3, "device_free": 0},
        {"action": "alloc", "addr": 1 << 40, "size": 2 << 20, "stream": 7, "time_us": 4, "device_free": 0},
        {"action": "oom", "addr": 0, "size": 1 << 30, "stream": 7, "time_us": 5, "device_free": 1 << 20},
    ],
    "stats": {"allocated_bytes.all.current": KIB + (2 << 20), "reserved_bytes.all.current": 4 * KIB + (2 << 20)},
}


def test_the_snapshot_has_pytorchs_keys_and_pickles():
    from emm.torch import to_torch_snapshot

    s = to_torch_snapshot(RAW, device=1)
    assert set(s) == {"segments", "device_traces", "allocator_settings"}
    assert s["device_traces"][0] == [] and len(s["device_traces"]) == 2
    seg = s["segments"][0]
    for key in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"):
        assert key in seg, key
    assert seg["segment_type"] == "small" and s["segments"][1]["segment_type"] == "large"
    assert s["segments"][1]["is_expandable"] is True
    assert [b["state"] for b in seg["blocks"]] == ["active_allocated", "inactive"]
    for b in seg["blocks"]:
        assert set(b) == {"address", "size", "requested_size", "state", "frames"}
    actions = [e["action"] for e in s["device_traces"][1]]
    assert actions == ["segment_alloc", "alloc", "segment_map", "alloc", "oom"]
    assert s["device_traces"][1][-1]["device_free"] == 1 << 20
    for e in s["device_traces"][1]:
        assert {"action", "addr", "size", "stream", "time_us", "frames"} <= set(e)
    assert pickle.loads(pickle.dumps(s)) == s


def test_the_snapshot_satisfies_memory_viz_invariants():
    from emm.torch import to_torch_snapshot

    s = to_torch_snapshot(RAW)
    total_reserved = total_allocated = 0
    for seg in s["segments"]:
        # segsum's assertion: free + allocated == total_size for every segment.
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        offset = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == offset
            offset += b["size"]
        total_reserved += seg["total_size"]
        total_allocated += sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        assert seg["allocated_size"] == seg["active_size"] <= seg["total_size"]
    assert total_reserved == RAW["stats"]["reserved_bytes.all.current"]
    assert total_allocated == RAW["stats"]["allocated_bytes.all.current"]


def test_the_summary_names_every_figure():
    from emm.torch import format_summary

    stats = {
        "allocated_bytes.all.current": 1536, "allocated_bytes.all.peak": 3 << 20,
        "allocated_bytes.all.allocated": 5 << 30, "allocated_bytes.all.freed": 5 << 30,
        "reserved_bytes.all.current": 4 << 20, "reserved_bytes.all.peak": 8 << 20,
        "active_bytes.all.current": 2048, "active_bytes.all.peak": 4 << 20,
        "inactive_split_bytes.all.current": 0, "segment.all.current": 2, "segment.all.peak": 3,
        "allocation.all.current": 3, "allocation.all.peak": 9, "allocation.all.allocated": 100,
        "allocation.all.freed": 97, "num_alloc_retries": 1, "num_ooms": 2, "num_device_alloc": 4,
        "num_device_free": 2, "emm.thread_cached_bytes": 512, "emm.thread_cache_hits": 50,
    }
    text = format_summary(stats, device=0, manager="pool")
    for needle in ("Allocated memory", "Reserved memory", "Active memory", "Allocations",
                   "GPU reserved segments", "1.50 KiB", "8.00 MiB", "5.00 GiB", "OOMs: 2",
                   "Allocation retries: 1", "512 B"):
        assert needle in text, needle
    widths = {len(line) for line in text.splitlines()}
    assert widths == {77}, widths


def test_device_arguments_are_understood():
    from emm._torch_state import device_index as _device_index

    class Dev:
        index = 3

    assert _device_index(2) == 2
    assert _device_index("cuda:1") == 1
    assert _device_index(Dev()) == 3


@pytest.mark.parametrize("device, error", [
    (-1, ValueError), (2**31, OverflowError), (2**32, OverflowError), (1.5, TypeError),
    ("cuda:x", ValueError), ("cuda:-1", ValueError),
])
def test_device_ordinals_are_checked_before_they_reach_c(device, error):
    # As c_int they would wrap: 2**32 to device 0, -1 to "every device".
    from emm._torch_state import device_index as _device_index

    with pytest.raises(error):
        _device_index(device)


@pytest.mark.parametrize("pool, error", [
    ((0, 2**64 + 7), OverflowError), ((0, -(2**64) + 7), ValueError), ((0.9, 7.5), TypeError),
    ((-1, 7), ValueError),
])
def test_pool_ids_are_checked_before_they_reach_c(pool, error):
    # As c_uint64 they would wrap to another pool's id (2**64 + 7 to 7).
    import emm.torch as et

    with pytest.raises(error):
        et.mem_pool_stats(pool, 0)
    with pytest.raises(OverflowError):
        et.mem_pool_stats((0, 7), device=2**32)


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU: a manager must be created")
def test_the_pool_snapshot_matches_its_statistics():  # pragma: no cover - GPU
    import emm
    from emm.torch import to_torch_snapshot

    m = emm.Manager(device=0)
    m.record_history(1000)
    ptrs = [m.alloc(n) for n in (512, 4096, 3 << 20)]
    raw = m.snapshot()
    s = to_torch_snapshot(raw)
    active = sum(b["size"] for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")
    assert active == raw["stats"]["active_bytes.all.current"]
    assert sum(seg["total_size"] for seg in s["segments"]) == raw["stats"]["reserved_bytes.all.current"]
    assert any(e["action"] == "alloc" for e in s["device_traces"][0])
    for p in ptrs:
        m.free(p)
    m.record_history(0)
    m.close()


@pytest.mark.parametrize("text, message", [
    ("pool_limit:1G,pool_limit:2G", "pool_limit sets pool_limit"),
    ("per_process_memory_fraction:0.5,pool_limit:8G", "pool_limit sets pool_limit"),
    ("expandable_segments:True,pool_expandable:0", "pool_expandable sets pool_expandable"),
    ("garbage_collection_threshold:1.0", "below 1"),
    ("expandable_segments:true", "True or False"),
])
def test_pytorchs_settings_are_read_as_emm_replay_reads_them(text, message):
    # A setting given twice (or by two keys) is refused, and the values follow
    # PyTorch's own rules, as `emm replay --pytorch-conf` does.
    from emm._torch_settings import translate

    with pytest.raises(ValueError, match=message):
        translate(text, lambda: 80 << 30)
    assert translate("garbage_collection_threshold:0.5", lambda: 100) == [("pool_release_threshold", "50")]
