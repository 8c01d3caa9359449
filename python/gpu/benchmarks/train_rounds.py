"""Interleaved rounds of train_bench.py: every variant of a workload once per round,
the order rotated each round, one process each; then one table per workload.

    python3 train_rounds.py [--rounds 3] [--workloads gpt2 resnet50 gpt2-infer]
                            [--variants native expandable emm-pool emm-hostonly
                                        emm-pool:EMM_POOL_WAIT_PARKED=0]
                            [--steps 30] [--warmup 6] [--ddp G] [--shapes fresh|bucketed]
                            [--pin CPUS] [--gpus G | --lockstep] [--log FILE] [--no-telemetry]
                            [--first-round N] [--resume LOG]
    python3 train_rounds.py --from-log FILE [FILE ...]

A variant VARIANT:NAME=VALUE[,NAME=VALUE...] runs train_bench.py's VARIANT with
those environment variables set in its process, under that whole name (two
settings of emm's pool as two variants of the same rotated rounds).
--resume LOG [LOG ...] goes on with a run a call's limit stopped in the middle of
a round: the processes whose results the last run of each LOG holds (the earlier
calls' logs, in the order they ran) are not run again and join this run's tables;
the others run in the order their rounds rotate to. Meant for the next call on
the same machine, which nothing here checks (nor the warmup).
--ddp G runs each process under torchrun on G GPUs (workload gpt2 or llama);
--fsdp makes that FSDP2 (fully_shard per block, bf16) instead of DDP.
--gpus G runs a round's variants at once, one per GPU, each variant moving to the
next GPU every round (G >= the variants; one GPU's speed then weighs on every
variant alike over G rounds).
--lockstep runs a round's variants at once on one GPU, taking turns step by step
(turns.py: a ring of pipes; the ring's order rotates each round and its direction
turns every other round, so with three variants each follows each other one), so
each step index of every variant runs on the same
stretch of the host; the tables then add each of emm's variants beside each
PyTorch variant step by step, with a 95 % interval over blocks of ten steps.
Prints, per workload and variant: the time of all timed steps of a process (what
the user waits for: an epoch of those steps), median over rounds and its spread;
the median of each round's median step; the median and mean of every timed step of
every round; how many timed steps made the allocator do driver work (from its
counters); peak reserved, peak allocated, their ratio, driver allocations and final
loss. Then, per round, each variant's total beside the faster PyTorch variant of the
same round (rounds are adjacent in time, so this pairs like with like), and the
GPU's SM clock during each process's timed steps (nvidia-smi, sampled every 100 ms)
and the process's host calibration (train_bench.py: a fixed Python loop, and an
in-place kernel launch), so a slow process can be told from a slow allocator.
Then the steps that ran on a steady host (train_bench.py times a fixed ~1 ms Python
loop just before each timed step; a step counts when its loop took at most 1.15x the
fastest of the workload, and again at 1.3x where 1.15x leaves under a tenth of the
step indices), compared step index by step index (the same shapes). And every
timed step in one least-squares fit of its log time on its step index, its process
and the log of its host probe (host_fit.py): each variant's steps beside the faster
PyTorch variant's at equal shapes and host speed, over its rounds and round by round.
Per round, each of emm's variants' excess over the faster PyTorch variant's
step of the same index, summed over the steps in which its allocator did driver
work (with the pieces it moved) and over the others: what the moves cost apart
from the host's noise.
For emm's variants, what a timed step made the pool do (claims of other threads'
caches, events recorded and queried, parked blocks taken back, pieces moved and
unmapped): the median step's count and the total.
"""
import argparse
import datetime
import gzip
import json
import lzma
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the modules beside this file (python/gpu is no package)
from round_variants import split_variant  # noqa: E402
from rounds_tables import gib, gib_or_dash, tables  # noqa: E402


LOG_LOCK = threading.Lock()


def run_one(args, workload, variant, rnd, log, gpu=None):
    """One process of `variant` on `workload`, run to its end: its RESULT record
    (with the round, its GPU telemetry and total), or None."""
    return collect(args, workload, variant, rnd, log, *launch(args, workload, variant, gpu), gpu=gpu)


