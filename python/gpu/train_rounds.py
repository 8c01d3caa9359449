"""Interleaved rounds of train_bench.py: every variant of a workload once per round,
the order rotated each round, one process each; then one table per workload.

    python3 train_rounds.py [--rounds 3] [--workloads gpt2 resnet50 gpt2-infer]
                            [--variants native expandable emm-pool emm-hostonly]
                            [--steps 30] [--warmup 6] [--ddp G] [--shapes fresh|bucketed]
                            [--pin CPUS] [--log FILE]

--ddp G runs each process under torchrun on G GPUs (workload gpt2 or llama).
Prints, per workload and variant: the median over rounds of each round's median
step, the spread (min-max of round medians), the median and mean of every timed
step of every round, how many timed steps made the allocator do driver work (from
its counters), peak reserved, peak allocated, their ratio, driver allocations and
final loss.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def run_one(args, workload, variant, log):
    cmd = [sys.executable, str(HERE / "train_bench.py"), "--variant", variant, "--workload", workload,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--sdpa", args.sdpa,
           "--shapes", args.shapes]
    if args.ddp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ddp}",
               *cmd[1:], "--ddp"]
    if args.pin:
        cmd = ["taskset", "-c", args.pin, *cmd]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    log.write(f"== {workload} {variant} rc={p.returncode}\n{p.stdout}\n{p.stderr[-4000:]}\n")
    log.flush()
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"{workload} {variant}: no result (rc={p.returncode}); see the log", file=sys.stderr)
    return None


def gib(n):
    return f"{n / 2**30:.2f}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workloads", nargs="+", default=["gpt2", "resnet50", "gpt2-infer"])
    p.add_argument("--variants", nargs="+", default=["native", "expandable", "emm-pool", "emm-hostonly"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--ddp", type=int, default=0)
    p.add_argument("--sdpa", choices=("auto", "flash"), default="auto")
    p.add_argument("--shapes", choices=("fresh", "bucketed"), default="fresh",
                   help="as train_bench.py: a new shape every step, or 8 shapes seen in warmup")
    p.add_argument("--pin", help="CPU list every process is pinned to (taskset -c)")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--log", default=os.path.join(os.environ.get("OUT", "/tmp"), "train_rounds.log"))
    args = p.parse_args()
    results = {}
    with open(args.log, "a") as log:
        for r in range(args.rounds):
            for w in args.workloads:
                k = r % len(args.variants)
                for v in args.variants[k:] + args.variants[:k]:
                    res = run_one(args, w, v, log)
                    if res:
                        results.setdefault((w, v), []).append(res)
                        print(f"round {r + 1} {w:10} {v:14} median {res['median_ms']:7.2f} ms  "
                              f"reserved {gib(res['peak_reserved'])} GiB  loss {res['final_loss']:.5f}", flush=True)
    world = (f", {args.ddp} GPUs (DDP)" if args.ddp else "") + f", {args.shapes} shapes" + (", flash attention" if args.sdpa == "flash" else "")
    for w in args.workloads:
        print(f"\n## {w}{world}: {args.rounds} interleaved rounds, {args.steps} timed steps each")
        print("| variant | step ms, median of rounds | spread (round medians) | all timed steps: median / mean "
              "| timed steps with driver work | peak reserved GiB "
              "| peak allocated GiB | reserved/allocated | driver allocs | final loss |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for v in args.variants:
            rs = results.get((w, v), [])
            if not rs:
                print(f"| {v} | no result | | | | | | |")
                continue
            meds = [x["median_ms"] for x in rs]
            steps = [t for x in rs for t in x["step_ms"]]
            # Timed steps whose allocator counters show driver work (allocations,
            # frees, pieces mapped or moved, synchronizations): where an allocator's
            # own cost can show in a step.
            busy = sum(1 for x in rs for c in x.get("step_changes", [])[-len(x["step_ms"]):]
                       if any(c.get(k) for k in ("num_device_alloc", "num_device_free", "pieces_mapped",
                                                 "pieces_moved", "device_syncs", "num_alloc_retries")))
            res = max(x["peak_reserved"] for x in rs)
            alloc = max(x["peak_allocated"] for x in rs)
            ratio = res / alloc if alloc else float("nan")
            print(f"| {v} | {statistics.median(meds):.2f} | {min(meds):.2f}-{max(meds):.2f} | "
                  f"{statistics.median(steps):.2f} / {statistics.mean(steps):.2f} | {busy} of {len(steps)} | "
                  f"{gib(res)} | {gib(alloc)} | {ratio:.3f} | {max(x['driver_allocs'] for x in rs)} | "
                  f"{rs[-1]['final_loss']:.5f} |")


if __name__ == "__main__":
    main()
