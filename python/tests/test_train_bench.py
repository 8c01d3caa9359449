"""python/gpu/benchmarks/train_bench.py's per-step shapes and steps: every workload
has its own of each, every variant of a workload sees the same sequence of shapes
and data (the rounds compare steps of the same index), and only training
workloads step an optimizer. The steps run over a recording stand-in for torch:
nothing here needs PyTorch or a GPU."""

import re
import sys

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


def test_every_workload_has_its_own_step(bench):
    assert set(bench.STEPS) == set(bench.WORKLOADS)


def fake_torch(workload):
    """A stand-in for torch and the model: every call is recorded, nothing runs."""
    from unittest import mock

    torch = mock.MagicMock(name="torch")
    model = mock.MagicMock(name="model")
    if workload == "detect-infer":
        model.return_value = [{"boxes": [1, 2]}, {"boxes": [3]}]
    if workload == "detect-train":
        model.return_value = {"classifier": model.loss_a, "masks": model.loss_b}
        grid = torch.arange.return_value.view.return_value
        grid.__ge__.return_value = mock.MagicMock(name="ge")
        grid.__lt__.return_value = mock.MagicMock(name="lt")
    return torch, model


@pytest.mark.parametrize("seed", [0, 4])
def test_steps_train_or_serve_as_their_workload_says(bench, monkeypatch, seed):
    """A serving workload never touches the optimizer; a training one runs the
    backward pass of the loss it returns and one optimizer step. Every random
    batch comes from the run's CUDA generator on its device, so every variant
    gets the same data."""
    from unittest import mock

    for workload in bench.WORKLOADS:
        for i, (b, s) in enumerate(bench.shapes(workload, 3, seed)):
            torch, model = fake_torch(workload)
            monkeypatch.setitem(sys.modules, "torch", torch)
            gen, opt = mock.MagicMock(name="gen"), mock.MagicMock(name="opt")
            run = bench.Run(workload=workload, model=model, gen=gen, dev="cuda:1", seed=seed)
            out = bench.run_step(run, opt, i, b, s)
            if workload in bench.SERVING:
                assert opt.mock_calls == [], workload
            else:
                assert opt.mock_calls == [mock.call.zero_grad(set_to_none=True), mock.call.step()], workload
                out.backward.assert_called_once_with()
            draws = [c for c in torch.mock_calls if c[0] in ("randn", "rand", "randint")]
            assert draws, workload
            for name, args, kwargs in draws:
                assert kwargs.get("generator") is gen and kwargs.get("device") == "cuda:1", (workload, name)
            assert model.called or model.generate.called, workload


def test_every_workload_builds_its_own_model(bench, monkeypatch):
    """`build` names each workload (a workload it does not name is refused, not
    built as another's model), with random weights: nothing is downloaded."""
    from unittest import mock

    made = {}
    for workload in bench.WORKLOADS:
        libs = {name: mock.MagicMock(name=name) for name in ("torch", "transformers", "torchvision")}
        for name, lib in libs.items():
            monkeypatch.setitem(sys.modules, name, lib)
        bench.build(workload, "cuda:0")
        calls = [re.sub(r" id='\d+'", "", str(c))
                 for name in ("transformers", "torchvision") for c in libs[name].mock_calls]
        assert calls, workload
        # torchvision's constructors (not what is called on what they return).
        constructors = [c for c in calls if c.startswith("call.models.") and "()." not in c]
        assert all("weights=None" in c for c in constructors), (workload, constructors)
        made[workload] = calls
    # gpt2, gpt2-infer and gpt2-beam share one model; every other workload has its own.
    assert made["gpt2"] == made["gpt2-infer"] == made["gpt2-beam"]
    others = [tuple(c) for w, c in made.items() if w not in ("gpt2-infer", "gpt2-beam")]
    assert len(set(others)) == len(others)
    with pytest.raises(SystemExit, match="no model"):
        bench.build("no-such-workload", "cuda:0")
