"""GPU check of the Python bindings' configuration and errors (issue 13): the
default manager is the pool, configure() after first use raises (but for run-time
settings, which apply at once), out of memory is
an OutOfMemoryError with requested/free/total, a closed handle raises.

    EMM_LIBRARY=.../libemm_capi.so PYTHONPATH=python python3 python/gpu/checks/config_check.py
"""

import emm


def main() -> None:
    """Runs the checks; raises on the first that fails."""
    emm.configure(expandable=True)  # before first use: accepted
    m = emm.Manager()
    assert m.name == "pool", m.name
    p = m.alloc(1 << 20)
    m.free(p)
    emm.configure(manager="pool", expandable=True)  # the values in effect: accepted
    try:
        emm.configure(thread_cache=1 << 20)  # read when the pool was made
        raise SystemExit("configure(thread_cache=...) after first use did not raise")
    except emm.EmmError as e:
        assert e.code == 7, e
        print("configure after first use:", e)
    emm.configure(limit=64 << 20)  # a run-time setting: applied at once
    try:
        m.alloc(128 << 20)
        raise SystemExit("a 128 MiB allocation passed a 64 MiB limit set at run time")
    except emm.OutOfMemoryError as e:
        print("limit set at run time:", e)
    emm.configure(limit="max")
    free, total = m.memory_info()
    try:
        m.alloc(total * 4)
        raise SystemExit("allocating 4x the device did not raise")
    except emm.OutOfMemoryError as e:
        assert isinstance(e, MemoryError)
        assert e.requested == total * 4 and e.total > 0, (e.requested, e.free, e.total)
        print(f"out of memory: requested={e.requested} free={e.free} total={e.total}: {e}")
    m2 = emm.Manager()
    m2.close()
    try:
        m2.alloc(16)
        raise SystemExit("alloc on a closed manager did not raise")
    except emm.ClosedError as e:
        print("closed:", e)
    p = m.alloc(256)  # the shared manager still serves through the first handle
    m.free(p)
    print("config_check: ok")


if __name__ == "__main__":
    main()
