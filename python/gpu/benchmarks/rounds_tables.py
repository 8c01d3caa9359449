"""The tables train_rounds.py prints from its rounds (run now or read back with
--from-log): per workload and variant, the processes' times, footprints and
final losses; device time; steps on a steady host and at equal shapes and host
speed (host_fit.py); the per-index fastest steps; each step beside the faster
PyTorch variant's, with and without driver work; emm's time inside PyTorch's
hooks and what its pool did; the rounds side by side. `results` maps (workload,
variant) to the processes' RESULT records, each with its "round" and
"total_ms"."""
import math
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # python/gpu is no package
import host_fit  # noqa: E402
from round_variants import is_peer  # noqa: E402


def gib(n):
    return f"{n / 2**30:.2f}"


def gib_or_dash(n):
    """`gib(n)`, or '-' for a figure that could not be read (None)."""
    return "-" if n is None else gib(n)


# Counters whose change over a step means the allocator called the driver for
# memory in it (allocations, frees, pieces mapped or moved, synchronizations).
DRIVER_WORK = ("num_device_alloc", "num_device_free", "pieces_mapped", "pieces_moved", "pieces_unmapped",
               "device_syncs", "num_alloc_retries")


def driver_work(change):
    """Whether a step's counter changes (`step_changes`) show driver work: where an
    allocator's own cost can show in a step."""
    return any(change.get(k) for k in DRIVER_WORK)


def busy_steps(x):
    """For each timed step of the process `x`, whether any rank's allocator did
    driver work in it (a step of DDP or FSDP2 waits for its slowest rank at the
    collectives, so another rank's growth shows in rank 0's time); rank 0's own
    counters where the log has no other rank's (`step_changes_ranks`: single-GPU
    runs, and logs from before the benchmark gathered them). None when the counters
    do not cover every timed step."""
    n = len(x["step_ms"])
    per_rank = x.get("step_changes_ranks") or [x.get("step_changes", [])]
    per_rank = [changes[-n:] for changes in per_rank]
    if n == 0 or any(len(changes) != n for changes in per_rank):
        return None
    return [any(driver_work(changes[i]) for changes in per_rank) for i in range(n)]


