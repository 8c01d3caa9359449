"""python/gpu/benchmarks/train_rounds.py and the modules beside it: reading rounds back
from logs (train_rounds.py), the variants' names and settings (round_variants.py), the
tables (rounds_tables.py: emm's time inside PyTorch's hooks, steps beside the faster
peer's, steady-host steps) and the fit at equal shapes and host speed (host_fit.py)."""

import argparse
import math
import pathlib
import statistics

import pytest
from conftest import load_gpu_script


def _script(fixture, name):
    """A module-scoped fixture `fixture`: python/gpu's script `name`, loaded."""
    return pytest.fixture(scope="module", name=fixture)(lambda: load_gpu_script(name))


rounds = _script("rounds", "train_rounds")
tables = _script("tables", "rounds_tables")
variants = _script("variants", "round_variants")
host_fit = _script("host_fit", "host_fit")


def test_hook_time_sums_the_hooks_and_their_slow_calls_over_the_timed_steps(tables, capsys):
    # Two warm-up steps' changes come first and are left out (only the last
    # len(step_ms) changes belong to timed steps).
    warm = {"torch_alloc_ns": 9_000_000, "torch_alloc_calls": 10}
    step = {"torch_alloc_ns": 200_000, "torch_free_ns": 100_000, "torch_alloc_calls": 300,
            "torch_free_calls": 300, "torch_alloc_slow_calls": 2, "torch_alloc_slow_ns": 40_000,
            "torch_free_slow_calls": 1, "torch_free_slow_ns": 10_000}
    results = {("gpt2", "emm-pool"): [{"step_changes": [warm, warm, step, step], "step_ms": [20.0, 30.0]}]}
    tables.hook_time("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "emm-pool: time inside emm's PyTorch hooks per timed step: median 0.300 ms" in out
    assert "600 calls per step" in out
    assert "6 calls of 4 us or more in 2 steps, taking 0.100 ms of the hooks' 0.600 ms" in out
    assert "native" not in out


def test_hook_time_splits_the_slow_calls_by_what_the_pool_did(tables, capsys):
    step = {"torch_alloc_ns": 200_000, "torch_alloc_calls": 300, "torch_alloc_slow_calls": 3,
            "torch_alloc_slow_ns": 60_000, "torch_alloc_slow_locked_calls": 2, "torch_alloc_slow_locked_ns": 50_000,
            "torch_alloc_slow_reclaim_calls": 1, "torch_alloc_slow_reclaim_ns": 30_000,
            "torch_free_slow_none_calls": 1, "torch_free_slow_none_ns": 10_000}
    results = {("gpt2", "emm-pool"): [{"step_changes": [step, step], "step_ms": [20.0, 30.0]}]}
    tables.hook_time("gpt2", argparse.Namespace(variants=["emm-pool"]), results)
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == (
        "emm-pool: slow calls by what the pool did in them (a call under each kind it did): "
        "locked 4 (0.100 ms), reclaim 2 (0.060 ms), none 2 (0.020 ms)"), out


def test_hook_time_of_a_library_without_slow_call_time_says_nothing_of_it(tables, capsys):
    step = {"torch_alloc_ns": 200_000, "torch_free_ns": 100_000, "torch_alloc_calls": 300,
            "torch_free_calls": 300, "torch_alloc_slow_calls": 2}
    results = {("gpt2", "emm-pool"): [{"step_changes": [step], "step_ms": [20.0]}]}
    tables.hook_time("gpt2", argparse.Namespace(variants=["emm-pool"]), results)
    out = capsys.readouterr().out
    assert out.rstrip().endswith("2 calls of 4 us or more in 1 steps"), out


def test_allocator_work_gives_each_counters_median_and_total_over_the_timed_steps(tables, capsys):
    warm = {"pieces_moved": 900, "cache_reclaims": 50}
    results = {("gpt2", "emm-pool"): [
        {"step_changes": [warm, {"cache_reclaims": 2, "events_recorded": 9},
                          {"cache_reclaims": 4, "pieces_moved": 120}, {}], "step_ms": [1.0, 2.0, 3.0]},
        {"step_changes": [{"cache_reclaims": 3}], "step_ms": [1.0]},
    ], ("gpt2", "native"): [{"step_changes": [{"num_device_alloc": 1}], "step_ms": [1.0]}]}
    tables.allocator_work("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    # Four timed steps (the warm-up's change left out): reclaims 2, 4, 0, 3.
    assert out.strip() == ("emm-pool: allocator work per timed step, median (total over 4 steps): "
                           "cache_reclaims 2.5 (9), events_recorded 0 (9), pieces_moved 0 (120)"), out


def test_steps_are_compared_with_the_faster_peers_step_of_the_same_index_split_by_driver_work(tables, capsys):
    # Round 0: expandable is the faster peer (total 6 against native's 9); the
    # warm-up's change comes first and is left out.
    results = {
        ("gpt2", "native"): [{"round": 0, "total_ms": 9.0, "step_ms": [3.0, 3.0, 3.0]}],
        ("gpt2", "expandable"): [{"round": 0, "total_ms": 6.0, "step_ms": [2.0, 2.0, 2.0]}],
        ("gpt2", "emm-pool"): [{"round": 0, "total_ms": 9.0, "step_ms": [2.0, 2.2, 5.0],
                                "step_changes": [{"pieces_moved": 9}, {}, {"events_recorded": 3},
                                                 {"pieces_moved": 40}]}],
    }
    tables.quiet_and_busy("gpt2", argparse.Namespace(variants=["native", "expandable", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "| emm-pool | 2 | 1.050 / 1.050 (1.050) | 1 | 2.500 / 2.500 |" in out, out
    assert "| native |" not in out


def test_each_rounds_excess_over_the_faster_peer_is_split_by_driver_work(tables, capsys):
    # Round 0: expandable is the faster peer; emm moved 40 pieces in its third
    # step (2 ms over the peer's) and lost 0.2 ms in the other two. Round 1:
    # native is faster; emm moved nothing and gained 1 ms. The warm-up's change
    # comes first and is left out.
    results = {
        ("gpt2", "native"): [{"round": 0, "total_ms": 9.0, "step_ms": [3.0, 3.0, 3.0]},
                             {"round": 1, "total_ms": 6.0, "step_ms": [2.0, 2.0, 2.0]}],
        ("gpt2", "expandable"): [{"round": 0, "total_ms": 6.0, "step_ms": [2.0, 2.0, 2.0]},
                                 {"round": 1, "total_ms": 9.0, "step_ms": [3.0, 3.0, 3.0]}],
        ("gpt2", "emm-pool"): [{"round": 1, "total_ms": 5.0, "step_ms": [1.0, 2.0, 2.0],
                                "step_changes": [{}, {}, {}]},
                               {"round": 0, "total_ms": 8.2, "step_ms": [2.0, 2.2, 4.0],
                                "step_changes": [{"pieces_moved": 9}, {}, {"events_recorded": 3},
                                                 {"pieces_moved": 40, "pieces_unmapped": 40}]}],
    }
    tables.excess_by_round("gpt2", argparse.Namespace(variants=["native", "expandable", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "| emm-pool | 1 | 1 (40) | 2.0 | 0.2 |\n| emm-pool | 2 | 0 (0) | 0.0 | -1.0 |" in out, out
    assert "| native |" not in out and "| expandable |" not in out
    # Without a peer there is nothing to compare with.
    tables.excess_by_round("gpt2", argparse.Namespace(variants=["emm-pool"]), results)
    assert capsys.readouterr().out == ""


def test_a_variant_with_driver_work_in_every_step_still_has_its_row(tables, capsys):
    results = {
        ("gpt2", "expandable"): [{"round": 0, "total_ms": 4.0, "step_ms": [2.0, 2.0]}],
        ("gpt2", "emm-pool"): [{"round": 0, "total_ms": 6.0, "step_ms": [3.0, 3.0],
                                "step_changes": [{"pieces_moved": 1}, {"pieces_mapped": 2}]}],
    }
    tables.quiet_and_busy("gpt2", argparse.Namespace(variants=["expandable", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "| emm-pool | 0 | - | 2 | 1.500 / 1.500 |" in out, out


def test_a_step_in_which_another_rank_did_driver_work_is_not_quiet(tables, capsys):
    # Rank 0 moved nothing in the second step, rank 1 did: a step of DDP or FSDP2
    # waits for its slowest rank, so the step counts as one with driver work.
    results = {
        ("gpt2", "expandable"): [{"round": 0, "total_ms": 6.0, "step_ms": [2.0, 2.0, 2.0]}],
        ("gpt2", "emm-pool"): [{"round": 0, "total_ms": 9.0, "step_ms": [2.0, 4.0, 2.2],
                                "step_changes": [{}, {}, {}],
                                "step_changes_ranks": [[{}, {}, {}],
                                                       [{}, {"pieces_moved": 7}, {}]]}],
    }
    tables.quiet_and_busy("gpt2", argparse.Namespace(variants=["expandable", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "| emm-pool | 2 | 1.050 / 1.050 (1.050) | 1 | 2.000 / 2.000 |" in out, out
    assert tables.busy_steps(results[("gpt2", "emm-pool")][0]) == [False, True, False]


def test_a_log_without_every_ranks_counters_falls_back_to_rank_0s(tables):
    x = {"step_ms": [1.0, 1.0], "step_changes": [{"pieces_moved": 3}, {"num_device_alloc": 1}, {}]}
    assert tables.busy_steps(x) == [True, False]
    # Counters that do not cover every timed step say nothing.
    assert tables.busy_steps({"step_ms": [1.0, 1.0], "step_changes": [{}]}) is None


def _log(path, rounds_and_variants, first):
    """A train_rounds log of one run (started at round `first`) whose processes
    each printed a RESULT line; an earlier, abandoned run comes first."""
    import json

    lines = ['=== train_rounds {"sdpa": "auto", "argv": ["--rounds", "9"]}',
             "== gpt2 native round=0 rc=0 gpu={}",
             "RESULT " + json.dumps({"workload": "gpt2", "variant": "stale", "step_ms": [1.0]})]
    lines.append('=== train_rounds ' + json.dumps({"sdpa": "auto", "argv": ["--first-round", str(first)]}))
    for r, v, *ms in rounds_and_variants:
        lines.append(f"== gpt2 {v} round={r} rc=0 gpu={{}}")
        lines.append("RESULT " + json.dumps({"workload": "gpt2", "variant": v, "step_ms": ms or [10.0, 20.0],
                                             "steps": 2, "shapes": "bucketed", "world": 1}))
    path.write_text("\n".join(lines) + "\n")


def test_logs_of_rounds_split_over_calls_table_together(rounds, tmp_path):
    # Rounds 1-2 in one call, round 3 in the next (--first-round 3): the last run
    # of each log, merged, holds all three rounds of both variants.
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    _log(a, [(0, "native"), (0, "emm-pool"), (1, "emm-pool"), (1, "native")], 1)
    _log(b, [(2, "native"), (2, "emm-pool")], 3)
    args = argparse.Namespace(from_log=[str(a), str(b)], sdpa="auto", fsdp=False,
                              workloads=None, variants=None, rounds=0, steps=0, shapes=None, ddp=0)
    results = rounds.from_log(args)
    assert sorted(results) == [("gpt2", "emm-pool"), ("gpt2", "native")], "the abandoned run's result stays out"
    assert sorted(x["round"] for x in results[("gpt2", "native")]) == [0, 1, 2]
    assert args.rounds == 3
    assert all(x["total_ms"] == 30.0 for rs in results.values() for x in rs)


def test_a_round_run_again_by_the_next_call_keeps_only_its_later_process(rounds, tmp_path, capsys):
    # The first call was stopped after round 2's native process; the next call
    # (--first-round 2) ran round 2 again from its start, native included.
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    _log(a, [(0, "native"), (0, "emm-pool"), (1, "native", 40.0, 50.0)], 1)
    _log(b, [(1, "native", 11.0, 12.0), (1, "emm-pool"), (2, "emm-pool"), (2, "native")], 2)
    args = argparse.Namespace(from_log=[str(a), str(b)], sdpa="auto", fsdp=False,
                              workloads=None, variants=None, rounds=0, steps=0, shapes=None, ddp=0)
    results = rounds.from_log(args)
    native = sorted(results[("gpt2", "native")], key=lambda x: x["round"])
    assert [x["round"] for x in native] == [0, 1, 2], "one process a round"
    assert native[1]["total_ms"] == 23.0, "the later process of round 2 is kept"
    assert len(results[("gpt2", "emm-pool")]) == 3
    assert args.rounds == 3
    out = capsys.readouterr().out
    assert "gpt2 native: round 2 is in the logs twice" in out
    assert "(total 23.0 ms), the earlier left out (90.0 ms)" in out


def test_a_variant_may_carry_settings_for_its_process(variants):
    assert variants.split_variant("expandable") == ("expandable", {})
    assert variants.split_variant("emm-pool:EMM_POOL_WAIT_PARKED=0,EMM_POOL_THREAD_CACHE=64M") == (
        "emm-pool", {"EMM_POOL_WAIT_PARKED": "0", "EMM_POOL_THREAD_CACHE": "64M"})
    assert variants.split_variant("emm-pool:EMM_X=") == ("emm-pool", {"EMM_X": ""})
    for bad in ("emm-pool:", "emm-pool:WAIT", "emm-pool:lower=1", ":EMM_X=1", "emm-pool:EMM X=1",
                "emm-pool:EMM_X=a b"):
        with pytest.raises(ValueError, match="variant"):
            variants.split_variant(bad)


def test_a_log_keys_results_by_the_variant_as_named_with_its_settings(rounds, tmp_path):
    # train_bench.py reports "emm-pool" for both; the log's header line names them apart.
    import json

    lines = ['=== train_rounds {"sdpa": "auto", "argv": []}']
    for v in ("emm-pool", "emm-pool:EMM_POOL_WAIT_PARKED=0"):
        lines.append(f"== gpt2 {v} round=0 rc=0 gpu={{}}")
        lines.append("RESULT " + json.dumps({"workload": "gpt2", "variant": "emm-pool", "step_ms": [1.0],
                                             "steps": 1, "shapes": "bucketed", "world": 1}))
    path = tmp_path / "v.log"
    path.write_text("\n".join(lines) + "\n")
    args = argparse.Namespace(from_log=[str(path)], sdpa="auto", fsdp=False,
                              workloads=None, variants=None, rounds=0, steps=0, shapes=None, ddp=0)
    results = rounds.from_log(args)
    assert sorted(results) == [("gpt2", "emm-pool"), ("gpt2", "emm-pool:EMM_POOL_WAIT_PARKED=0")]
    assert args.variants == ["emm-pool", "emm-pool:EMM_POOL_WAIT_PARKED=0"]


def test_pytorchs_variants_with_settings_are_still_the_peers(variants):
    assert variants.is_peer("native") and variants.is_peer("expandable")
    assert variants.is_peer("native:PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128")
    assert not variants.is_peer("emm-pool") and not variants.is_peer("emm-pool:EMM_POOL_WAIT_PARKED=0")


def test_the_bench_reads_every_phase_the_pool_times():
    """train_bench.py's counters name each phase of `emm_pool::growth_phases::Phase`
    (the names the call-timing report prints), and no other."""
    import pathlib
    import re

    bench = load_gpu_script("train_bench")
    rust = (pathlib.Path(__file__).resolve().parents[2] / "crates/emm-pool/src/growth_phases.rs").read_text()
    names = re.findall(r'Phase::\w+ => "(\w+)"', rust)
    assert len(names) >= 10 and len(set(names)) == len(names), names
    read = {c[len("pool_"):-len("_calls")] for c in bench.COUNTERS
            if c.startswith("pool_") and c.endswith("_calls")}
    assert read == set(names)


def test_growth_phases_sum_each_phase_over_the_timed_steps_only(tables, capsys):
    warm = {"pool_expand_calls": 50, "pool_expand_ns": 900_000_000}
    step = {"pool_expand_calls": 1, "pool_expand_ns": 2_000_000, "pool_access_calls": 1,
            "pool_access_ns": 1_500_000, "pool_create_calls": 4, "pool_create_ns": 60_000,
            "pieces_mapped": 4, "pieces_moved": 6}
    results = {("gpt2", "emm-pool"): [{"step_changes": [warm, step, {}], "step_ms": [20.0, 30.0]}],
               ("gpt2", "native"): [{"step_changes": [{"num_device_alloc": 1}], "step_ms": [1.0]}]}
    tables.growth_phases("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert out.rstrip() == (
        "emm-pool: growth phases over 2 timed steps (nested; `unmap` on the helper thread): "
        "expand 1 calls 2.0 ms (1.000 ms a step), create 4 calls 0.1 ms (0.030 ms a step), "
        "access 1 calls 1.5 ms (0.750 ms a step); pieces mapped new 4, moved 6"), out


def test_steady_steps_that_share_no_index_are_said_to_be_none(tables, capsys):
    # Native's probes are all fast (the bound is 1.15 x 1.0 ms); emm's steps ran on
    # a slow host except its second, at an index where native's was slow too.
    results = {
        ("gpt2", "native"): [{"step_ms": [2.0, 2.0, 2.0], "probe_ms": [1.0, 2.0, 1.0]}],
        ("gpt2", "emm-pool"): [{"step_ms": [2.0, 2.0, 2.0], "probe_ms": [2.0, 1.1, 2.0]}],
    }
    tables.steady("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "compared at the 0 step indices" in out, out
    assert "none: no step index has a steady step in every variant (steady steps: native 2, emm-pool 1)\n" in out, out
    assert "1.30 x the fastest" in out, "under a tenth of the indices: the looser bound is tried too"
    assert out.count("the rounds' other comparisons stand alone") == 1, "said once, after the last bound"
    assert "| variant |" not in out


def test_a_log_without_probes_gets_one_steady_bound(tables, capsys):
    results = {
        ("gpt2", "native"): [{"step_ms": [2.0] * 20, "probe_ms": [1.0] * 20}],
        ("gpt2", "emm-pool"): [{"step_ms": [2.0] * 20}],
    }
    tables.steady("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "1.15 x the fastest" in out and "1.30 x" not in out, out
    assert "(steady steps: native 20, emm-pool 0); the rounds' other comparisons stand alone" in out, out


def test_a_looser_steady_bound_is_tabled_where_the_first_leaves_few_indices(tables, capsys):
    # emm's process ran its steps with the host probe at 1.2 ms against native's
    # 1.0 (past 1.15x, within 1.3x) but for its first step: at 1.15x one index of
    # twenty is compared, so the table is given again at 1.3x over all twenty.
    n = 20
    results = {
        ("gpt2", "native"): [{"step_ms": [2.0] * n, "probe_ms": [1.0] * n}],
        ("gpt2", "emm-pool"): [{"step_ms": [3.0] + [2.2] * (n - 1), "probe_ms": [1.0] + [1.2] * (n - 1)}],
    }
    tables.steady("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "1.15 x the fastest probe of the workload), compared at the 1 step indices" in out, out
    assert "| emm-pool | 1 | 3.0 | 1.500 |" in out, out
    assert "1.30 x the fastest probe of the workload), compared at the 20 step indices" in out, out
    assert "| emm-pool | 20 | 44.8 | 1.120 |" in out, out


def test_the_looser_steady_bound_is_left_out_where_the_first_compares_enough(tables, capsys):
    n = 20
    results = {
        ("gpt2", "native"): [{"step_ms": [2.0] * n, "probe_ms": [1.0] * n}],
        ("gpt2", "emm-pool"): [{"step_ms": [2.2] * n, "probe_ms": [1.1] * 2 + [1.2] * (n - 2)}],
    }
    tables.steady("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "compared at the 2 step indices" in out, out
    assert "1.30 x" not in out, out


def test_each_rounds_total_says_how_fast_the_processes_host_was(tables, capsys):
    # emm's process was calibrated as fast at its end but probed slow before its
    # steps: the per-round table shows both, beside its ratio to the faster peer.
    results = {
        ("gpt2", "native"): [{"round": 0, "total_ms": 100.0, "calib": {"cpu_ms": 8.0, "launch_us": 6.0},
                              "probe_ms": [0.8, 0.7, 0.9]}],
        ("gpt2", "emm-pool"): [{"round": 0, "total_ms": 110.0, "calib": {"cpu_ms": 8.5, "launch_us": 6.1},
                                "probe_ms": [1.3, 1.2, 1.4]}],
    }
    tables.paired("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "| 1 | 100.0 (host 8.0 ms, launch 6.00 us, probe 0.80 ms) | 110.0 (host 8.5 ms, launch 6.10 us, " \
           "probe 1.30 ms) | 1.100 |" in out, out


def synthetic_rounds(ratio, slope, rounds_=3, steps=40, emm_host=1.5, per_round=None, noise=0.0):
    """Rounds of native, expandable and emm: each step index costs what its shapes
    cost; a step's time moves with its host probe to the power `slope`; emm's
    steps cost `ratio` x expandable's (times `per_round[k]` in round k+1), native's
    1.1 x; emm's processes ran on a host `emm_host` x slower (with the probe's own
    wobble), so their medians are slower than `ratio` says. `noise`: the standard
    deviation of a log-normal factor on every step."""
    import random
    import statistics

    r = random.Random(7)
    cost = [r.uniform(20.0, 200.0) for _ in range(steps)]
    own = {"native": 1.1, "expandable": 1.0, "emm-pool": ratio}
    results = {}
    for rnd in range(1, rounds_ + 1):
        for v in own:
            host = emm_host if v == "emm-pool" else 1.0
            extra = per_round[rnd - 1] if per_round and v == "emm-pool" else 1.0
            probes = [host * r.uniform(0.8, 1.6) for _ in range(steps)]
            steps_ms = [c * own[v] * extra * p ** slope * math.exp(r.gauss(0.0, noise)) for c, p in zip(cost, probes)]
            results.setdefault(("gpt2", v), []).append(
                {"round": rnd, "step_ms": steps_ms, "probe_ms": probes, "total_ms": sum(steps_ms),
                 "median_ms": statistics.median(steps_ms), "peak_reserved": 2**30, "peak_allocated": 2**30,
                 "driver_allocs": 1, "final_loss": 1.0})
    return results


def processes(results):
    return {(v, x["round"]): (x["step_ms"], x["probe_ms"]) for (_, v), xs in results.items() for x in xs}


def test_the_host_fit_finds_the_allocators_ratio_under_a_slowed_host(host_fit):
    fit = host_fit.fit
    results = synthetic_rounds(ratio=1.05, slope=0.4)
    f = fit({(v, x["round"]): (x["step_ms"], x["probe_ms"]) for (_, v), xs in results.items() for x in xs})
    assert abs(f.slope - 0.4) < 1e-9
    for rnd in (1, 2, 3):
        assert abs(f.ratio(("emm-pool", rnd), ("expandable", rnd)) - 1.05) < 1e-9
        assert abs(f.ratio(("native", rnd), ("expandable", rnd)) - 1.1) < 1e-9
    # The medians alone would blame emm for its host: 1.05 x 1.5 ** 0.4 = 1.24.
    import statistics
    med = {v: statistics.mean(statistics.median(x["step_ms"]) for x in results[("gpt2", v)])
           for v in ("expandable", "emm-pool")}
    assert med["emm-pool"] / med["expandable"] > 1.15


def test_the_host_fit_converges_where_processes_timed_different_steps(host_fit):
    # Round 2's emm process stopped after 25 of 40 steps: the panel is unbalanced
    # and the demeaning must sweep until it settles.
    results = synthetic_rounds(ratio=0.97, slope=0.3)
    x = results[("gpt2", "emm-pool")][1]
    x["step_ms"], x["probe_ms"] = x["step_ms"][:25], x["probe_ms"][:25]
    f = host_fit.fit({(v, y["round"]): (y["step_ms"], y["probe_ms"]) for (_, v), ys in results.items() for y in ys})
    assert abs(f.slope - 0.3) < 1e-6
    assert abs(f.ratio(("emm-pool", 2), ("expandable", 2)) - 0.97) < 1e-6


def test_the_host_fit_has_nothing_to_say_without_two_processes_or_a_varying_probe(host_fit):
    fit = host_fit.fit
    assert fit({("emm-pool", 1): ([1.0, 2.0], [1.0, 1.1])}) is None
    assert fit({("emm-pool", 1): ([1.0, 2.0], [1.0, 1.0]), ("native", 1): ([1.1, 2.2], [1.2, 1.2])}) is None
    assert fit({}) is None


def test_host_adjusted_tables_each_variant_and_round_beside_the_faster_peer(tables, capsys):
    results = synthetic_rounds(ratio=1.05, slope=0.4)
    args = argparse.Namespace(variants=["native", "expandable", "emm-pool"])
    tables.host_adjusted("gpt2", args, results)
    out = capsys.readouterr().out
    assert "360 timed steps; a step's time moved as the probe's to the power 0.400" in out, out
    assert "| emm-pool | 3 | 1.050 | 1.050, 1.050, 1.050 |" in out, out
    assert "| native | 3 | 1.100 | - |" in out, out
    assert "| expandable | 3 | - | - |" in out, out


def test_host_adjusted_says_nothing_for_a_log_without_probes(tables, capsys):
    results = synthetic_rounds(ratio=1.05, slope=0.4)
    del results[("gpt2", "native")][0]["probe_ms"]
    tables.host_adjusted("gpt2", argparse.Namespace(variants=["native", "expandable", "emm-pool"]), results)
    assert capsys.readouterr().out == ""


def test_the_host_fit_stays_close_to_the_truth_under_noise(host_fit):
    f = host_fit.fit(processes(synthetic_rounds(ratio=1.05, slope=0.4, noise=0.05)))
    assert abs(f.slope - 0.4) < 0.05, f.slope
    emm = sum(g for k, g in f.effects.items() if k[0] == "emm-pool") / 3
    exp_ = sum(g for k, g in f.effects.items() if k[0] == "expandable") / 3
    assert abs(math.exp(emm - exp_) - 1.05) < 0.02


def test_host_adjusted_takes_the_mean_of_the_rounds_in_log_space(tables, capsys):
    # emm's rounds at 1.00, 1.02 and 1.12 x its own cost: over its rounds the
    # geometric mean, 1.045 (the median would say 1.020).
    results = synthetic_rounds(ratio=1.0, slope=0.4, per_round=[1.00, 1.02, 1.12])
    tables.host_adjusted("gpt2", argparse.Namespace(variants=["native", "expandable", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "| emm-pool | 3 | 1.045 | 1.000, 1.020, 1.120 |" in out, out


def test_the_tables_include_the_host_fit(tables, capsys):
    args = argparse.Namespace(variants=["native", "expandable", "emm-pool"], workloads=["gpt2"], ddp=0,
                              shapes="fresh", sdpa="auto", rounds=3, steps=40)
    tables.tables(args, synthetic_rounds(ratio=1.05, slope=0.4))
    out = capsys.readouterr().out
    assert "gpt2, step time at equal shapes and host speed" in out
    assert "| emm-pool | 3 | 1.050 | 1.050, 1.050, 1.050 |" in out


def test_the_host_fit_leaves_out_steps_without_a_positive_time_or_probe(host_fit):
    clean = processes(synthetic_rounds(ratio=1.05, slope=0.4))
    dirty = {k: (list(t) + [0.0, -3.0, 5.0, None], list(p) + [1.0, 1.0, -1.0, 1.0]) for k, (t, p) in clean.items()}
    a, b = host_fit.fit(clean), host_fit.fit(dirty)
    assert b.steps == a.steps
    assert abs(a.slope - b.slope) < 1e-12


def test_the_host_fit_gives_nothing_where_processes_share_no_step_index(host_fit):
    # Two processes on indices 0-9, two more on 10-19: no step ties the pairs, so
    # how one pair stands against the other is not in the data.
    def steps(lo, k):
        probes = [1.0 + 0.01 * k * i * i for i in range(10)]
        return [0.0] * lo + [(10.0 + i) * p ** 0.5 for i, p in enumerate(probes)], [0.0] * lo + probes
    procs = {("native", 1): steps(0, 1), ("emm-pool", 1): steps(0, 2), ("native", 2): steps(10, 1),
             ("emm-pool", 2): steps(10, 2)}
    assert host_fit.fit(procs) is None
    procs[("expandable", 1)] = ([10.0] * 20, [1.0 + 0.02 * i for i in range(20)])
    assert host_fit.fit(procs) is not None, "a process timed on every index joins them"


def test_the_host_fit_gives_nothing_where_its_sweeps_do_not_settle(host_fit, monkeypatch):
    results = synthetic_rounds(ratio=0.97, slope=0.3)
    x = results[("gpt2", "emm-pool")][1]
    x["step_ms"], x["probe_ms"] = x["step_ms"][:25], x["probe_ms"][:25]
    monkeypatch.setattr(host_fit, "SWEEPS", 1)
    assert host_fit.fit(processes(results)) is None


def test_each_round_rotates_the_order_by_one(rounds):
    vs = ["native", "expandable", "emm-pool"]
    assert rounds.round_order(vs, "bert", 0) == vs
    assert rounds.round_order(vs, "bert", 1) == ["expandable", "emm-pool", "native"]
    assert rounds.round_order(vs, "bert", 5) == ["emm-pool", "native", "expandable"]


def test_a_resumed_round_runs_only_the_processes_the_earlier_call_did_not_finish(rounds, tmp_path):
    # The earlier call ran round 2 (index 1: expandable, emm-pool, native) and
    # finished round 3's first process (index 2: emm-pool first) before its limit.
    path = tmp_path / "a.log"
    _log(path, [(1, "expandable"), (1, "emm-pool"), (1, "native"), (2, "emm-pool")], 2)
    args = argparse.Namespace(sdpa="auto", fsdp=False, steps=2, shapes="bucketed", ddp=0)
    results = rounds.resumed([str(path)], args)
    finished = {(w, v, x["round"]) for (w, v), runs in results.items() for x in runs}
    vs = ["native", "expandable", "emm-pool"]
    assert rounds.round_order(vs, "gpt2", 2, finished) == ["native", "expandable"]
    assert rounds.round_order(vs, "gpt2", 1, finished) == []
    assert rounds.round_order(vs, "gpt2", 3, finished) == vs
    assert rounds.round_order(vs, "bert", 2, finished) == ["emm-pool", "native", "expandable"], "another workload"
    assert sorted(x["round"] for x in results[("gpt2", "emm-pool")]) == [1, 2]


def test_resumes_chain_over_the_logs_of_several_calls(rounds, tmp_path, capsys):
    # Call 1 stopped in round 2, call 2 (resuming call 1) in round 3: call 3
    # resumes both, and a process both logs hold is kept once (the later).
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    _log(a, [(0, "native"), (0, "emm-pool"), (1, "emm-pool", 40.0)], 1)
    _log(b, [(1, "emm-pool", 4.0), (1, "native"), (2, "native")], 2)
    args = argparse.Namespace(sdpa="auto", fsdp=False, steps=2, shapes="bucketed", ddp=0)
    results = rounds.resumed([str(a), str(b)], args)
    finished = {(w, v, x["round"]) for (w, v), runs in results.items() for x in runs}
    assert finished == {("gpt2", "native", 0), ("gpt2", "emm-pool", 0), ("gpt2", "emm-pool", 1),
                        ("gpt2", "native", 1), ("gpt2", "native", 2)}
    assert [x["total_ms"] for x in results[("gpt2", "emm-pool")] if x["round"] == 1] == [4.0]
    assert "round 2 is in the logs twice" in capsys.readouterr().out


def test_a_resumed_log_without_a_finished_process_is_said_so(rounds, tmp_path, capsys):
    path = tmp_path / "a.log"
    _log(path, [], 1)
    args = argparse.Namespace(sdpa="auto", fsdp=False, steps=2, shapes="bucketed", ddp=0)
    assert rounds.resumed([str(path)], args) == {}
    assert "no finished process in its last run" in capsys.readouterr().out
    flash = argparse.Namespace(sdpa="flash", fsdp=False, steps=2, shapes="bucketed", ddp=0)
    with pytest.raises(SystemExit, match="not one run"):
        rounds.resumed([str(path)], flash)


def test_resuming_a_run_of_other_steps_or_shapes_is_refused(rounds, tmp_path):
    path = tmp_path / "a.log"
    _log(path, [(0, "native")], 1)
    for other in ({"steps": 300}, {"shapes": "fresh"}, {"ddp": 2}, {"sdpa": "flash"}, {"fsdp": True}):
        args = argparse.Namespace(**{**dict(sdpa="auto", fsdp=False, steps=2, shapes="bucketed", ddp=0), **other})
        with pytest.raises(SystemExit, match="not one run"):
            rounds.resumed([str(path)], args)


def test_a_resumed_run_starts_only_the_unfinished_processes_and_tables_all(rounds, tmp_path, monkeypatch, capsys):
    path = tmp_path / "a.log"
    _log(path, [(1, "expandable"), (1, "emm-pool"), (1, "native"), (2, "emm-pool")], 2)
    ran, tabled = [], {}

    def fake_run(args, w, v, r, log, gpu=None):
        ran.append((v, r) if gpu is None else (v, r, gpu))
        return {"workload": w, "variant": v, "round": r, "step_ms": [5.0, 5.0], "total_ms": 10.0,
                "median_ms": 5.0, "peak_reserved": 0, "final_loss": 0.0, "gpu": {}}
    monkeypatch.setattr(rounds, "run_one", fake_run)
    monkeypatch.setattr(rounds, "tables", lambda args, results: tabled.update(rounds=args.rounds, results=results))
    monkeypatch.setattr("sys.argv", ["train_rounds.py", "--workloads", "gpt2", "--variants", "native", "expandable",
                                     "emm-pool", "--steps", "2", "--shapes", "bucketed", "--rounds", "2",
                                     "--first-round", "3", "--resume", str(path), "--log", str(tmp_path / "b.log"),
                                     "--no-telemetry"])
    rounds.main()
    assert ran == [("native", 2), ("expandable", 2), ("native", 3), ("expandable", 3), ("emm-pool", 3)]
    assert tabled["rounds"] == 3, "rounds 2-4: the resumed log's and this run's"
    assert sorted(x["round"] for x in tabled["results"][("gpt2", "emm-pool")]) == [1, 2, 3]
    assert "round 3 gpt2       emm-pool         in a resumed log: not run again" in capsys.readouterr().out
    # With a GPU a variant, each unfinished process keeps the GPU its round gives it.
    ran.clear()
    gpus_log = tmp_path / "g.log"
    _log(gpus_log, [(2, "native")], 3)
    monkeypatch.setattr("sys.argv", ["train_rounds.py", "--workloads", "gpt2", "--variants", "native", "expandable",
                                     "emm-pool", "--steps", "2", "--shapes", "bucketed", "--rounds", "1",
                                     "--first-round", "3", "--gpus", "3", "--resume", str(gpus_log),
                                     "--log", str(tmp_path / "c.log"), "--no-telemetry"])
    rounds.main()
    assert sorted(ran) == [("emm-pool", 2, "1"), ("expandable", 2, "0")]


def test_a_resumed_round_outside_this_runs_rounds_is_said_to_stay_short(rounds, tmp_path, monkeypatch, capsys):
    path = tmp_path / "a.log"
    _log(path, [(5, "native")], 6)
    monkeypatch.setattr(rounds, "run_one", lambda *a, **k: None)
    monkeypatch.setattr(rounds, "tables", lambda args, results: None)
    monkeypatch.setattr("sys.argv", ["train_rounds.py", "--workloads", "gpt2", "--variants", "native", "emm-pool",
                                     "--steps", "2", "--shapes", "bucketed", "--rounds", "1", "--resume", str(path),
                                     "--log", str(tmp_path / "b.log"), "--no-telemetry"])
    rounds.main()
    assert "round 6 of gpt2 is outside this run's rounds and lacks emm-pool" in capsys.readouterr().out


def test_each_workloads_heading_counts_its_own_rounds(tables, capsys):
    # A run cut short in its last round: gpt2 has three rounds, bert two.
    results = synthetic_rounds(ratio=1.0, slope=0.2)
    for v in ("native", "expandable", "emm-pool"):
        results[("bert", v)] = [dict(x) for x in results[("gpt2", v)] if x["round"] < 3]
    args = argparse.Namespace(variants=["native", "expandable", "emm-pool"], workloads=["gpt2", "bert"], ddp=0,
                              shapes="fresh", sdpa="auto", rounds=3, steps=40)
    tables.tables(args, results)
    out = capsys.readouterr().out
    assert "## gpt2, fresh shapes: 3 interleaved rounds" in out
    assert "## bert, fresh shapes: 2 interleaved rounds" in out
    # A variant the last round did not reach: the heading gives the range.
    results[("bert", "emm-pool")] = results[("bert", "emm-pool")][:1]
    tables.tables(args, results)
    assert "## bert, fresh shapes: 1-2 interleaved rounds" in capsys.readouterr().out


def test_resuming_into_the_resumed_log_is_refused(rounds, tmp_path, monkeypatch, capsys):
    path = tmp_path / "a.log"
    _log(path, [(0, "native")], 1)
    monkeypatch.setattr(rounds, "run_one", lambda *a, **k: None)
    monkeypatch.setattr(rounds, "tables", lambda args, results: None)
    monkeypatch.setattr("sys.argv", ["train_rounds.py", "--workloads", "gpt2", "--variants", "native", "--steps", "2",
                                     "--shapes", "bucketed", "--rounds", "1", "--resume", str(path), "--log", str(path),
                                     "--no-telemetry"])
    with pytest.raises(SystemExit):
        rounds.main()
    assert "--resume needs a --log of its own" in capsys.readouterr().err
    assert path.read_text().count("=== train_rounds") == 2, "the log is left as it was"


@pytest.mark.parametrize("suffix", [".xz", ".gz"])
def test_a_compressed_log_tables_as_the_plain_one(rounds, tmp_path, suffix):
    # docs/runs/ keeps the GPU runs' logs compressed; --from-log reads them as they are.
    import gzip
    import lzma

    plain = tmp_path / "a.log"
    _log(plain, [(0, "native", 5.0, 6.0), (0, "emm-pool"), (1, "emm-pool", 7.0), (1, "native")], 1)
    packed = tmp_path / ("a.log" + suffix)
    opener = lzma.open if suffix == ".xz" else gzip.open
    with opener(packed, "wb") as f:
        f.write(plain.read_bytes())

    def table(path):
        args = argparse.Namespace(from_log=[str(path)], sdpa="auto", fsdp=False,
                                  workloads=None, variants=None, rounds=0, steps=0, shapes=None, ddp=0)
        return rounds.from_log(args), args.rounds

    assert table(packed) == table(plain)
    results, n = table(packed)
    assert n == 2
    assert sorted(x["total_ms"] for x in results[("gpt2", "native")]) == [11.0, 30.0]
    assert sorted(x["total_ms"] for x in results[("gpt2", "emm-pool")]) == [7.0, 30.0]


def test_the_rounds_ratio_interval_is_students_t_over_their_logs(tables):
    # Two rounds at 1.1 and 1/1.1: geometric mean 1; the logs' standard deviation
    # is sqrt(2) * log 1.1, so the half width is t(1) * log 1.1 = 12.706 * log 1.1.
    g, lo, hi = tables.ratio_interval([1.1, 1 / 1.1])
    assert g == pytest.approx(1.0)
    assert math.log(hi) == pytest.approx(12.706 * math.log(1.1))
    assert math.log(lo) == pytest.approx(-12.706 * math.log(1.1))
    # Rounds that agree leave no width; more rounds narrow it.
    assert tables.ratio_interval([1.03] * 4) == pytest.approx((1.03, 1.03, 1.03))
    five = tables.ratio_interval([1.098, 0.994, 0.991, 1.082, 1.061])
    ten = tables.ratio_interval([1.098, 0.994, 0.991, 1.082, 1.061] * 2)
    assert five[1] < ten[1] < ten[2] < five[2]
    assert five[1] < 1.0 < five[2], "five such rounds cannot tell 1.04 from 1"
    # Past 30 degrees of freedom the normal's quantile.
    many = [1.0, 1.2] * 20
    logs = [math.log(x) for x in many]
    import statistics

    half = 1.960 * statistics.stdev(logs) / math.sqrt(len(logs))
    assert math.log(tables.ratio_interval(many)[2]) == pytest.approx(statistics.mean(logs) + half)


def test_the_rounds_ratio_interval_needs_two_rounds_of_positive_ratios(tables):
    assert tables.ratio_interval([]) is None
    assert tables.ratio_interval([1.05]) is None
    assert tables.ratio_interval([1.05, 0.0]) is None


def test_the_per_round_table_gives_the_ratios_interval(tables, capsys):
    results = {
        ("gpt2", "native"): [{"round": r, "total_ms": 100.0} for r in range(3)],
        ("gpt2", "emm-pool"): [{"round": r, "total_ms": t} for r, t in enumerate((110.0, 95.0, 104.0))],
    }
    tables.paired("gpt2", argparse.Namespace(variants=["native", "emm-pool"]), results)
    out = capsys.readouterr().out
    g, lo, hi = tables.ratio_interval([1.10, 0.95, 1.04])
    assert f"emm-pool: the rounds' ratios, geometric mean {g:.3f}, 95 % interval {lo:.3f}-{hi:.3f}" in out, out


turns = _script("turns", "turns")

# A stand-in for train_bench.py under --lockstep: takes its turns as the real one
# does (one a step, then one more to wait for every process's last step) and
# prints the wall-clock time of each step's turn in its RESULT line; the variant
# "die" ends at its third turn.
_TAKER = r'''
import argparse, json, sys, time
sys.path.insert(0, sys.argv.pop(1))
from turns import PeerGone, Turns
p = argparse.ArgumentParser()
for a in ("--variant", "--workload", "--steps", "--warmup", "--sdpa", "--shapes", "--turn-fds"):
    p.add_argument(a)
a = p.parse_args()
t = Turns.parse(a.turn_fds)
n = int(a.steps) + int(a.warmup)
stamps, steps = [], []
for i in range(n):
    t.take()
    stamps.append(time.time())
    if a.variant == "die" and i == 2:
        sys.exit(3)
    time.sleep(0.002)
    if i >= int(a.warmup):
        steps.append(10.0 if a.variant == "native" else 11.0)
    if i + 1 < n:
        t.give()
t.give()
try:
    t.take()
except PeerGone:
    pass
t.give()
t.close()
print("RESULT " + json.dumps({"variant": a.variant, "workload": a.workload, "steps": int(a.steps),
      "shapes": a.shapes, "step_ms": steps, "device_ms": steps, "median_ms": steps[0], "final_loss": 0.0,
      "peak_reserved": 1, "peak_allocated": 1, "driver_allocs": 0, "device_used_peak": None,
      "lockstep": True, "stamps": stamps}))
'''


def _lockstep_args(rounds, tmp_path, monkeypatch, variants):
    """train_rounds' arguments for `variants` under --lockstep, its processes the
    stand-in above (launched with the directory of turns.py first)."""
    script = tmp_path / "train_bench.py"
    script.write_text(_TAKER)
    monkeypatch.setattr(rounds, "HERE", tmp_path)
    real = rounds.subprocess.Popen
    here = str(pathlib.Path(rounds.__file__).parent)  # turns.py lies beside it
    monkeypatch.setattr(rounds.subprocess, "Popen",
                        lambda cmd, **kw: real([cmd[0], cmd[1], here, *cmd[2:]], **kw))
    return argparse.Namespace(steps=6, warmup=2, sdpa="auto", shapes="fresh", profile=None, ddp=0, fsdp=False,
                              pin=None, telemetry=False, timeout=30, variants=variants)


def test_lockstep_runs_every_step_of_a_round_in_turn_around_the_ring(rounds, tmp_path, monkeypatch):
    args = _lockstep_args(rounds, tmp_path, monkeypatch, ["native", "expandable", "emm-pool"])
    with open(tmp_path / "run.log", "w") as log:
        done = rounds.lockstep(args, "gpt2", ["emm-pool", "native", "expandable"], 0, log)
    got = {v: res for v, res in done}
    assert all(got.values()), done
    turns_taken = sorted((t, v) for v, res in got.items() for t in res["stamps"])
    order = [v for _, v in turns_taken]
    # 8 steps: each process's turns follow the ring's order.
    assert order == ["emm-pool", "native", "expandable"] * 8, order
    assert got["native"]["lockstep"] == {"ring": ["emm-pool", "native", "expandable"], "position": 1}


def test_a_process_that_ends_early_ends_the_ring_without_a_hang(rounds, tmp_path, monkeypatch):
    args = _lockstep_args(rounds, tmp_path, monkeypatch, ["native", "die", "emm-pool"])
    with open(tmp_path / "run.log", "w") as log:
        done = dict(rounds.lockstep(args, "gpt2", ["native", "die", "emm-pool"], 0, log))
    assert done == {"native": None, "die": None, "emm-pool": None}
    text = (tmp_path / "run.log").read_text()
    assert "the process before this one in the ring ended" in text, text


def test_turns_alternate_between_two_threads_and_a_closed_ring_reads_as_gone(turns):
    import os
    import threading

    a_in, b_out = os.pipe()
    b_in, a_out = os.pipe()
    first, second = turns.Turns(a_in, a_out), turns.Turns(b_in, b_out)
    seen = []

    def run(me, name, n):
        for _ in range(n):
            me.take()
            seen.append(name)
            me.give()

    os.write(b_out, b"t")  # the first turn is the first one's
    ts = [threading.Thread(target=run, args=(first, "a", 4)), threading.Thread(target=run, args=(second, "b", 4))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(5)
    assert seen == ["a", "b"] * 4
    second.close()  # its end of the first's pipe too
    os.read(a_in, 1)  # the last turn the second gave
    with pytest.raises(turns.PeerGone):
        first.take()
    first.close()


def test_turn_fds_must_be_two_numbers(turns):
    assert turns.Turns.parse(None) is None
    t = turns.Turns.parse("5,6")
    assert (t.read_fd, t.write_fd) == (5, 6)
    with pytest.raises(SystemExit, match="two descriptor numbers"):
        turns.Turns.parse("5")


def test_lockstep_pairs_give_each_rounds_per_step_ratio_and_its_interval(tables, capsys):
    def run(v, r, steps):
        return {"variant": v, "round": r, "lockstep": True, "step_ms": steps, "device_ms": [s / 2 for s in steps]}

    peer = [100.0 + (i % 7) for i in range(40)]
    mine = [p * 1.02 for p in peer]
    results = {("bert", "expandable"): [run("expandable", 0, peer), run("expandable", 1, peer)],
               ("bert", "emm-pool"): [run("emm-pool", 0, mine), run("emm-pool", 1, peer)]}
    tables.lockstep_pairs("bert", argparse.Namespace(variants=["expandable", "emm-pool"]), results)
    out = capsys.readouterr().out
    assert "| emm-pool / expandable | wall | 1 | 40 | 1.020 | 1.020-1.020 |" in out, out
    assert "| emm-pool / expandable | wall | 2 | 40 | 1.000 | 1.000-1.000 |" in out, out
    assert "| emm-pool / expandable | wall | all (2) | 80 | 1.010 |" in out, out
    assert "| emm-pool / expandable | device | 1 | 40 | 1.020 |" in out, out


def test_the_lockstep_interval_widens_with_blocks_that_disagree(tables):
    # Blocks of ten steps at 1.03 and 1.01 by turns: the mean between them, and an
    # interval (Student's t over four block means, 3 degrees of freedom) that
    # holds it and both blocks' figures but not 1.00.
    logs = [math.log(1.03 if (i // 10) % 2 == 0 else 1.01) for i in range(40)]
    g, lo, hi = tables.block_interval(logs)
    assert g == pytest.approx(math.sqrt(1.03 * 1.01), rel=1e-9)
    half = 3.182 * statistics.stdev([math.log(1.03), math.log(1.01)] * 2) / 2
    assert (lo, hi) == pytest.approx((g * math.exp(-half), g * math.exp(half)), rel=1e-9)
    assert 1.0 < lo < 1.01 and 1.03 < hi
    # A single block gives no interval.
    assert tables.block_interval(logs[:19])[1:] == (None, None)
    # A remainder joins the last block; the centre stays the mean of every step.
    g, lo, hi = tables.block_interval(logs[:25])
    assert g == pytest.approx(math.exp(statistics.mean(logs[:25])), rel=1e-12)
    blocks = [statistics.mean(logs[:10]), statistics.mean(logs[10:25])]
    half = 12.706 * statistics.stdev(blocks) / math.sqrt(2)
    assert (lo, hi) == pytest.approx((g * math.exp(-half), g * math.exp(half)), rel=1e-9)


def test_a_further_emm_variant_is_paired_with_the_first_too(tables, capsys):
    def run(v, steps):
        return {"variant": v, "round": 0, "lockstep": True, "step_ms": steps}

    results = {("bert", "native"): [run("native", [10.0] * 20)],
               ("bert", "emm-pool"): [run("emm-pool", [11.0] * 20)],
               ("bert", "emm-pool:X=1"): [run("emm-pool:X=1", [12.1] * 20)]}
    tables.lockstep_pairs("bert", argparse.Namespace(variants=["native", "emm-pool", "emm-pool:X=1"]), results)
    out = capsys.readouterr().out
    assert "| emm-pool:X=1 / native | wall | 1 | 20 | 1.210 |" in out, out
    assert "| emm-pool:X=1 / emm-pool | wall | 1 | 20 | 1.100 |" in out, out
    assert "/ emm-pool:X=1 |" not in out, out


def test_a_lockstep_round_without_variants_runs_nothing(rounds, tmp_path):
    with open(tmp_path / "run.log", "w") as log:
        assert rounds.lockstep(argparse.Namespace(), "gpt2", [], 0, log) == []


def test_lockstep_refuses_to_resume(rounds, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["train_rounds.py", "--lockstep", "--resume", str(tmp_path / "a.log"),
                                     "--log", str(tmp_path / "b.log")])
    with pytest.raises(SystemExit):
        rounds.main()
    assert "not with --resume" in capsys.readouterr().err


def test_a_process_past_its_time_is_stopped_and_logged(rounds, tmp_path):
    import subprocess
    import sys

    args = argparse.Namespace(timeout=1)
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with open(tmp_path / "run.log", "w") as log:
        assert rounds.collect(args, "gpt2", "native", 0, log, proc, None) is None
    assert proc.poll() is not None, "the process was ended"
    text = (tmp_path / "run.log").read_text()
    assert "started" in text and "stopped after --timeout 1 s" in text, text


def test_lockstep_pairs_leave_out_rounds_that_did_not_take_turns(tables, capsys):
    results = {("bert", "expandable"): [{"round": 0, "step_ms": [1.0] * 20}],
               ("bert", "emm-pool"): [{"round": 0, "step_ms": [2.0] * 20}]}
    tables.lockstep_pairs("bert", argparse.Namespace(variants=["expandable", "emm-pool"]), results)
    assert capsys.readouterr().out == ""


def test_a_device_peak_the_process_could_not_read_is_a_dash(rounds):
    assert rounds.used_text({"device_used_peak": None}) == "-"
    assert rounds.used_text({"device_used_peak": 2 << 30}) == "2.00"
