"""python/gpu/benchmarks/profile_gaps.py, the reading of a profiler trace that says whether a
slow step's GPU stream waited on the host or on the device, over hand-made traces."""

import pytest
from conftest import load_gpu_script


@pytest.fixture(scope="module")
def gaps():
    return load_gpu_script("profile_gaps")


def kernel(ts, dur, corr, stream=7, name="k"):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
            "args": {"device": 0, "stream": stream, "correlation": corr}}


def launch(ts, corr, tid=1, name="cudaLaunchKernel", dur=2):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid,
            "args": {"correlation": corr}}


def op(ts, dur, name, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": {}}


def test_a_late_launch_is_charged_to_the_innermost_operator_around_it(gaps):
    events = [
        op(0, 1000, "aten::step"), op(150, 60, "aten::empty"),
        launch(5, 1), kernel(10, 100, 1),
        # The host reaches the next launch at 200, inside aten::empty: 90 us late.
        launch(200, 2), kernel(205, 50, 2),
    ]
    r = gaps.analyse(events)
    (s,) = r["streams"]
    assert s["busy_us"] == 150
    assert s["span_us"] == 245
    assert s["host_late_us"] == 90
    assert s["device_wait_us"] == 5  # from the launch to the kernel's start
    assert s["host_late_by_op"] == [("aten::empty", 90.0)]


def test_a_kernel_queued_early_that_starts_late_waited_on_the_device(gaps):
    events = [
        launch(0, 1), kernel(10, 100, 1, name="gemm"),
        launch(20, 2, name="cudaStreamWaitEvent"),
        launch(30, 3), kernel(400, 10, 3, name="after_allreduce"),
        kernel(150, 200, 9, stream=9, name="ncclAllReduce"),
    ]
    r = gaps.analyse(events)
    by_stream = {s["stream"]: s for s in r["streams"]}
    main = by_stream[7]
    assert main["host_late_us"] == 0
    assert main["device_wait_us"] == 290
    assert main["device_wait_before"] == [("after_allreduce", 290.0)]
    assert r["streams"][0]["stream"] == 9  # the busiest stream first
    assert ("cudaStreamWaitEvent (thread 1)", 2.0) in r["host_blocking"]


def test_overlapping_activities_merge_and_short_gaps_are_not_waits(gaps):
    events = [
        launch(0, 1), kernel(10, 100, 1), launch(1, 2), kernel(50, 100, 2),
        launch(2, 3), kernel(152, 10, 3),  # 2 us after: scheduling, not a gap
    ]
    (s,) = gaps.analyse(events)["streams"]
    assert s["busy_us"] == 150
    assert s["host_late_us"] == s["device_wait_us"] == 0
    assert "busy 0.15 ms" in gaps.render(gaps.analyse(events))
