"""Where a profiled step's time went, from a PyTorch profiler trace (Chrome JSON).

    python3 profile_gaps.py TRACE.json [--top 15]

A step is as slow as its busiest stream lets it be, or slower when that stream
sits idle. For every GPU stream this reports its busy time (kernels, copies and
sets, overlaps merged) and the gaps in it. Each gap on a stream ends with the
device activity that follows it; that activity's launch (the runtime call with
the same correlation id) says why the stream waited:

  host late    the launch came after the gap began: the stream had nothing to do
               because the host had not asked yet. The time from the gap's start
               to the launch is charged to the innermost CPU operator around
               the launch (aten::empty, an optimizer's foreach op, a DDP hook).
  device wait  the launch came before the gap began: the work was queued but
               waited on the device, behind an event on another stream (the
               gradient all-reduce under DDP, a copy) or a host-side dependency.

It also sums the host's time in the runtime calls that wait or order
(synchronizations, synchronous copies, and stream waits on events, which queue a
wait for the device rather than block the host) per thread. Two allocators running the same steps run the
same kernels; where one's steps are longer, these figures say whether the
device worked longer (kernel time), waited on the host (host late, and which
operator), or waited on itself (device wait).
"""
import argparse
import bisect
import collections
import json
import sys

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# Runtime calls that wait (the host) or order (a stream behind an event).
BLOCKING = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
            "cudaStreamWaitEvent", "cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize")
# Gaps shorter than this are the device's own scheduling, not a wait.
MIN_GAP_US = 5.0


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def merge(intervals):
    """Sorted, non-overlapping (start, end) covering the given intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


class Ops:
    """The CPU operators of one host thread, to find the innermost one around a time."""

    def __init__(self, ops):
        self.ops = sorted(ops, key=lambda o: (o[0], -o[1]))
        self.starts = [o[0] for o in self.ops]

    def innermost(self, t):
        i = bisect.bisect_right(self.starts, t)
        best = None
        # Operators nest, so the innermost one around t is the latest-starting
        # one that still covers t; look back a bounded distance.
        for j in range(i - 1, max(-1, i - 400), -1):
            s, e, name = self.ops[j]
            if s <= t <= e:
                best = name
                break
        return best or "(no operator)"


def analyse(events, top=15):
    """The report as a dict (see the module doc); `events` is the trace's list."""
    launches = {}  # correlation id -> (ts, tid, name)
    device = collections.defaultdict(list)  # (device, stream) -> [(start, end, corr, name)]
    ops = collections.defaultdict(list)  # tid -> [(start, end, name)]
    blocking = collections.defaultdict(float)  # (tid, name) -> us
    for ev in events:
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat", "")
        args = ev.get("args") or {}
        ts, dur = float(ev.get("ts", 0)), float(ev.get("dur", 0))
        if cat in DEVICE_CATS:
            key = (args.get("device", ev.get("pid")), args.get("stream", ev.get("tid")))
            device[key].append((ts, ts + dur, args.get("correlation"), ev.get("name", "?")))
        elif cat in ("cuda_runtime", "cuda_driver"):
            if "correlation" in args:
                launches[args["correlation"]] = (ts, ev.get("tid"), ev.get("name", "?"))
            if ev.get("name") in BLOCKING:
                blocking[(ev.get("tid"), ev.get("name"))] += dur
        elif cat == "cpu_op":
            ops[ev.get("tid")].append((ts, ts + dur, ev.get("name", "?")))
    finders = {tid: Ops(v) for tid, v in ops.items()}

    streams = []
    for key, acts in sorted(device.items(), key=lambda kv: -sum(e - s for s, e, *_ in kv[1])):
        acts.sort()
        busy = merge([(s, e) for s, e, *_ in acts])
        busy_us = sum(e - s for s, e in busy)
        span = (busy[0][0], busy[-1][1])
        late = collections.defaultdict(float)
        waited = collections.defaultdict(float)
        late_us = wait_us = 0.0
        # Gaps between merged busy intervals; the activity that ends each gap is
        # the first one starting at the interval after it.
        starts = {}
        for s, e, corr, name in acts:
            starts.setdefault(s, (corr, name))
        for (s0, e0), (s1, _) in zip(busy, busy[1:]):
            gap = s1 - e0
            if gap < MIN_GAP_US:
                continue
            corr, name = starts.get(s1, (None, "?"))
            launch = launches.get(corr)
            if launch and launch[0] > e0:
                host = min(gap, launch[0] - e0)
                op = finders[launch[1]].innermost(launch[0]) if launch[1] in finders else "(no operator)"
                late[op] += host
                late_us += host
                if gap > host:
                    waited[short(name)] += gap - host
                    wait_us += gap - host
            else:
                waited[short(name)] += gap
                wait_us += gap
        streams.append({
            "device": key[0], "stream": key[1], "activities": len(acts), "busy_us": busy_us,
            "span_us": span[1] - span[0], "host_late_us": late_us, "device_wait_us": wait_us,
            "host_late_by_op": top_of(late, top), "device_wait_before": top_of(waited, top),
        })
    block = collections.defaultdict(float)
    for (tid, name), us in blocking.items():
        block[f"{name} (thread {tid})"] += us
    return {"streams": streams, "host_blocking": top_of(block, top)}


def short(name):
    return name if len(name) <= 90 else name[:87] + "..."


def top_of(d, n):
    return [(k, round(v, 1)) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n]]


def render(report, streams=3):
    """The report as text: the busiest `streams` streams, then host blocking."""
    lines = []
    for s in report["streams"][:streams]:
        lines.append(f"device {s['device']} stream {s['stream']}: {s['activities']} activities, busy "
                     f"{s['busy_us'] / 1e3:.2f} ms of a {s['span_us'] / 1e3:.2f} ms span; gaps: host late "
                     f"{s['host_late_us'] / 1e3:.2f} ms, device wait {s['device_wait_us'] / 1e3:.2f} ms")
        for title, rows in (("  host late, by the operator around the launch:", s["host_late_by_op"]),
                            ("  device wait, before:", s["device_wait_before"])):
            if rows:
                lines.append(title)
                lines.extend(f"    {us / 1e3:8.3f} ms  {name}" for name, us in rows)
    if report["host_blocking"]:
        lines.append("host time in runtime calls that wait or order:")
        lines.extend(f"  {us / 1e3:8.3f} ms  {name}" for name, us in report["host_blocking"])
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--streams", type=int, default=3)
    a = p.parse_args()
    print(render(analyse(load(a.trace), a.top), a.streams))


if __name__ == "__main__":
    sys.exit(main())