def launch(args, workload, variant, gpu=None, turn_fds=None):
    """Starts one process of `variant` on `workload` (taking turns through the two
    descriptors `turn_fds` where given, which it inherits) and the GPU's sampler
    beside it: (process, sampler)."""
    bench, extra = split_variant(variant)
    cmd = [sys.executable, str(HERE / "train_bench.py"), "--variant", bench, "--workload", workload,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--sdpa", args.sdpa,
           "--shapes", args.shapes]
    if args.profile:
        cmd += ["--profile", args.profile]
    if turn_fds:
        cmd += ["--turn-fds", ",".join(str(fd) for fd in turn_fds)]
    if args.ddp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.ddp}",
               *cmd[1:], "--ddp"] + (["--fsdp"] if args.fsdp else [])
    if args.pin:
        cmd = ["taskset", "-c", args.pin, *cmd]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update(extra)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if args.ddp:
        # NVLink multicast stays off on shared hosts (it can take their GPUs out
        # of service), in every rank torchrun starts.
        for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
            env.setdefault(var, "0" if var == "NCCL_NVLS_ENABLE" else "1")
    sampler = Telemetry(gpu) if args.telemetry else None
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                pass_fds=tuple(turn_fds or ()))
    except BaseException:
        if sampler:
            sampler.stop()
        raise
    return proc, sampler


def collect(args, workload, variant, rnd, log, proc, sampler, gpu=None, note=None):
    """Waits for a process `launch` started, logs its output and returns its
    RESULT record with the round, telemetry and total (and `note`'s keys), or
    None. Past --timeout it is stopped (SIGTERM, which torchrun passes on to its
    workers, then SIGKILL), what it wrote is logged and the run goes on
    without it."""
    try:
        try:
            out, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            out, err = stop(proc)
            err += f"\ntrain_rounds: stopped after --timeout {args.timeout} s"
    finally:
        samples = sampler.stop() if sampler else []
    window = None
    for line in out.splitlines():
        if line.startswith("RESULT "):
            window = json.loads(line[7:]).get("timed_window")
    telemetry = Telemetry.summary(samples, window)
    if gpu is not None:
        telemetry["device"] = gpu
    with LOG_LOCK:
        log.write(f"== {workload} {variant} round={rnd} rc={proc.returncode} gpu={json.dumps(telemetry)}\n{out}\n{err[-4000:]}\n")
        log.flush()
    for line in out.splitlines():
        if line.startswith("PROFILE "):
            print(line, flush=True)
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["gpu"] = telemetry
            res["total_ms"] = sum(res["step_ms"])
            res["round"] = rnd
            res["variant"] = variant  # with its settings, as --variants named it
            res.update(note or {})
            return res
    print(f"{workload} {variant}: no result (rc={proc.returncode}); see the log", file=sys.stderr)
    return None


def stop(proc):
    """Ends a process past its time and reads what it wrote: SIGTERM first (torchrun
    stops its workers, which hold the output pipes, on it), SIGKILL after 30 s;
    ("", "") where the pipes are still held after that."""
    proc.terminate()
    try:
        return proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        return "", ""


def lockstep(args, workload, variants, rnd, log):
    """A round's variants at once on one GPU, taking turns step by step (turns.py):
    a ring of pipes, process j reading from pipe j and writing to pipe j + 1, the
    first turn handed to the first. Every variant's step i then runs within one
    ring's time of the others' on the same host. [(variant, result or None)]."""
    if not variants:
        return []
    pipes = [os.pipe() for _ in variants]
    started = []
    try:
        for j, v in enumerate(variants):
            turn_fds = (pipes[j][0], pipes[(j + 1) % len(variants)][1])
            started.append((v, *launch(args, workload, v, turn_fds=turn_fds)))
    finally:
        # Only the processes hold the ring now: one that ends closes its ends, so
        # the next reads end of file rather than waiting forever. The first turn
        # is written before the launcher lets go of the first pipe.
        if started:
            os.write(pipes[0][1], b"t")
        for r, w in pipes:
            os.close(r)
            os.close(w)
    ring = [v for v, _, _ in started]
    with ThreadPoolExecutor(len(started)) as pool:
        # Every process's output read at once (one blocked on a full pipe would
        # stop the ring).
        return list(pool.map(
            lambda j: (started[j][0], collect(args, workload, started[j][0], rnd, log, started[j][1], started[j][2],
                                              note={"lockstep": {"ring": ring, "position": j}})),
            range(len(started))))


def used_text(res):
    """The process's device-used peak in GiB, or '-' where it could not be read."""
    return gib_or_dash(res.get("device_used_peak", 0))


