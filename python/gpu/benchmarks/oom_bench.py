"""How fast an allocation that cannot be served fails (issue 36, fast failure):
emm's pool beside PyTorch's caching allocator, one process per variant, two cases:

- limit:     the manager's own cap (emm: EMM_POOL_LIMIT; PyTorch:
             torch.cuda.set_per_process_memory_fraction) refuses the request;
- exhausted: the device is full of live blocks (nothing to reclaim), and the
             request reaches the driver, which refuses it.

Each failure is timed alone (perf_counter_ns around the call that raises); the
median, 10th and 90th percentile of N tries are printed as one JSON line.

    python3 python/gpu/benchmarks/oom_bench.py --variant emm|emm-torch|native|expandable --case limit|exhausted
    python3 python/gpu/benchmarks/oom_bench.py --all   # every variant and case, a process each, rounds rotated
"""

import argparse
import json
import os
import subprocess
import sys
import time

GIB = 1 << 30
VARIANTS = ("emm", "emm-torch", "native", "expandable")
CASES = ("limit", "exhausted")


def _percentiles(ns):
    ns = sorted(ns)
    pick = lambda q: ns[min(len(ns) - 1, int(q * len(ns)))]
    return {"median_us": pick(0.5) / 1e3, "p10_us": pick(0.1) / 1e3, "p90_us": pick(0.9) / 1e3}


def _time_failures(attempt, n, refusal=MemoryError):
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        try:
            attempt()
        except refusal:
            times.append(time.perf_counter_ns() - t0)
            continue
        raise SystemExit("the allocation succeeded: nothing was measured")
    return times


def run_emm(case, n):
    import emm

    if case == "limit":
        os.environ["EMM_POOL_LIMIT"] = str(2 * GIB)
    m = emm.Manager("pool", 0)
    held = []
    if case == "limit":
        held.append(m.alloc(GIB))
        ask = 2 * GIB
    else:
        while True:
            try:
                held.append(m.alloc(GIB))
            except emm.OutOfMemoryError:
                break
        ask = GIB
    return _time_failures(lambda: m.alloc(ask), n), len(held)


def run_torch(variant, case, n):
    if variant == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    if variant == "emm-torch":
        import emm.torch

        if case == "limit":
            os.environ["EMM_POOL_LIMIT"] = str(2 * GIB)
        emm.torch.install()
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    if case == "limit" and variant != "emm-torch":
        torch.cuda.set_per_process_memory_fraction(2 * GIB / total)
    held = []
    if case == "limit":
        held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
        ask = 2 * GIB
    else:
        while True:
            try:
                held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                break
        ask = GIB
    torch.cuda.synchronize()
    attempt = lambda: torch.empty(ask, dtype=torch.uint8, device="cuda")  # noqa: E731
    return _time_failures(attempt, n, torch.OutOfMemoryError), len(held)


def one(variant, case, n):
    if variant == "emm":
        times, held = run_emm(case, n)
    else:
        times, held = run_torch(variant, case, n)
    print(json.dumps({"variant": variant, "case": case, "tries": n, "held_gib": held, **_percentiles(times)}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=VARIANTS)
    p.add_argument("--case", choices=CASES)
    p.add_argument("--tries", type=int, default=200)
    p.add_argument("--all", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    if not a.all:
        one(a.variant, a.case, a.tries)
        return
    rows = []
    for r in range(a.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for case in CASES:
            for v in order:
                out = subprocess.run([sys.executable, __file__, "--variant", v, "--case", case,
                                      "--tries", str(a.tries)], capture_output=True, text=True, timeout=300)
                line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
                if out.returncode != 0 or not line.startswith("{"):
                    print(f"round {r + 1} {case} {v}: failed: {out.stderr.strip()[-400:]}")
                    continue
                row = json.loads(line)
                row["round"] = r + 1
                rows.append(row)
                print(f"round {r + 1} {case:9s} {v:10s} median {row['median_us']:9.1f} us  "
                      f"p10 {row['p10_us']:9.1f}  p90 {row['p90_us']:9.1f}  held {row['held_gib']} GiB", flush=True)
    print("\n| case | variant | median of round medians, us | rounds (median us) |")
    print("|---|---|---|---|")
    for case in CASES:
        for v in VARIANTS:
            meds = [r["median_us"] for r in rows if r["case"] == case and r["variant"] == v]
            if meds:
                mid = sorted(meds)[len(meds) // 2]
                print(f"| {case} | {v} | {mid:.1f} | {', '.join(f'{m:.1f}' for m in meds)} |")


if __name__ == "__main__":
    main()
