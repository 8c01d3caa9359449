"""emm's own PyTorch allocator object on a GPU (``emm.torch.install()``, the
default path): it is the one installed, tensors through it hold the data written
to them, on the current stream and on a side stream, emm's counters return to
where they were when the tensors go, PyTorch's raw allocations (cuBLAS workspaces,
``caching_allocator_alloc``) still work, an impossible request raises
``torch.OutOfMemoryError`` with emm's reason, PyTorch's own memory tools
(``torch.cuda.memory_stats`` and what is built on it, the peak and accumulated
resets, ``empty_cache``, ``_record_memory_history`` / ``_snapshot`` /
``_dump_snapshot`` and ``_memory_viz``) answer from emm, cuDNN's benchmark mode
(which asks the allocator's ``cacheInfo``) runs, and training steps run.

    EMM_LIBRARY=... PYTHONPATH=python python3 python/gpu/checks/torch_native_check.py [--pluggable]

``--pluggable`` checks the same PyTorch tools under PyTorch's pluggable object
over emm (the fallback where no compiler is found), where ``emm.torch`` routes them
in Python; the object-only parts (out of memory, the raw path) run as well.
Prints ``torch_native_check: OK`` and exits 0, or says what failed and exits 1.
"""
import sys
import time


def main():
    import emm.torch as et

    pluggable = "--pluggable" in sys.argv
    t0 = time.perf_counter()
    et.install(native=not pluggable)
    built = time.perf_counter() - t0
    import torch

    assert et.installed() == ("pluggable" if pluggable else "native"), et.installed()
    if pluggable:
        print(f"installed PyTorch's pluggable allocator object over emm in {built:.1f} s")
    else:
        print(f"installed emm's own allocator object in {built:.1f} s "
              f"(a compile the first time, then the cached library)")
    dev = torch.device("cuda", 0)
    base = et.memory_allocated(dev)

    # Data survives, sizes from 1 byte to 1 GiB, on the current stream.
    kept = []
    for n in (1, 511, 512, 4097, 1 << 20, (1 << 20) + 3, 64 << 20, 1 << 30):
        x = torch.empty(n, dtype=torch.uint8, device=dev)
        x.copy_(torch.arange(n, device=dev, dtype=torch.int64).remainder(251).to(torch.uint8))
        kept.append((n, x))
    for n, x in kept:
        want = torch.arange(n, device=dev, dtype=torch.int64).remainder(251).to(torch.uint8)
        assert torch.equal(x, want), f"{n} bytes: data changed"
    assert et.memory_allocated(dev) > base
    del kept, x, want
    torch.cuda.synchronize(dev)
    assert et.memory_allocated(dev) == base, (et.memory_allocated(dev), base)

    # A side stream: allocated and freed there, data intact.
    s = torch.cuda.Stream(dev)
    with torch.cuda.stream(s):
        y = torch.full((1 << 22,), 7.0, device=dev)
        z = y * 3
    s.synchronize()
    assert float(z.sum()) == 21.0 * (1 << 22)
    del y, z
    torch.cuda.synchronize(dev)
    assert et.memory_allocated(dev) == base

    # PyTorch's raw path goes through emm's table as well.
    p = torch.cuda.caching_allocator_alloc(3 << 20, device=0)
    assert p != 0 and et.memory_allocated(dev) > base
    torch.cuda.caching_allocator_delete(p)
    assert et.memory_allocated(dev) == base
    a = torch.randn(2048, 2048, device=dev)
    b = a @ a  # cuBLAS's workspace comes through allocate()
    assert torch.isfinite(b).all()
    del a, b

    # Out of memory: PyTorch's exception type, with emm's reason (PyTorch's
    # pluggable object hands out a tensor at address 0 instead: not checked there).
    if not pluggable:
        try:
            torch.empty(1 << 50, dtype=torch.uint8, device=dev)
        except torch.OutOfMemoryError as e:
            assert "emm could not allocate" in str(e), str(e)
            print(f"out of memory raised as expected: {str(e).splitlines()[0][:160]}")
        else:
            raise AssertionError("a 1 PiB tensor did not raise torch.OutOfMemoryError")

    pytorch_tools(torch, et, dev, pluggable)

    # A few training steps; gradients and optimizer state come and go.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters())
    for step in range(20):
        x = torch.randn(64 + step, 512, device=dev)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize(dev)
    assert torch.isfinite(loss)
    print(f"20 training steps, loss {float(loss):.5f}; allocated {et.memory_allocated(dev)} B, "
          f"peak reserved {et.max_memory_reserved(dev)} B")
    print("torch_native_check: OK")