def first_visible_gpu():
    """The GPU the benchmark's rank 0 runs on, as nvidia-smi numbers it: the first
    entry of CUDA_VISIBLE_DEVICES, else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or "0"


class Telemetry:
    """Samples the first visible GPU's SM clock, power draw and temperature with
    nvidia-smi while one process runs; `summary` reduces the samples taken during
    its timed steps."""

    QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu"

    def __init__(self, gpu=None):
        self.out = tempfile.TemporaryFile(mode="w+")
        try:
            self.proc = subprocess.Popen(
                ["nvidia-smi", "-i", gpu if gpu is not None else first_visible_gpu(), f"--query-gpu={self.QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                stdout=self.out, stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    def stop(self):
        """Ends sampling; the samples as (seconds since the epoch, SM MHz, W, C)."""
        if self.proc is None:
            return []
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.out.seek(0)
        rows = []
        for line in self.out:
            try:
                stamp, *rest = line.split(",")
                when = datetime.datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append((when, *(float(x) for x in rest)))
            except ValueError:
                continue  # "[N/A]" or a partial line
        self.out.close()
        return rows

    @staticmethod
    def summary(rows, window):
        """Median and minimum SM clock (MHz), peak power (W) and temperature (C) over
        the samples inside `window` (the timed steps' wall-clock span, seconds since
        the epoch); {} when no sample fell inside it."""
        if window:
            rows = [r for r in rows if window[0] <= r[0] <= window[1]]
        if not rows:
            return {}
        clocks = [r[1] for r in rows]
        return {"sm_mhz_median": statistics.median(clocks), "sm_mhz_min": min(clocks),
                "power_w_max": max(r[2] for r in rows), "temp_c_max": max(r[3] for r in rows),
                "samples": len(rows)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--first-round", type=int, default=1,
                   help="number the rounds from this one (and rotate the order as that round would): a "
                        "run too long for one call goes on in the next, and --from-log tables the logs of "
                        "both together")
    p.add_argument("--resume", metavar="LOG", nargs="+",
                   help="do not run again the processes whose results the last run of each LOG holds "
                        "(earlier calls', stopped in the middle of a round, in the order they ran); they "
                        "join this run's tables")
    p.add_argument("--workloads", nargs="+", default=["gpt2", "resnet50", "gpt2-infer"])
    p.add_argument("--variants", nargs="+", default=["native", "expandable", "emm-pool", "emm-hostonly"])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--ddp", type=int, default=0)
    p.add_argument("--fsdp", action="store_true", help="with --ddp G: FSDP2 instead of DDP")
    p.add_argument("--sdpa", choices=("auto", "flash"), default="auto")
    p.add_argument("--shapes", choices=("fresh", "bucketed"), default="fresh",
                   help="as train_bench.py: a new shape every step, or 8 shapes seen in warmup")
    p.add_argument("--pin", help="CPU list every process is pinned to (taskset -c)")
    p.add_argument("--gpus", type=int, default=0,
                   help="run a round's variants at once, each on a GPU of its own (one process per GPU), "
                        "the GPUs rotated between rounds so each variant meets each GPU; needs as many "
                        "GPUs as variants (not with --ddp)")
    p.add_argument("--lockstep", action="store_true",
                   help="run a round's variants at once on one GPU, taking turns step by step (turns.py): "
                        "each step index of every variant on the same host stretch; the device-used peak "
                        "is then each process's own, from NVML")
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--profile", metavar="DIR",
                   help="each process also runs 6 steps under PyTorch's profiler after its timed ones "
                        "(train_bench.py --profile; the last round's tables are kept)")
    p.add_argument("--no-telemetry", dest="telemetry", action="store_false",
                   help="do not sample the GPU's clock, power and temperature with nvidia-smi")
    p.add_argument("--log", default=os.path.join(os.environ.get("OUT", "/tmp"), "train_rounds.log"))
    p.add_argument("--from-log", metavar="FILE", nargs="+",
                   help="run nothing: print the tables from the RESULT lines of earlier runs' logs "
                        "(what a run cut short still wrote); with several files, the last run of each, "
                        "together (rounds split over calls with --first-round); a FILE may be compressed "
                        "(.xz or .gz, as docs/runs/ keeps them)")
    args = p.parse_args()
    for v in args.variants:
        try:
            split_variant(v)
        except ValueError as e:
            p.error(str(e))
    if args.from_log:
        results = from_log(args)
        tables(args, results)
        return
    if args.gpus and (args.ddp or args.gpus < len(args.variants)):
        p.error("--gpus needs at least one GPU per variant and no --ddp")
    if args.lockstep and (args.gpus or args.ddp or args.profile):
        p.error("--lockstep runs a round's processes on one GPU: not with --gpus, --ddp or --profile")
    if args.lockstep and args.resume:
        # A round's processes pair up step by step only within one ring.
        p.error("--lockstep runs each round whole: not with --resume (go on with --first-round)")
    if args.first_round < 1:
        p.error("--first-round counts from 1")
    if any(os.path.abspath(r) == os.path.abspath(args.log) for r in args.resume or []):
        # A run marks its start in its log, and only a log's last run is read back.
        p.error("--resume needs a --log of its own: the resumed run's results would be read back no more")
    results = resumed(args.resume, args) if args.resume else {}
    finished = {(w, v, x["round"]) for (w, v), runs in results.items() for x in runs}
    this_run = range(args.first_round - 1, args.first_round - 1 + args.rounds)
    for w, v in results:
        if w not in args.workloads or v not in args.variants:
            print(f"--resume: {w} {v} is not among this run's workloads and variants; "
                  f"its processes are not tabled", flush=True)
    for w in args.workloads:
        for r in sorted({r for (w_, _, r) in finished if w_ == w} - set(this_run)):
            left = [v for v in args.variants if (w, v, r) not in finished]
            if left:
                print(f"--resume: round {r + 1} of {w} is outside this run's rounds and lacks {' '.join(left)}; "
                      f"it stays short (see --first-round)", flush=True)
    with open(args.log, "a") as log:
        # Marks where this run starts in a log that may hold earlier ones.
        log.write("=== train_rounds " + json.dumps({"sdpa": args.sdpa, "argv": sys.argv[1:]}) + "\n")
        for r in this_run:
            for w in args.workloads:
                for v in args.variants:
                    if (w, v, r) in finished:
                        print(f"round {r + 1} {w:10} {v:16} in a resumed log: not run again", flush=True)
                if args.lockstep:
                    # The ring's order rotates each round, its direction turns
                    # every other round: with three variants each follows each
                    # other one (with more, a ring's neighbours stay neighbours).
                    order = round_order(args.variants, w, r, finished)
                    done = lockstep(args, w, order[::-1] if r % 2 else order, r, log)
                elif args.gpus:
                    # Variant j on GPU (j + r) mod G: each variant moves to the
                    # next GPU every round.
                    with ThreadPoolExecutor(len(args.variants)) as pool:
                        done = list(pool.map(
                            lambda jv: (jv[1], run_one(args, w, jv[1], r, log, gpu=str((jv[0] + r) % args.gpus))),
                            [(j, v) for j, v in enumerate(args.variants) if (w, v, r) not in finished]))
                else:
                    done = ((v, run_one(args, w, v, r, log)) for v in round_order(args.variants, w, r, finished))
                for v, res in done:
                    if res:
                        results.setdefault((w, v), []).append(res)
                        g = res["gpu"]
                        clock = f"  SM {g['sm_mhz_median']:.0f} MHz (min {g['sm_mhz_min']:.0f})" if g.get("sm_mhz_median") else ""
                        clock += f"  GPU {g['device']}" if "device" in g else ""
                        print(f"round {r + 1} {w:10} {v:16} total {res['total_ms']:8.1f} ms  median {res['median_ms']:7.2f}"
                              f" ms  reserved {gib(res['peak_reserved'])} GiB  device {used_text(res)} GiB"
                              f"  loss {res['final_loss']:.5f}{clock}",
                              flush=True)
    # The rounds tabled: this run's and those of the run it resumed.
    args.rounds = len({x["round"] for runs in results.values() for x in runs}) or args.rounds
    tables(args, results)


def round_order(variants, workload, rnd, finished=frozenset()):
    """The variants round `rnd` (from 0) runs, in its order: rotated by one a round,
    less those whose (workload, variant, round) is in `finished`."""
    k = rnd % len(variants)
    return [v for v in variants[k:] + variants[:k] if (workload, v, rnd) not in finished]


def resumed(paths, args):
    """The results of the last run of each log in `paths` (earlier calls', in the
    order they ran; one process a round, the later kept), for --resume: this run
    does not run them again, and tables them with its own. A log whose run had
    other settings is refused."""
    logs = []
    this_run, this_marker = (args.steps, args.shapes, args.ddp), (args.sdpa, args.fsdp)
    for path in paths:
        seen = argparse.Namespace(sdpa=None, fsdp=None)  # last_run_of notes what the log's run had
        found = last_run_of(path, seen)
        if seen.sdpa is None:
            raise SystemExit(f"--resume {path}: no run of train_rounds.py in it")
        # Its marker's attention and FSDP settings, and each process's steps, shapes and GPUs.
        marker = (seen.sdpa, seen.fsdp)
        other = {(x.get("steps"), x.get("shapes"), ddp_of(x))
                 for runs in found.values() for x in runs} - {this_run}
        if marker != this_marker or other:
            raise SystemExit(f"--resume {path}: its run had (steps, shapes, GPUs) {sorted(other, key=str)} "
                             f"and (sdpa, fsdp) {marker}, this run {this_run} and {this_marker}: not one run")
        if not found:
            print(f"--resume {path}: no finished process in its last run", flush=True)
        logs.append(found)
    return joined(logs)


def from_log(args):
    """The results of the last run in each earlier log (rounds split over calls with
    --first-round go together), keyed as a run keys them; the workloads, variants
    and round count are taken from the logs."""
    results = joined(last_run_of(path, args) for path in args.from_log)
    ws = list(dict.fromkeys(w for w, _ in results))
    vs = list(dict.fromkeys(v for _, v in results))
    args.workloads, args.variants = ws, vs
    # How many rounds the logs hold (numbered from wherever their runs began).
    args.rounds = len({x["round"] for rs in results.values() for x in rs})
    if results:
        first = next(iter(results.values()))[0]
        args.steps, args.shapes = first["steps"], first["shapes"]
        args.ddp = ddp_of(first)
    return results


def ddp_of(result):
    """What --ddp was for the process of `result`: its GPUs when more than one, else 0."""
    world = result.get("world", 1)
    return world if world > 1 else 0


def joined(logs):
    """The results of several logs' last runs (as `last_run_of` gives them, in the
    order the runs ran) as one run's, one process a round (`one_process_a_round`)."""
    results = {}
    for found in logs:
        for key, runs in found.items():
            results.setdefault(key, []).extend(runs)
    return one_process_a_round(results)


