"""python/tools/record_cpu_trace.py's reading of a profiler trace (``to_csv``), over
hand-made traces: the CPU's memory events become emm's CSV, one id an address
from its allocation to its free, in the profiler's order; the CSV replays."""

import importlib.util
import json
import os

import pytest

import emm
from emm import _install

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def rec():
    path = os.path.join(ROOT, "python", "tools", "record_cpu_trace.py")
    spec = importlib.util.spec_from_file_location("record_cpu_trace", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # no PyTorch needed for to_csv
    return mod


def mem(ts, addr, nbytes, idx=0, device_type=0):
    return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
            "args": {"Addr": addr, "Bytes": nbytes, "Device Type": device_type, "Ev Idx": idx}}


def convert(rec, tmp_path, events):
    src, out = tmp_path / "trace.json", tmp_path / "trace.csv"
    src.write_text(json.dumps({"traceEvents": events}))
    n = rec.to_csv(str(src), str(out))
    return n, out.read_text().splitlines()


def test_allocations_and_frees_become_ids_in_the_profilers_order(rec, tmp_path):
    events = [
        mem(30, 0x2000, -256, idx=4),           # out of order in the file: sorted by time
        mem(10, 0x1000, 512, idx=1),
        mem(20, 0x1000, -512, idx=3),           # same time: the event number decides
        mem(20, 0x2000, 256, idx=2),
        mem(25, 0x1000, 1024, idx=5),           # the address again: a new id
        {"ph": "X", "name": "aten::add", "ts": 11, "dur": 3, "args": {}},  # not memory
    ]
    n, lines = convert(rec, tmp_path, events)
    assert n == 3
    assert lines == ["op,id,size,stream", "a,0,512,0", "a,1,256,0", "f,0,512,0",
                     "a,2,1024,0", "f,1,256,0"]


def test_gpu_events_unknown_frees_and_lost_frees(rec, tmp_path):
    events = [
        mem(1, 0x10, 4096, device_type=1),      # a GPU event: not the CPU allocator's
        mem(2, 0x20, -64),                      # a free of nothing recorded: dropped
        mem(3, 0x30, 128),
        mem(4, 0x30, 256),                      # taken again with no free reported
        mem(5, 0x30, -256),
    ]
    n, lines = convert(rec, tmp_path, events)
    assert n == 2
    assert lines == ["op,id,size,stream", "a,0,128,0", "f,0,128,0", "a,1,256,0", "f,1,256,0"]


@pytest.mark.skipif(_install.binary() is None, reason="no `emm` program in this installation (build emm-cli)")
def test_the_csv_replays(rec, tmp_path):
    events = [mem(i, 0x1000 + (i % 3) * 0x100000, (1 << 20) if i % 2 == 0 else -(1 << 20), idx=i)
              for i in range(12)]
    n, _ = convert(rec, tmp_path, events)
    doc = emm.replay(str(tmp_path / "trace.csv"), managers=["pool"], passes=2)
    assert doc["exit_status"] == 0, doc["messages"]
    t = doc["traces"][0]
    assert t["requests"] == n and t["malformed_lines"] == 0
    (pool,) = t["managers"]
    assert len(pool["passes"]) == 2 and pool["peak_live_bytes"] >= 1 << 20
