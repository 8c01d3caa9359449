"""python/gpu/probes/thread_cpu.py: each thread's CPU time, by name, from /proc."""

import sys
import time

import pytest
from conftest import load_gpu_script


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_the_cpu_a_thread_burns_shows_under_its_name():
    probe = load_gpu_script("thread_cpu")
    with open("/proc/self/comm") as f:
        me = f.read().strip()
    before = probe.thread_cpu_ms()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    after = probe.thread_cpu_ms()
    assert me in after, "the main thread is listed under its name"
    assert after[me] - before.get(me, 0) >= 200, "0.3 s of CPU burnt on it shows (ticks of 10 ms)"


def test_the_probe_runs_the_bench_and_reports_even_when_it_exits(capsys, monkeypatch):
    probe = load_gpu_script("thread_cpu")
    monkeypatch.setattr(sys, "argv", ["thread_cpu.py", "--help"])
    assert probe.main() == 0  # train_bench.py --help exits; the probe still reports
    out = capsys.readouterr().out
    assert "--variant" in out
    assert out.strip().splitlines()[-1].startswith("THREADS {")
    # A bench that fails gives its status back, after the threads' line.
    monkeypatch.setattr(sys, "argv", ["thread_cpu.py", "--variant", "no-such-variant"])
    assert probe.main() == 2
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("THREADS {")