def one_process_a_round(results):
    """Each variant's processes, one a round: where the logs hold a round twice for
    a variant (a call stopped in the middle of a round, which the next call ran
    again from its start), the later process is kept, the one that ran beside the
    round's other variants, and a line says which was left out. Later means later
    in the order the logs are given to --from-log (give them in the order they ran)."""
    kept = {}
    for (w, v), runs in results.items():
        by_round = {}
        for x in runs:
            if x["round"] in by_round:
                print(f"{w} {v}: round {x['round'] + 1} is in the logs twice; the later process is kept "
                      f"(total {x['total_ms']:.1f} ms), the earlier left out ({by_round[x['round']]['total_ms']:.1f} ms)")
            by_round[x["round"]] = x
        kept[(w, v)] = list(by_round.values())
    return kept


def read_log(path):
    """The text of the log at `path`, which may be compressed as `docs/runs/` keeps
    its logs (`.xz`, `.gz`: read with the standard library's lzma and gzip)."""
    if str(path).endswith(".xz"):
        return lzma.open(path, "rt")
    if str(path).endswith(".gz"):
        return gzip.open(path, "rt")
    return open(path)


def last_run_of(path, args):
    """The results of the last run in the log at `path` (plain or compressed,
    `read_log`), keyed as a run keys them."""
    results = {}
    head = None
    with read_log(path) as lines:
        for line in lines:
            if line.startswith("=== train_rounds "):
                # A new run: only the last run of the log is tabled.
                results, head = {}, None
                logged = json.loads(line[len("=== train_rounds "):])
                args.sdpa = logged.get("sdpa", args.sdpa)
                args.fsdp = "--fsdp" in logged.get("argv", [])
                continue
            if line.startswith("== "):
                parts = line.split()
                head = {"round": int(parts[3][6:])} if len(parts) > 4 and parts[3].startswith("round=") else None
                if head is not None:
                    # The variant as --variants named it (with its settings, if any).
                    head["variant"] = parts[2]
                    gpu = line.split(" gpu=", 1)[1] if " gpu=" in line else "{}"
                    head["gpu"] = json.loads(gpu)
            elif line.startswith("RESULT ") and head is not None:
                res = json.loads(line[7:])
                res.update(head, total_ms=sum(res["step_ms"]))
                results.setdefault((res["workload"], res["variant"]), []).append(res)
    return results


if __name__ == "__main__":
    main()