def tables(args, results):
    world = (f", {args.ddp} GPUs ({'FSDP2' if getattr(args, 'fsdp', False) else 'DDP'})" if args.ddp else "") + f", {args.shapes} shapes" + (", flash attention" if args.sdpa == "flash" else "")
    for w in args.workloads:
        # This workload's rounds, each variant's (a run cut short holds fewer of its
        # last workload's, and of the variants its last round did not reach).
        counts = [len({x["round"] for x in results.get((w, v), [])}) for v in args.variants] or [args.rounds]
        n_rounds = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}-{max(counts)}"
        print(f"\n## {w}{world}: {n_rounds} interleaved rounds, {args.steps} timed steps each")
        print("| variant | timed steps, total ms: median of rounds | spread (rounds) | step ms: median of round medians "
              "| step ms: mean of round medians (each round's median) "
              "| all timed steps: median / mean | timed steps with driver work | peak reserved GiB "
              "| peak allocated GiB | reserved/allocated | device-used peak GiB (cuMemGetInfo; in lockstep the process's own, NVML) | driver allocs | final loss |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for v in args.variants:
            rs = results.get((w, v), [])
            if not rs:
                print(f"| {v} | no result | | | | | | | | | | | |")
                continue
            totals = [x["total_ms"] for x in rs]
            meds = [x["median_ms"] for x in rs]
            steps = [t for x in rs for t in x["step_ms"]]
            # Timed steps whose allocator counters show driver work (allocations,
            # frees, pieces mapped or moved, synchronizations): where an allocator's
            # own cost can show in a step.
            busy = sum(sum(busy_steps(x) or []) for x in rs)
            res = max(x["peak_reserved"] for x in rs)
            alloc = max(x["peak_allocated"] for x in rs)
            ratio = res / alloc if alloc else float("nan")
            # None where the process could not read it (taking turns without NVML).
            used = [x.get("device_used_peak", 0) for x in rs]
            device = None if None in used else max(used)
            each = ", ".join(f"{m:.2f}" for m in meds)
            print(f"| {v} | {statistics.median(totals):.1f} | {min(totals):.1f}-{max(totals):.1f} | "
                  f"{statistics.median(meds):.2f} | {statistics.mean(meds):.2f} ({each}) | "
                  f"{statistics.median(steps):.2f} / {statistics.mean(steps):.2f} | {busy} of {len(steps)} | "
                  f"{gib(res)} | {gib(alloc)} | {ratio:.3f} | {gib_or_dash(device)} | {max(x['driver_allocs'] for x in rs)} | "
                  f"{rs[-1]['final_loss']:.5f} |")
        device_time(w, args, results)
        steady(w, args, results)
        host_adjusted(w, args, results)
        fastest_of_rounds(w, args, results)
        quiet_and_busy(w, args, results)
        excess_by_round(w, args, results)
        hook_time(w, args, results)
        allocator_work(w, args, results)
        growth_phases(w, args, results)
        paired(w, args, results)
        lockstep_pairs(w, args, results)


def device_time(w, args, results):
    """Per variant: the timed steps' device time (CUDA events around each step on
    the current stream), mean of round medians and each round's median, beside the
    faster PyTorch variant's."""
    means = {}
    for v in args.variants:
        meds = [statistics.median(x["device_ms"]) for x in results.get((w, v), []) if x.get("device_ms")]
        if meds:
            means[v] = (statistics.mean(meds), meds)
    if not means:
        return
    peers = [means[v][0] for v in means if is_peer(v)]
    best = min(peers) if peers else None
    print(f"\n{w}: device time per timed step (CUDA events), mean of round medians (each round's median)"
          + (" and its ratio to the faster PyTorch variant's" if best else ""))
    for v, (mean, meds) in means.items():
        ratio = f"; {mean / best:.3f}" if best else ""
        print(f"  {v}: {mean:.2f} ms ({', '.join(f'{m:.2f}' for m in meds)}){ratio}")


STEADY = 1.15
# A second, looser bound, tabled too where the first leaves fewer than a tenth
# of the step indices to compare (a process that ran on a slowed host for most
# of its steps leaves few steady ones).
STEADY_WIDE = 1.3


def steady(w, args, results):
    """Step times on a steady host. The lent machine's host slows by up to 2x for
    stretches of seconds to minutes, which moves a whole process's total by
    10-30 %. train_bench.py times a fixed ~1 ms Python loop just before each timed
    step (host_probe); a step counts as steady when its loop took at most STEADY x
    the fastest loop of the workload. Every process draws the same shape at the
    same step index, so steps are compared index by index: per variant, the median
    of its steady steps at an index (over rounds), summed over the indices where
    every variant has a steady step. Where that leaves fewer than a tenth of the
    indices, the same again with STEADY_WIDE."""
    probes = [p for v in args.variants for x in results.get((w, v), []) for p in x.get("probe_ms", [])]
    if not probes:
        return
    steps = max((len(x["step_ms"]) for v in args.variants for x in results.get((w, v), [])), default=0)
    # A variant whose log has no probes (older logs) has no steady step at any bound.
    probed = all(x.get("probe_ms") for v in args.variants for x in results.get((w, v), []))
    factors = (STEADY, STEADY_WIDE) if probed else (STEADY,)
    for n, factor in enumerate(factors):
        common = steady_at(w, args, results, min(probes), factor, last=n == len(factors) - 1)
        if common * 10 >= steps:
            break


def steady_at(w, args, results, fastest, factor, last=True):
    """steady's table with the bound at `factor` x the fastest probe; returns how
    many step indices it compared. `last`: no looser bound follows."""
    bound = fastest * factor
    at = {v: {} for v in args.variants}
    for v in args.variants:
        for x in results.get((w, v), []):
            for i, (t, p) in enumerate(zip(x["step_ms"], x.get("probe_ms", []))):
                if p <= bound:
                    at[v].setdefault(i, []).append(t)
    common = sorted(set.intersection(*(set(a) for a in at.values()))) if at else []
    print(f"\n{w}, timed steps on a steady host (host probe <= {bound:.3f} ms, {factor:.2f} x the fastest "
          f"probe of the workload), compared at the {len(common)} step indices (same shapes) where every "
          f"variant has one:")
    if not common:
        # Say why the table is missing: every variant needs a steady step at an
        # index, and a process that ran on a slow host all along has none.
        counts = ", ".join(f"{v} {sum(len(t) for t in at[v].values())}" for v in args.variants)
        print(f"  none: no step index has a steady step in every variant (steady steps: {counts})"
              + ("; the rounds' other comparisons stand alone" if last else ""))
        return 0
    print("| variant | steady steps | sum over those indices of the median step, ms | / faster peer's |")
    print("|---|---|---|---|")
    sums = {v: sum(statistics.median(at[v][i]) for i in common) for v in args.variants}
    peer = min((sums[p] for p in sums if is_peer(p)), default=None)
    for v in args.variants:
        n = sum(len(t) for t in at[v].values())
        rel = f"{sums[v] / peer:.3f}" if peer and not is_peer(v) else "-"
        print(f"| {v} | {n} | {sums[v]:.1f} | {rel} |")
    return len(common)


def host_adjusted(w, args, results):
    """Every timed step of every process in one fit that takes out the step
    index's shapes and the host's speed at the step (`host_fit.py`): per variant,
    how much slower its processes' steps ran than the faster PyTorch variant's at
    equal shapes and host speed, over all its rounds and round by round (beside
    the faster PyTorch process of the same round). Needs a host probe at every
    step of every process and a PyTorch variant."""
    procs = {(v, x["round"]): (x["step_ms"], x.get("probe_ms", []))
             for v in args.variants for x in results.get((w, v), [])}
    if not procs or not all(p and len(p) == len(t) for t, p in procs.values()):
        return
    peers = [v for v in args.variants if is_peer(v)]
    f = host_fit.fit(procs)
    if f is None or not peers:
        return

    def mean_effect(v):
        e = [g for k, g in f.effects.items() if k[0] == v]
        return sum(e) / len(e) if e else None

    means = {v: mean_effect(v) for v in args.variants}
    best = min((means[p] for p in peers if means[p] is not None), default=None)
    if best is None:
        return
    print(f"\n{w}, step time at equal shapes and host speed (one least-squares fit of log step time on the "
          f"step index, the process and the log of the step's host probe, {f.steps} timed steps; a step's time "
          f"moved as the probe's to the power {f.slope:.3f}):")
    print("| variant | rounds | / faster PyTorch variant, over its rounds | each round / that round's faster PyTorch process |")
    print("|---|---|---|---|")
    for v in args.variants:
        if means[v] is None:
            continue
        keys = sorted(k for k in f.effects if k[0] == v)
        each = []
        for _, r in keys:
            mates = [f.effects[(p, r)] for p in peers if (p, r) in f.effects]
            if mates and not is_peer(v):
                each.append(f"{math.exp(f.effects[(v, r)] - min(mates)):.3f}")
        rel = "-" if is_peer(v) and means[v] == best else f"{math.exp(means[v] - best):.3f}"
        print(f"| {v} | {len(keys)} | {rel} | {', '.join(each) or '-'} |")


def fastest_of_rounds(w, args, results):
    """Step times with the host's slow stretches taken out another way, using every
    step: a slow host only ever adds time, so at each step index (the same shapes
    in every process) the fastest of the rounds is the step's cost with the least
    of that noise. Per variant, the sum over all step indices of that minimum,
    beside the faster PyTorch variant's; needs two rounds or more."""
    if args.rounds < 2:
        return
    sums, n = {}, None
    for v in args.variants:
        runs = [x["step_ms"] for x in results.get((w, v), [])]
        if len(runs) < 2:
            return
        k = min(len(r) for r in runs)
        n = k if n is None else min(n, k)
        sums[v] = [min(r[i] for r in runs) for i in range(k)]
    peer = min((sum(sums[p][:n]) for p in sums if is_peer(p)), default=None)
    print(f"\n{w}, the fastest of the rounds at each of the {n} step indices, summed (ms):")
    print("| variant | rounds | sum of the per-index fastest step | / faster peer's |")
    print("|---|---|---|---|")
    for v in args.variants:
        total = sum(sums[v][:n])
        rel = f"{total / peer:.3f}" if peer and not is_peer(v) else "-"
        print(f"| {v} | {len(results[(w, v)])} | {total:.1f} | {rel} |")


def beside_faster_peer(w, args, results):
    """For each variant that is not PyTorch's (none without a PyTorch variant):
    the variant and its processes that have a PyTorch variant in the same round
    and counters for every timed step, each as (the process, the step times of
    the faster PyTorch process of its round, `busy_steps` of the process)."""
    peers = [v for v in args.variants if is_peer(v)]
    if not peers:
        return []
    out = []
    for v in (v for v in args.variants if v not in peers):
        processes = []
        for x in results.get((w, v), []):
            mates = [y for p in peers for y in results.get((w, p), []) if y["round"] == x["round"]]
            work = busy_steps(x)
            if mates and work is not None:
                processes.append((x, min(mates, key=lambda y: y["total_ms"])["step_ms"], work))
        out.append((v, processes))
    return out


def quiet_and_busy(w, args, results):
    """Each variant's timed steps against the faster PyTorch variant's step of the
    same index in the same round (the same shapes, adjacent in time), split by
    whether the variant's allocator did driver work in the step: what a step that
    maps or moves memory costs, and what the allocator costs in the steps that do
    not (there only its host time on the allocation path can differ). Per
    variant: the median ratio of each kind of step (each round's median of the
    steps without driver work), and the mean."""
    lines = []
    for v, processes in beside_faster_peer(w, args, results):
        quiet, busy, per_round = [], [], []
        for x, best, work in processes:
            q = []
            for t, b, w_ in zip(x["step_ms"], best, work):
                (busy if w_ else q).append(t / b)
            quiet += q
            if q:
                per_round.append(statistics.median(q))
        if quiet or busy:
            # (A variant may do driver work in every step, or in none.)
            lines.append(f"| {v} | {len(quiet)} | "
                         + (f"{statistics.median(quiet):.3f} / {statistics.mean(quiet):.3f} "
                            f"({', '.join(f'{m:.3f}' for m in per_round)})" if quiet else "-")
                         + f" | {len(busy)} | "
                         + (f"{statistics.median(busy):.3f} / {statistics.mean(busy):.3f} |" if busy else "- |"))
    if lines:
        print(f"\n{w}, each timed step / the faster PyTorch variant's step of the same index and round, "
              f"by whether the allocator did driver work in it (on any rank, where the log has every rank's counters):")
        print("| variant | steps without driver work | their ratio: median / mean (each round's median) "
              "| steps with driver work | their ratio: median / mean |")
        print("|---|---|---|---|---|")
        print("\n".join(lines))


def excess_by_round(w, args, results):
    """Per round, where each variant lost or gained time against the faster
    PyTorch variant of the same round, step index by step index (the same
    shapes): the sum of its steps' excess (ms) over the steps in which its
    allocator did driver work (on any rank, as `busy_steps` says) and over the
    others, with the pieces it moved in the first (rank 0's counters). What the
    steps that map or move memory cost the process, apart from the host's
    noise in the rest."""
    rows = []
    for v, processes in beside_faster_peer(w, args, results):
        for x, best, work in sorted(processes, key=lambda p: p[0]["round"]):
            changes = x.get("step_changes", [])[-len(x["step_ms"]):]
            busy = quiet = 0.0
            steps = moved = 0
            for i, (t, b, w_) in enumerate(zip(x["step_ms"], best, work)):
                if w_:
                    busy += t - b
                    steps += 1
                    moved += changes[i].get("pieces_moved", 0) if i < len(changes) else 0
                else:
                    quiet += t - b
            rows.append(f"| {v} | {x['round'] + 1} | {steps} ({moved}) | {busy:.1f} | {quiet:.1f} |")
    if rows:
        print(f"\n{w}, per round: the timed steps' excess over the faster PyTorch variant's step of the same "
              f"index (ms, summed), in the steps with driver work and in the others:")
        print("| variant | round | steps with driver work (pieces moved) | their excess, ms | the others' excess, ms |")
        print("|---|---|---|---|---|")
        print("\n".join(rows))


SLOW_KINDS = ("locked", "reclaim", "events", "parked", "grew", "none")


def slow_by_kind(v, w, results):
    """The slow hook calls (4 us or more) of `v`'s timed steps by what the pool did
    in them (a library whose call-timing build counts them: each call under every
    kind it did; `none`: the thread's own cache only)."""
    calls, ns = {}, {}
    for x in results.get((w, v), []):
        for c in x.get("step_changes", [])[-len(x["step_ms"]):]:
            for k in SLOW_KINDS:
                for hook in ("alloc", "free"):
                    calls[k] = calls.get(k, 0) + c.get(f"torch_{hook}_slow_{k}_calls", 0)
                    ns[k] = ns.get(k, 0) + c.get(f"torch_{hook}_slow_{k}_ns", 0)
    if not any(calls.values()):
        return
    print(f"{v}: slow calls by what the pool did in them (a call under each kind it did): "
          + ", ".join(f"{k} {calls[k]} ({ns[k] / 1e6:.3f} ms)" for k in SLOW_KINDS if calls[k]))


def hook_time(w, args, results):
    """For a library built with emm-capi's `call-timing` feature: emm's own host time
    per timed step inside PyTorch's allocator hooks, beside the step."""
    for v in args.variants:
        per_step = []
        for x in results.get((w, v), []):
            changes = x.get("step_changes", [])[-len(x["step_ms"]):]
            for c, ms in zip(changes, x["step_ms"]):
                if "torch_alloc_ns" in c or "torch_free_ns" in c:
                    ns = c.get("torch_alloc_ns", 0) + c.get("torch_free_ns", 0)
                    calls = c.get("torch_alloc_calls", 0) + c.get("torch_free_calls", 0)
                    slow = c.get("torch_alloc_slow_calls", 0) + c.get("torch_free_slow_calls", 0)
                    # Older call-timing builds do not count the slow calls' time:
                    # None then, and nothing is printed for it.
                    slow_ns = (c.get("torch_alloc_slow_ns", 0) + c.get("torch_free_slow_ns", 0)
                               if "torch_alloc_slow_ns" in c or "torch_free_slow_ns" in c else None)
                    per_step.append((ns / 1e6, calls, slow, ms, slow_ns))
        if per_step:
            hook_ms = [p[0] for p in per_step]
            share = [p[0] / p[3] for p in per_step]
            print(f"{v}: time inside emm's PyTorch hooks per timed step: median {statistics.median(hook_ms):.3f} ms, "
                  f"max {max(hook_ms):.3f} ms ({statistics.median(share) * 100:.2f} % of the step); "
                  f"{statistics.median([p[1] for p in per_step]):.0f} calls per step, "
                  f"{sum(p[2] for p in per_step)} calls of 4 us or more in {len(per_step)} steps"
                  + (f", taking {sum(p[4] or 0 for p in per_step) / 1e6:.3f} ms of the hooks' {sum(hook_ms):.3f} ms"
                     if any(p[4] is not None for p in per_step) else ""))
            slow_by_kind(v, w, results)


# emm's counters of the work a step made it do on the host (each a driver call, a
# process-wide barrier, or a scan), in the order they are printed.
WORK_COUNTERS = ("cache_reclaims", "events_recorded", "event_queries", "parked_taken_back",
                 "parked_waited", "cross_stream_reuses", "misses", "pieces_moved", "pieces_unmapped")


def allocator_work(w, args, results):
    """For emm's variants: what each timed step made the pool do (its counters'
    change over the step), the median step's and the total over every timed step
    of every round, so a slow step can be matched with the work behind it."""
    for v in args.variants:
        per_step = [c for x in results.get((w, v), [])
                    for c in x.get("step_changes", [])[-len(x["step_ms"]):]]
        present = [k for k in WORK_COUNTERS if any(k in c for c in per_step)]
        if not present:
            continue
        parts = [f"{k} {statistics.median(c.get(k, 0) for c in per_step):g} "
                 f"({sum(c.get(k, 0) for c in per_step)})" for k in present]
        print(f"{v}: allocator work per timed step, median (total over {len(per_step)} steps): " + ", ".join(parts))


# The phases of the pool's growths that its call-timing build times
# (`emm_pool::growth_phases::Phase`), in the order they are printed. They nest
# (`expand` holds the others but `unmap`, which the helper thread runs), so
# they are not added up.
GROWTH_PHASES = ("expand", "plan", "create", "map", "access", "retire", "unmap_retired", "turn",
                 "unmap", "wait_parked")


def growth_phases(w, args, results):
    """For a library built with emm-capi's `call-timing` feature: what the pool's
    growths spent over every timed step, phase by phase (calls and ms in all, and ms
    a step), beside the pieces they mapped new and moved."""
    for v in args.variants:
        per_step = [c for x in results.get((w, v), [])
                    for c in x.get("step_changes", [])[-len(x["step_ms"]):]]
        if not any(f"pool_{p}_calls" in c for c in per_step for p in GROWTH_PHASES):
            continue
        steps = len(per_step)
        total = {k: sum(c.get(k, 0) for c in per_step)
                 for k in [f"pool_{p}_{u}" for p in GROWTH_PHASES for u in ("calls", "ns")]
                 + ["pieces_mapped", "pieces_moved"]}
        parts = [f"{p} {total[f'pool_{p}_calls']} calls {total[f'pool_{p}_ns'] / 1e6:.1f} ms "
                 f"({total[f'pool_{p}_ns'] / 1e6 / steps:.3f} ms a step)"
                 for p in GROWTH_PHASES if total[f"pool_{p}_calls"]]
        print(f"{v}: growth phases over {steps} timed steps (nested; `unmap` on the helper thread): "
              + ", ".join(parts) + f"; pieces mapped new {total['pieces_mapped']}, "
              f"moved {total['pieces_moved']}")


def paired(w, args, results):
    """Per round: every variant's total beside the faster PyTorch variant's total of
    the same round, the GPU's clock while each ran, and how fast each process's host
    was (its calibration at the end, and the median of the probes before its steps)."""
    peers = [v for v in args.variants if is_peer(v)]
    others = [v for v in args.variants if v not in peers]
    if not peers or not others:
        return
    print(f"\n{w}, per round: total ms of the timed steps (the GPU's median SM clock during them; "
          f"the process's host calibration: a fixed Python loop, and one in-place kernel launch; the "
          f"median of the host probe timed before each step, which shows a host slowed for a stretch "
          f"of the process where the calibration at its end may not); "
          f"ratio = variant / faster of {' and '.join(peers)} in the same round (a strict test: the "
          f"faster of two noisy peers; a variant exactly as fast as one peer is at or below it in about "
          f"a third of rounds)")
    print("| round | " + " | ".join(args.variants) + " | " + " | ".join(f"{v} ratio" for v in others) + " |")
    print("|---|" + "---|" * (len(args.variants) + len(others)))
    ratios = {v: [] for v in others}
    # The rounds present (a run started with --first-round, or logs of several
    # calls, need not hold every round from the first).
    present = sorted({x["round"] for v in args.variants for x in results.get((w, v), [])})
    for r in present:
        got = {v: next((x for x in results.get((w, v), []) if x["round"] == r), None) for v in args.variants}
        cells = []
        for v in args.variants:
            x = got[v]
            if x is None:
                cells.append("-")
                continue
            g = x.get("gpu") or {}
            c = x.get("calib") or {}
            notes = ([f"GPU {g['device']}"] if "device" in g else []) + (
                [f"{g['sm_mhz_median']:.0f} MHz"] if g.get("sm_mhz_median") else []) + (
                [f"host {c['cpu_ms']:.1f} ms", f"launch {c['launch_us']:.2f} us"] if c else []) + (
                [f"probe {statistics.median(x['probe_ms']):.2f} ms"] if x.get("probe_ms") else [])
            cells.append(f"{x['total_ms']:.1f}" + (f" ({', '.join(notes)})" if notes else ""))
        best = min((got[v]["total_ms"] for v in peers if got[v]), default=None)
        rcells = []
        for v in others:
            if best and got[v]:
                ratios[v].append(got[v]["total_ms"] / best)
                rcells.append(f"{ratios[v][-1]:.3f}")
            else:
                rcells.append("-")
        print(f"| {r + 1} | " + " | ".join(cells) + " | " + " | ".join(rcells) + " |")
    for v in others:
        rs = ratios[v]
        if rs:
            below = sum(1 for x in rs if x <= 1.0)
            print(f"{v}: ratio median {statistics.median(rs):.3f}, range {min(rs):.3f}-{max(rs):.3f}, "
                  f"at or below the faster peer in {below} of {len(rs)} rounds")
            interval = ratio_interval(rs)
            if interval:
                g, lo, hi = interval
                print(f"{v}: the rounds' ratios, geometric mean {g:.3f}, 95 % interval {lo:.3f}-{hi:.3f} "
                      f"(Student's t over the logs of {len(rs)} rounds: what the rounds cannot tell apart "
                      f"from the mean)")


# Consecutive step indices per block in lockstep_pairs' interval: a host stretch
# that slows one process's steps more than another's lasts a few steps, so the
# interval is taken over blocks' means rather than over single steps.
BLOCK = 10


def lockstep_pairs(w, args, results):
    """Rounds whose processes took turns step by step (train_rounds.py --lockstep):
    each of emm's variants beside each PyTorch variant, and each further emm
    variant beside the first (a setting's own cost), step index by step index
    (the same shapes, run within one turn of the ring of each other), for the
    steps' wall time and their device time (CUDA events). Per round: the
    geometric mean of the per-index ratios and its 95 % interval (Student's t
    over the means of blocks of BLOCK consecutive indices, the batch-means
    method). Over the rounds: the geometric mean of the rounds' figures and its
    interval over the rounds (what differs between rings, their order and the
    processes' memory, varies by round, so the rounds are what count)."""
    peers = [v for v in args.variants if is_peer(v)]
    others = [v for v in args.variants if v not in peers]
    rounds = sorted({x["round"] for v in args.variants for x in results.get((w, v), []) if x.get("lockstep")})
    if not peers or not others or not rounds:
        return
    print(f"\n{w}, lockstep rounds ({len(rounds)}): each step beside the same step index of another variant, "
          f"taken in turns on one GPU; geometric mean of the per-step ratios, 95 % interval over blocks of "
          f"{BLOCK} steps (a round) or over the rounds (all)")
    print("| variant / beside | time | round | steps paired | ratio | 95 % interval |")
    print("|---|---|---|---|---|---|")
    pairs = [(v, peer) for v in others for peer in peers] + [(v, others[0]) for v in others[1:]]
    for v, peer in pairs:
        for key, label in (("step_ms", "wall"), ("device_ms", "device")):
            means = []
            paired = 0
            for r in rounds:
                logs = pair_logs(results, w, v, peer, r, key)
                if not logs:
                    continue
                g, lo, hi = block_interval(logs)
                means.append(math.log(g))
                paired += len(logs)
                band = "-" if lo is None else f"{lo:.3f}-{hi:.3f}"
                print(f"| {v} / {peer} | {label} | {r + 1} | {len(logs)} | {g:.3f} | {band} |")
            if len(means) > 1:
                g, lo, hi = ratio_interval([math.exp(m) for m in means])
                print(f"| {v} / {peer} | {label} | all ({len(means)}) | {paired} | {g:.3f} | {lo:.3f}-{hi:.3f} |")


def pair_logs(results, w, v, peer, rnd, key):
    """log(v's step / peer's step) at each timed step index of round `rnd` where
    both took turns and both times are above 0; [] where either is missing."""
    def find(variant):
        return next((x for x in results.get((w, variant), []) if x["round"] == rnd and x.get("lockstep")), None)

    a, b = find(v), find(peer)
    if a is None or b is None or not a.get(key) or not b.get(key):
        return []
    return [math.log(x / y) for x, y in zip(a[key], b[key]) if x > 0 and y > 0]


def block_interval(logs):
    """The geometric mean of the ratios whose logs are `logs`, and its 95 %
    interval by batch means: Student's t over the means of consecutive blocks of
    BLOCK (a remainder joins the last block), centred on the mean of all logs:
    (mean, low, high), low and high None under two blocks."""
    m = statistics.mean(logs)
    k = len(logs) // BLOCK
    if k < 2:
        return math.exp(m), None, None
    blocks = [statistics.mean(logs[i * BLOCK:(i + 1) * BLOCK if i < k - 1 else len(logs)]) for i in range(k)]
    half = (T95[k - 2] if k - 1 <= len(T95) else 1.960) * statistics.stdev(blocks) / math.sqrt(k)
    return math.exp(m), math.exp(m - half), math.exp(m + half)


# Two-sided 95 % quantiles of Student's t by degrees of freedom, 1 to 30; past 30
# the normal's 1.960 (4 % narrower than t's at 31, less with more rounds).
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
       2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
       2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def ratio_interval(ratios):
    """The geometric mean of per-round ratios (a variant's total over the faster
    peer's of the same round) and its 95 % interval, from Student's t over their
    logs: (mean, low, high), or None under two rounds or with a ratio not above 0.
    With rounds that spread by 10-40 % as the lent host slows, five rounds leave
    an interval far wider than a 2 % bound, and saying so is part of the result."""
    if len(ratios) < 2 or any(r <= 0 for r in ratios):
        return None
    logs = [math.log(r) for r in ratios]
    mean = statistics.mean(logs)
    half = (T95[len(logs) - 2] if len(logs) - 1 <= len(T95) else 1.960) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)
