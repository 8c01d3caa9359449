"""The pool without virtual memory with and without a home segment
(``EMM_POOL_INITIAL_SIZE``), over every trace ``legacy_steady.rs`` lists (issue
33, item 4). Runs ``emm replay`` over the host stand-in, so no GPU is needed.

    python3 python/gpu/benchmarks/home_sizes.py [--passes 10] [--factor 1.15]
                                                [--bisect] [--emm target/release/emm]
                                                [--traces NAME ...]

Per trace: peak reserved over peak live after ``--passes`` passes of the path's
default (``EMM_POOL_EXPANDABLE=0``), then with a home of ``--factor`` times the
peak live bytes of a first pass (what a user sets from a previous run) and the
driver allocations of all passes; with ``--bisect``, the smallest factor whose
home holds every pass without another segment, as ``emm replay --initial-size``
finds it. ``--traces``: only the traces whose file name contains one of the
names. On a GPU machine ``emm replay`` replays on the device (``--emm
gpu-bundle/emm``), with real ``cuMemAlloc`` segments; the last lines name
the backend the replays ran on (``gpu`` or ``host``).
"""
import argparse
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PAGE = 2 << 20


def traces():
    src = open(os.path.join(ROOT, "crates/emm-trace/tests/legacy_steady.rs")).read()
    return re.findall(r'\(\s*"([^"]+\.(?:csv|pickle))",\s*(?:None|Some\([\d.]+\))', src)


def replay(emm, path, passes, extra, flags=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMM_POOL_")}
    env.update({"EMM_POOL_EXPANDABLE": "0"}, **extra)
    out = subprocess.run([emm, "replay", os.path.join(ROOT, "crates", path), "-m", "pool",
                          "--passes", str(passes), "--json", *flags],
                         capture_output=True, text=True, env=env, check=True)
    doc = json.loads(out.stdout)
    return doc["backend"], doc["traces"][0]


def one(args, path):
    backend, default = replay(args.emm, path, args.passes, {},
                              ["--initial-size"] if args.bisect else [])
    ps = default["managers"][0]["passes"]
    live = ps[0]["peak_live_bytes"]
    base = max(p["peak_reserved_bytes"] for p in ps) / live
    size = int(live * args.factor) // PAGE * PAGE
    ps = replay(args.emm, path, args.passes, {"EMM_POOL_INITIAL_SIZE": str(size)})[1]["managers"][0]["passes"]
    ratio = max(p["peak_reserved_bytes"] for p in ps) / live
    allocs = sum(p["driver"]["allocs"] for p in ps)
    smallest = (default.get("initial_size") or {}).get("over_live")
    return os.path.basename(path), base, ratio, allocs, smallest, backend


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--passes", type=int, default=10)
    p.add_argument("--factor", type=float, default=1.15)
    p.add_argument("--bisect", action="store_true")
    p.add_argument("--emm", default=os.path.join(ROOT, "target/release/emm"))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--traces", nargs="+", metavar="NAME",
                   help="only the traces whose file name contains one of these")
    args = p.parse_args()
    chosen = [t for t in traces()
              if not args.traces or any(n in os.path.basename(t) for n in args.traces)]
    if not chosen:
        p.error(f"no trace of legacy_steady.rs matches {args.traces}")
    with ThreadPoolExecutor(args.jobs) as ex:
        rows = list(ex.map(lambda t: one(args, t), chosen))
    print(f"{'trace':36s} {'default':>8s} {'home':>7s} {'driver':>6s} {'smallest':>8s}")
    for name, base, ratio, allocs, smallest, _ in rows:
        s = f"{smallest:.3f}" if smallest else "-"
        print(f"{name:36s} {base:8.3f} {ratio:7.3f} {allocs:6d} {s:>8s}")
    n = len(rows)
    print(f"mean {sum(r[1] for r in rows) / n:.4f} default, {sum(r[2] for r in rows) / n:.4f} "
          f"with a home of {args.factor}x; within 1.15x: {sum(r[1] <= 1.15 for r in rows)} and "
          f"{sum(r[2] <= 1.15 for r in rows)} of {n}")
    print(f"emm replay's backend: {', '.join(sorted({r[5] for r in rows}))}")
    found = [r[4] for r in rows if r[4]]
    if found:
        print(f"smallest home: mean {sum(found) / len(found):.4f}, most {max(found):.3f} "
              f"({len(found)} of {n} found)")


if __name__ == "__main__":
    main()
