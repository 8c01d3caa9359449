"""A long Numba job through each memory manager: what an NBEP 7 user's footprint
and time are at steady state, beside Numba's own manager (issue 33, item 4).

    python3 numba_long.py [--batches 400] [--rounds 5] [--max-particles 24000000]
                          [--variants numba emm emm-novmm emm-novmm:EMM_POOL_LEGACY_MERGE=0]
                          [--log FILE]
    python3 numba_long.py --from-log FILE [FILE ...]

The job is a particle simulation in batches of variable size, the pattern that
splits a pool's memory: every batch (its particle count drawn log-uniformly
between 1/64 of the maximum and the maximum, the same seeded sequence in every
process) uploads positions (from pinned host memory), makes velocities, runs three substeps that each make
and drop a force array and a cell grid, reduces the kinetic energy with
``cuda.reduce`` (which makes its own temporaries) and drops the batch. Beside it
lives a 128 MiB table made once, and a history buffer that grows every batch
(a slightly larger array made, the old one copied in and dropped, as a KV cache
grows) and starts over every 25 batches. Every 100th batch and the last, the
energy is checked against NumPy on the host (outside the timed part).

Variants, one process each, rotated between rounds:

- ``numba``: Numba's own manager (``cuMemAlloc`` per array; a dropped array's
  finalizer queues its free, and the queue is flushed, a ``cuMemFree`` each,
  once more than ten are pending).
- ``emm``: ``NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin``, the pool's defaults
  (the plugin keeps the expandable segment).
- ``emm-novmm``: the same with ``EMM_POOL_EXPANDABLE=0`` (plain ``cuMemAlloc``
  segments, what consumers of legacy IPC handles get; merging on, the default).
- ``VARIANT:NAME=VALUE[,NAME=VALUE]``: one of those with more environment set.

Each process gets its variant's environment and no other ``EMM_POOL_*`` or
``NUMBA_CUDA_MEMORY_MANAGER`` setting; it refuses to run when Numba's manager is
not the variant's.

Per process: each batch's time (host clock around the batch; the energy's copy
to the host ends it), the host time inside the manager's allocation calls
(``cuda.device_array``; Numba's own manager's frees run when a dropped array is
collected, outside these calls), the device's used memory above the context's own
(``cuMemGetInfo`` straight from libcuda, not the manager, at each substep, the
batch's peak), the live bytes of the job's own arrays (counted as they are made
and collected), and for emm its own statistics and its driver allocations in
the second half of the run. Prints per variant the mean of round medians, each
round's median, the device peak and its ratio to the job's live peak at the
first tenth of the batches and at the end (drift), the driver allocations of
the run's second half, the allocation time a batch, and each variant's round
medians over Numba's own manager's of the same round. ``--from-log`` tables each
file as a run of its own. Exits 1 when a process failed, an energy check failed
or the table changed.

Run from the repository root on a GPU machine with ``PYTHONPATH=python`` and
``EMM_LIBRARY`` naming ``libemm_capi.so`` for the emm variants.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import time
import weakref

BASE = {
    "numba": {},
    "emm": {"NUMBA_CUDA_MEMORY_MANAGER": "emm.numba_plugin"},
    "emm-novmm": {"NUMBA_CUDA_MEMORY_MANAGER": "emm.numba_plugin", "EMM_POOL_EXPANDABLE": "0"},
}
CHECK_EVERY = 100
HISTORY_RESET = 25
TABLE_BYTES = 128 << 20
SUBSTEPS = 3
# The environment this process started with (a child replaces its own from it).
ENVIRON = dict(os.environ)


def variant_env(spec):
    """The environment a variant's process adds: its base's and its own settings."""
    name, _, extra = spec.partition(":")
    if name not in BASE:
        raise SystemExit(f"unknown variant {name!r}: expected one of {', '.join(BASE)}")
    env = dict(BASE[name])
    for item in filter(None, extra.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"variant {spec!r}: settings are NAME=VALUE, got {item!r}")
        env[key] = value
    return env


def batch_sizes(batches, most, seed=7):
    """The particle count of each batch: log-uniform in [most/64, most], seeded."""
    import random

    rng = random.Random(seed)
    lo = math.log(max(1024, most // 64))
    return [int(math.exp(rng.uniform(lo, math.log(most)))) for _ in range(batches)]


class DeviceMemory:
    """``cuMemGetInfo`` from libcuda itself: what the device says is used."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.free, self.total = ctypes.c_size_t(), ctypes.c_size_t()

    def used(self):
        rc = self.lib.cuMemGetInfo_v2(ctypes.byref(self.free), ctypes.byref(self.total))
        if rc != 0:
            raise RuntimeError(f"cuMemGetInfo_v2 returned {rc}")
        return self.total.value - self.free.value


