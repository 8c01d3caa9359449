"""`emm replay --fit` against PyTorch's allocator on a device of that size: a
ballast (cudaMalloc outside PyTorch's allocator) leaves exactly BYTES of the GPU
free, then the trace replays through PyTorch's caching allocator
(`torch.cuda.caching_allocator_alloc`/`caching_allocator_delete`) with the same
pass plan as `emm replay --passes N` and `torch_replay` (what the trace frees is
made again each pass; what it never frees is kept when made in its first half and
freed at each pass's end, in trace order, when made in its second half), the
stream column honoured. Unlike `torch_replay --fraction`, this is the device the
models of `--device-memory` and `--fit` stand for: the driver refuses memory past
it, for `cudaMalloc` and for expandable segments' `cuMemCreate` alike.

    python3 python/gpu/checks/fit_device_check.py TRACE.csv VARIANT BYTES [--passes N]

VARIANT: pytorch-native or pytorch-expandable (run each in a process of its own:
the setting is read when CUDA starts). Prints `ran` or `OOM at event K`.
"""

import argparse
import ctypes
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("variant", choices=["pytorch-native", "pytorch-expandable"])
    ap.add_argument("bytes", type=int)
    ap.add_argument("--passes", type=int, default=3)
    a = ap.parse_args()
    if a.variant == "pytorch-expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import torch

    ops = []
    with open(a.trace) as f:
        next(f)
        for line in f:
            p = line.strip().split(",")
            if len(p) >= 3:
                ops.append((p[0], int(p[1]), int(p[2]), int(p[3]) if len(p) > 3 and p[3] else 0))
    live_at_end = {}
    for k, (op, i, _, _) in enumerate(ops):
        if op == "a":
            live_at_end[i] = k
        else:
            live_at_end.pop(i, None)
    kept = {k for k in live_at_end.values() if k < len(ops) // 2}

    torch.cuda.init()
    streams = {}

    def stream_of(s):
        if s == 0:
            return 0
        if s not in streams:
            streams[s] = torch.cuda.Stream()
        return streams[s].cuda_stream

    # Warm up what the replay itself uses (streams), then the ballast.
    for _, _, _, s in ops:
        stream_of(s)
    torch.cuda.synchronize()
    cudart = ctypes.CDLL("libcudart.so")
    free, total = torch.cuda.mem_get_info()
    ballast = ctypes.c_void_p()
    take = free - a.bytes
    if take > 0 and cudart.cudaMalloc(ctypes.byref(ballast), ctypes.c_size_t(take)) != 0:
        print(f"could not place a ballast of {take} bytes", file=sys.stderr)
        return 2
    free_now, _ = torch.cuda.mem_get_info()
    print(f"device {total} bytes, ballast {take}, free now {free_now} (asked {a.bytes})")

    held = []
    for p in range(a.passes):
        live = {}
        for k, (op, i, size, s) in enumerate(ops):
            if op == "a":
                if p > 0 and k in kept:
                    continue
                if size == 0:
                    continue
                try:
                    ptr = torch.cuda.caching_allocator_alloc(size, device=0, stream=stream_of(s))
                except torch.OutOfMemoryError:
                    print(f"{a.trace} {a.variant} on {a.bytes} bytes: OOM at event {k} of pass {p + 1}, reserved {torch.cuda.memory_reserved()}")
                    return 0
                if k in kept:
                    held.append(ptr)
                else:
                    live[i] = ptr
            else:
                ptr = live.pop(i, None)
                if ptr is not None:
                    torch.cuda.caching_allocator_delete(ptr)
        for i in sorted(live, key=lambda i: live_at_end.get(i, 0)):
            torch.cuda.caching_allocator_delete(live[i])
    print(f"{a.trace} {a.variant} on {a.bytes} bytes: ran, peak reserved {torch.cuda.max_memory_reserved()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