def pytorch_tools(torch, et, dev, pluggable=False):
    """PyTorch's own memory tools, called as a user calls them, answer from emm."""
    import os
    import pickle
    import tempfile

    mib = 1 << 20
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    assert base == et.memory_allocated(dev), (base, et.memory_allocated(dev))
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.reset_accumulated_memory_stats(dev)
    assert torch.cuda.memory_stats(dev)["allocation.all.allocated"] == 0

    big = torch.empty(256 * mib, dtype=torch.uint8, device=dev)
    stats = torch.cuda.memory_stats(dev)
    assert stats["allocation.all.allocated"] == 1, stats["allocation.all.allocated"]
    assert torch.cuda.memory_allocated(dev) >= base + 256 * mib
    assert torch.cuda.max_memory_allocated(dev) >= base + 256 * mib
    assert torch.cuda.memory_reserved(dev) >= torch.cuda.memory_allocated(dev)
    assert torch.cuda.max_memory_reserved(dev) >= torch.cuda.memory_reserved(dev)
    assert stats["segment.all.current"] >= 1 and stats["reserved_bytes.all.current"] >= 256 * mib, stats
    summary = torch.cuda.memory_summary(dev)
    assert "Allocated memory" in summary, summary[:400]
    del big
    torch.cuda.synchronize(dev)
    assert torch.cuda.memory_allocated(dev) == base
    assert torch.cuda.max_memory_allocated(dev) >= base + 256 * mib, "the peak stays until a reset"
    torch.cuda.reset_peak_memory_stats(dev)
    assert torch.cuda.max_memory_allocated(dev) == torch.cuda.memory_allocated(dev)
    held = torch.cuda.memory_reserved(dev)
    torch.cuda.empty_cache()
    after = torch.cuda.memory_reserved(dev)
    assert after <= held - 256 * mib, f"empty_cache kept {held} -> {after} bytes"
    print(f"torch.cuda.memory_stats / max_memory_allocated / resets / memory_summary from emm; "
          f"empty_cache gave back {(held - after) / mib:.0f} MiB")

    # The allocation history through PyTorch's own functions, rendered by _memory_viz.
    torch.cuda.memory._record_memory_history("all", "all", "all", 1000)  # PyTorch's positional order
    t = torch.empty(3 * mib, dtype=torch.uint8, device=dev)
    addr = t.data_ptr()
    snap = torch.cuda.memory._snapshot()
    assert any(b["address"] == addr and b["state"] == "active_allocated"
               for seg in snap["segments"] for b in seg["blocks"]), "the live tensor is not in the snapshot"
    del t
    path = os.path.join(tempfile.mkdtemp(), "emm_snapshot.pickle")
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        dumped = pickle.load(f)
    actions = [e["action"] for e in dumped["device_traces"][dev.index]]
    assert "alloc" in actions and any(a.startswith("free") for a in actions), actions
    assert isinstance(torch.cuda.memory_snapshot(), list)
    from torch.cuda import _memory_viz

    html = _memory_viz.trace_plot(dumped)
    assert len(html) > 1000
    print(f"_record_memory_history / _snapshot / _dump_snapshot: {len(actions)} events; "
          f"_memory_viz.trace_plot rendered {len(html)} bytes")

    # (recordStream from PyTorch reaching emm: record_stream_check.py.)
    assert getattr(torch.Tensor.record_stream, "_emm_routed", False) == pluggable

    # cuDNN's benchmark mode sizes workspaces from the allocator's cacheInfo.
    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(dev)
    try:
        out = conv(torch.randn(16, 64, 56, 56, device=dev))
        out.float().sum().backward()
        torch.cuda.synchronize(dev)
    except RuntimeError as e:
        if not pluggable:
            raise
        # PyTorch's pluggable object raises for cacheInfo; only its C++ can answer.
        print(f"cuDNN benchmark mode under PyTorch's pluggable object: {str(e).splitlines()[0][:160]}")
    else:
        assert torch.isfinite(conv.weight.grad).all()
        print("cuDNN benchmark mode ran through " + ("PyTorch's pluggable object" if pluggable else "emm's object"))
    torch.backends.cudnn.benchmark = False


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"torch_native_check: FAILED: {e}")
        sys.exit(1)
