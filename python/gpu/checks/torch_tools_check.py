"""PyTorch's memory tools through emm on a GPU: a small training loop under
``emm.torch.install()``, then ``emm.torch``'s memory_stats / memory_summary /
max_memory_reserved / reset_peak_memory_stats, a snapshot dumped and rendered by
PyTorch's own ``torch.cuda._memory_viz`` (segment_plot, trace_plot, memory,
segsum, trace), and its totals checked against the statistics. Exits non-zero on
a mismatch; prints one OK line.

    EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=python \\
        python3 python/gpu/checks/torch_tools_check.py $OUT
"""

import os
import pickle
import sys


def fail(msg):
    print(f"torch_tools_check: FAIL: {msg}")
    sys.exit(1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    import emm.torch as et

    et.install()
    import torch
    from torch.cuda import _memory_viz as viz

    dev = torch.device("cuda:0")
    et.record_memory_history(True, max_entries=200_000)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(20):
        x = torch.randn(256 + 32 * (step % 4), 1024, device=dev)
        y = torch.randint(0, 10, (x.shape[0],), device=dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    big = torch.empty(64 << 20, dtype=torch.uint8, device=dev)  # a large block
    torch.cuda.synchronize()

    stats = et.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
                "reserved_bytes.all.peak", "active_bytes.all.current", "segment.all.current", "num_ooms",
                "num_alloc_retries", "num_device_alloc", "num_device_free", "allocation.all.current"):
        if key not in stats:
            fail(f"memory_stats() lacks {key}")
    if stats["allocated_bytes.all.current"] < big.numel():
        fail(f"allocated {stats['allocated_bytes.all.current']} < the 64 MiB tensor held")
    if et.max_memory_reserved() < et.memory_reserved() or et.max_memory_allocated() < et.memory_allocated():
        fail("a peak below its current value")
    summary = et.memory_summary()
    if "Allocated memory" not in summary or "Reserved memory" not in summary:
        fail("memory_summary() lacks its rows")
    with open(os.path.join(out, "torch_tools_summary.txt"), "w") as f:
        f.write(summary)

    path = os.path.join(out, "torch_tools_snapshot.pickle")
    et.dump_snapshot(path)
    stats = et.memory_stats()  # after the snapshot (it returns this thread's cache)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    reserved = sum(s["total_size"] for s in snap["segments"])
    active = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    if reserved != stats["reserved_bytes.all.current"]:
        fail(f"segments sum to {reserved}, reserved_bytes.all.current is {stats['reserved_bytes.all.current']}")
    if active != stats["active_bytes.all.current"]:
        fail(f"active_allocated blocks sum to {active}, active_bytes.all.current is "
             f"{stats['active_bytes.all.current']}")
    cached = stats["emm.thread_cached_bytes"]
    if active - cached != stats["allocated_bytes.all.current"]:
        fail(f"active_allocated blocks ({active}) less other threads' cached blocks ({cached}) are not "
             f"allocated_bytes.all.current ({stats['allocated_bytes.all.current']})")
    trace = snap["device_traces"][0]
    if not any(e["action"] == "alloc" for e in trace):
        fail("the recorded trace has no alloc")

    # PyTorch's own renderers (no flamegraph download: the text is returned as is).
    def keep(text):
        return text

    rendered = {
        "segment_plot.html": viz.segment_plot(snap),
        "trace_plot.html": viz.trace_plot(snap),
        "memory.txt": viz.memory(snap, format_flamegraph=keep),
        "segments.txt": viz.segments(snap, format_flamegraph=keep),
        "segsum.txt": viz.segsum(snap),
        "trace.txt": viz.trace(snap),
    }
    for name, text in rendered.items():
        with open(os.path.join(out, f"torch_tools_{name}"), "w") as f:
            f.write(text)

    et.reset_peak_memory_stats()
    after = et.memory_stats()
    if after["reserved_bytes.all.peak"] != after["reserved_bytes.all.current"]:
        fail("reset_peak_memory_stats() left reserved_bytes.all.peak above current")
    if after["allocated_bytes.all.peak"] != after["allocated_bytes.all.current"]:
        fail("reset_peak_memory_stats() left allocated_bytes.all.peak above current")
    del big
    et.empty_cache()
    et.record_memory_history(False)
    print(f"torch_tools_check: OK allocated {stats['allocated_bytes.all.current']} active {active} "
          f"(thread-cached {cached}) reserved {reserved} segments {len(snap['segments'])} "
          f"trace {len(trace)} entries, peak reserved before reset {stats['reserved_bytes.all.peak']}; "
          f"viz rendered {len(rendered)} views")


if __name__ == "__main__":
    main()
