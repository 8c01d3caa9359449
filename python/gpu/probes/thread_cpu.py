"""Which threads of a training process use the CPU: runs `benchmarks/train_bench.py`
with the arguments given, then prints each thread's CPU time (user and system, ms,
summed by thread name from /proc/self/task) and the process's wall time, as one line
`THREADS {...}` after train_bench.py's own RESULT line.

    EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so PYTHONPATH=$PWD/python \\
      python3 python/gpu/probes/thread_cpu.py --variant emm-pool --workload bert \\
      --steps 120 --warmup 6 --shapes fresh

The question it answered (run 368): whether emm's unmapping helper (`emm-unmap`)
spins on a core while it waits for a moved piece's event (the pool's events are
made without `CU_EVENT_BLOCKING_SYNC`, and a context's default scheduling spins).
"""

import json
import os
import runpy
import sys
import time

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "train_bench.py")


def thread_cpu_ms():
    """CPU time (user + system, ms) of this process's threads, summed by name."""
    tick = os.sysconf("SC_CLK_TCK")
    by_name = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                # Fields after the name (which may hold spaces) in parentheses:
                # utime and stime are the 14th and 15th of the whole line.
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that ended meanwhile
        by_name[name] = by_name.get(name, 0) + (int(fields[11]) + int(fields[12])) * 1000 // tick
    return by_name


def main():
    """Runs the bench, prints the threads' line, and returns the bench's exit
    status (the line comes however the bench ended)."""
    start = time.time()
    sys.argv = [BENCH] + sys.argv[1:]
    sys.path.insert(0, os.path.dirname(BENCH))
    status = 0
    try:
        runpy.run_path(BENCH, run_name="__main__")
    except SystemExit as e:
        status = e.code
    finally:
        t = os.times()
        print("THREADS " + json.dumps({"wall_ms": int((time.time() - start) * 1000),
                                       "proc_user_ms": int(t.user * 1000), "proc_sys_ms": int(t.system * 1000),
                                       "threads_ms": thread_cpu_ms()}), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