def clean_env(env):
    """`env` without the settings a variant sets (so an exported one does not turn
    one variant into another)."""
    return {k: v for k, v in env.items()
            if k != "NUMBA_CUDA_MEMORY_MANAGER" and not k.startswith("EMM_POOL_")}


def child(args):
    """One process: the whole job through the manager of variant `args.child`."""
    os.environ.clear()
    os.environ.update(clean_env(ENVIRON))
    os.environ.update(variant_env(args.child))
    import numpy as np
    from numba import cuda

    device = DeviceMemory()
    ctx = cuda.current_context()
    manager = type(ctx.memory_manager).__name__
    want = "NumbaCUDAMemoryManager" if args.child.partition(":")[0] == "numba" else "EmmNumbaManager"
    if manager != want:
        raise SystemExit(f"variant {args.child}: Numba's memory manager is {manager}, not {want}")
    base_used = device.used()

    live = [0, 0]  # now, peak

    def counted(arr):
        live[0] += arr.nbytes
        live[1] = max(live[1], live[0])
        weakref.finalize(arr, _drop, live, arr.nbytes)
        return arr

    alloc_ns = [0]  # host time inside the manager's allocations, this batch

    def empty(shape, dtype):
        t = time.perf_counter_ns()
        arr = cuda.device_array(shape, dtype=dtype)
        alloc_ns[0] += time.perf_counter_ns() - t
        return counted(arr)

    @cuda.jit
    def init_vel(vel, scale):
        i = cuda.grid(1)
        if i < vel.shape[0]:
            vel[i, 0] = scale * ((i % 97) - 48)
            vel[i, 1] = scale * ((i % 89) - 44)
            vel[i, 2] = scale * ((i % 83) - 41)

    @cuda.jit
    def forces(force, pos, cells, k):
        i = cuda.grid(1)
        if i < pos.shape[0]:
            for d in range(3):
                force[i, d] = -k * pos[i, d]
            if i < cells.shape[0]:
                cells[i] = i % 251

    @cuda.jit
    def integrate(pos, vel, force, dt):
        i = cuda.grid(1)
        if i < pos.shape[0]:
            for d in range(3):
                vel[i, d] += dt * force[i, d]
                pos[i, d] += dt * vel[i, d]

    @cuda.jit
    def kinetic(out, vel):
        i = cuda.grid(1)
        if i < vel.shape[0]:
            out[i] = 0.5 * (vel[i, 0] * vel[i, 0] + vel[i, 1] * vel[i, 1] + vel[i, 2] * vel[i, 2])

    @cuda.jit
    def extend(new, old, value):
        i = cuda.grid(1)
        if i < new.shape[0]:
            new[i] = old[i] if i < old.shape[0] else value

    @cuda.reduce
    def total(a, b):
        return a + b

    threads = 256
    sizes = batch_sizes(args.batches, args.max_particles)
    rng = np.random.default_rng(11)
    # Pinned, so that uploads run at the copy engine's speed rather than the
    # host's (pageable uploads of up to 288 MiB made the host's noise the batch's).
    host_pos = cuda.pinned_array((args.max_particles, 3), dtype=np.float32)
    host_pos[:] = rng.standard_normal((args.max_particles, 3), dtype=np.float32)
    k, dt, scale = np.float32(0.5), np.float32(0.01), np.float32(0.001)

    def host_energy(n):
        """The energy the device should find, in float64 on the host."""
        i = np.arange(n)
        vel = np.stack([scale * ((i % 97) - 48), scale * ((i % 89) - 44),
                        scale * ((i % 83) - 41)], axis=1).astype(np.float32)
        pos = np.array(host_pos[:n])
        for _ in range(SUBSTEPS):
            vel += dt * (-k * pos)
            pos += dt * vel
        return float(0.5 * (vel.astype(np.float64) ** 2).sum())

    def run_batch(n, history):
        blocks = (n + threads - 1) // threads
        peak = 0
        pos = empty((n, 3), np.float32)
        pos.copy_to_device(host_pos[:n])
        vel = empty((n, 3), np.float32)
        init_vel[blocks, threads](vel, scale)
        for _ in range(SUBSTEPS):
            force = empty((n, 3), np.float32)
            cells = empty(n // 4 + 1, np.int32)
            forces[blocks, threads](force, pos, cells, k)
            integrate[blocks, threads](pos, vel, force, dt)
            peak = max(peak, device.used())
            del force, cells
        energy_each = empty(n, np.float32)
        kinetic[blocks, threads](energy_each, vel)
        energy = float(total(energy_each))
        # The history grows by a 64th of the batch, as a KV cache by a token.
        grown = empty(history.shape[0] + n // 64 + 1, np.float32)
        extend[(grown.shape[0] + threads - 1) // threads, threads](grown, history, np.float32(energy))
        peak = max(peak, device.used())
        del pos, vel, energy_each
        return energy, grown, peak

    table = counted(cuda.to_device(np.ones(TABLE_BYTES // 4, dtype=np.float32)))
    history = empty(1, np.float32)
    # Compile every kernel on a small batch first, so no batch times the JIT.
    run_batch(4096, history)
    cuda.synchronize()
    times, alloc_us, peaks, lives, allocs, checks = [], [], [], [], [], []
    stats = None
    if manager == "EmmNumbaManager":
        from emm._lib import Manager

        emm_manager = Manager(None, ctx.device.id)
        stats = emm_manager.stats
    for b, n in enumerate(sizes):
        if b % HISTORY_RESET == 0:
            history = empty(1, np.float32)
        alloc_ns[0] = 0
        t0 = time.perf_counter()
        energy, history, peak = run_batch(n, history)
        cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        alloc_us.append(alloc_ns[0] / 1e3)
        peaks.append(peak - base_used)
        lives.append(live[1])
        if stats is not None:
            allocs.append(stats()["upstream_allocs"])
        if b % CHECK_EVERY == CHECK_EVERY - 1 or b == len(sizes) - 1:
            want = host_energy(n)
            checks.append(abs(energy - want) <= 1e-3 * abs(want) + 1e-6)
    out = {
        "manager": manager,
        "times_ms": times,
        "alloc_us": alloc_us,
        "device_peaks": peaks,
        "live_peaks": lives,
        "checks_passed": sum(checks),
        "checks": len(checks),
        "table_ok": bool(np.all(table.copy_to_host() == 1.0)),
    }
    if stats is not None:
        s = stats()
        out["emm"] = {k: s[k] for k in ("allocated_bytes_peak", "reserved_bytes_peak", "upstream_allocs")}
        half = len(allocs) // 2
        out["emm"]["driver_allocs_second_half"] = allocs[-1] - allocs[half - 1] if half else 0
        # Every counter the pool keeps (pieces moved and unmapped among them).
        out["emm"]["report"] = emm_manager.report()
    print("RESULT " + json.dumps(out), flush=True)


def _drop(live, nbytes):
    live[0] -= nbytes


def summarize(results, variants):
    """One table: per variant, each round and the figures over rounds. Returns
    whether every process passed its checks and kept its table."""
    gib = 1 << 30
    print(f"{'variant':<36} {'mean of round medians ms':>24} {'rounds (median ms)':<44} "
          f"{'device peak GiB':>15} {'/live 10%':>9} {'/live end':>9} {'emm res/alloc':>13} "
          f"{'driver allocs, 2nd half':>23} checks")
    faster, ok = None, True
    for v in variants:
        rs = results.get(v, [])
        if not rs:
            print(f"{v:<36} no result")
            continue
        medians = [statistics.median(r["times_ms"]) for r in rs]
        mean = statistics.mean(medians)
        if v.partition(":")[0] == "numba" and (faster is None or mean < faster[1]):
            faster = (v, mean)
        tenth = max(1, len(rs[0]["device_peaks"]) // 10)
        early = max(max(r["device_peaks"][:tenth]) / max(r["live_peaks"][:tenth]) for r in rs)
        end = max(max(r["device_peaks"]) / max(r["live_peaks"]) for r in rs)
        peak = max(max(r["device_peaks"]) for r in rs) / gib
        spread = (max(medians) - min(medians)) / min(medians) * 100
        e = [r.get("emm") for r in rs]
        ratio = "-" if not all(e) else "%.3f" % max(x["reserved_bytes_peak"] / x["allocated_bytes_peak"] for x in e)
        late = "-" if not all(e) else ",".join(str(x["driver_allocs_second_half"]) for x in e)
        checks = "%d/%d" % (sum(r["checks_passed"] for r in rs), sum(r["checks"] for r in rs))
        table = all(r["table_ok"] for r in rs)
        ok = ok and table and all(r["checks_passed"] == r["checks"] for r in rs)
        rounds = ", ".join("%.2f" % m for m in medians) + f" (spread {spread:.1f} %)"
        print(f"{v:<36} {mean:>24.2f} {rounds:<44} {peak:>15.2f} {early:>9.3f} {end:>9.3f} "
              f"{ratio:>13} {late:>23} {checks}{'' if table else ' TABLE CHANGED'}")
    timed = [v for v in variants if results.get(v) and all("alloc_us" in r for r in results[v])]
    if timed:
        print("host time inside the manager's allocations, us a batch: mean of round medians (each round)")
    for v in timed:
        medians = [statistics.median(r["alloc_us"]) for r in results[v]]
        print(f"  {v:<34} {statistics.mean(medians):8.1f} ({', '.join('%.1f' % m for m in medians)})")
    if faster:
        name, mean_faster = faster
        base = {r.get("round"): statistics.median(r["times_ms"]) for r in results[name]}
        for v in variants:
            rs = results.get(v, [])
            if rs and v.partition(":")[0] != "numba":
                mean = statistics.mean(statistics.median(r["times_ms"]) for r in rs)
                paired = [statistics.median(r["times_ms"]) / base[r["round"]] for r in rs
                          if r.get("round") in base]
                each = ", ".join("%.3f" % x for x in paired)
                print(f"{v}: {mean / mean_faster:.3f} x {name}'s time a batch "
                      f"(round by round: {each})")
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-particles", type=int, default=24_000_000)
    p.add_argument("--variants", nargs="+", default=["numba", "emm", "emm-novmm"])
    p.add_argument("--log", help="append every process's result line to FILE")
    p.add_argument("--from-log", nargs="+", metavar="FILE",
                   help="table the results of earlier --log files instead of running")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.from_log:
        ok = True
        for path in args.from_log:  # each file is a run of its own
            results, seen = {}, []
            with open(path) as f:
                for line in f:
                    if not line.strip():
                        continue
                    try:
                        res = json.loads(line)
                    except json.JSONDecodeError:
                        print(f"{path}: skipping a line that is not JSON (a run cut short?)")
                        continue
                    results.setdefault(res["variant"], []).append(res)
                    if res["variant"] not in seen:
                        seen.append(res["variant"])
            print(f"== {path}")
            ok = summarize(results, seen) and ok
        sys.exit(0 if ok else 1)
    if args.batches < 1 or args.rounds < 1 or args.max_particles < 4096:
        raise SystemExit("--batches and --rounds must be at least 1, --max-particles at least 4096")
    for v in [args.child] if args.child else args.variants:
        variant_env(v)  # every variant checked before the first process runs
    if args.child:
        child(args)
        return
    results, failed = {}, 0
    for r in range(args.rounds):
        order = args.variants[r % len(args.variants):] + args.variants[:r % len(args.variants)]
        for v in order:
            cmd = [sys.executable, __file__, "--child", v, "--batches", str(args.batches),
                   "--max-particles", str(args.max_particles)]
            t0 = time.time()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                failed += 1
                print(f"round {r + 1} {v}: failed (rc {proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
                continue
            res = json.loads(line[len("RESULT "):])
            res["round"] = r + 1
            results.setdefault(v, []).append(res)
            if args.log:
                with open(args.log, "a") as f:
                    f.write(json.dumps({"variant": v, **res}) + "\n")
            print(f"round {r + 1} {v}: {res['manager']}, median {statistics.median(res['times_ms']):.2f} ms, "
                  f"device peak {max(res['device_peaks']) / (1 << 30):.2f} GiB, "
                  f"checks {res['checks_passed']}/{res['checks']} ({time.time() - t0:.0f} s)", flush=True)
    ok = summarize(results, args.variants)
    sys.exit(0 if ok and not failed else 1)


if __name__ == "__main__":
    main()
