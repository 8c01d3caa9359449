"""python/gpu/benchmarks/train_bench.py's per-step shapes: every workload has its
own, and every variant of a workload sees the same sequence (the rounds compare
steps of the same index)."""

import pytest
from conftest import load_gpu_script


@pytest.fixture(scope="module")
def bench():
    return load_gpu_script("train_bench")


def test_every_workload_has_its_own_shapes(bench):
    assert set(bench.DRAWS) == set(bench.WORKLOADS)


@pytest.mark.parametrize("mode", ["fresh", "bucketed"])
def test_shapes_repeat_for_a_seed_and_stay_in_their_ranges(bench, mode):
    for workload, (batch, second) in bench.DRAWS.items():
        plan = bench.shapes(workload, 300, 5, mode)
        assert plan == bench.shapes(workload, 300, 5, mode)
        assert plan != bench.shapes(workload, 300, 6, mode), workload
        assert len(plan) == 300
        for b, s in plan:
            assert batch[0] <= b <= batch[1], (workload, b)
            if isinstance(second, int):
                assert s == second, (workload, s)
            else:
                assert second[0] <= s <= second[1], (workload, s)


def test_bucketed_shapes_come_from_the_first_buckets(bench):
    for workload in bench.WORKLOADS:
        plan = bench.shapes(workload, 200, 3, "bucketed")
        first = plan[: bench.BUCKETS]
        assert set(plan) <= set(first), workload
        # Drawn from, not cycled: later steps take the buckets in another order.
        assert plan[bench.BUCKETS : 2 * bench.BUCKETS] != first, workload
