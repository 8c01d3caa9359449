"""The NBEP 7 plugin's IPC across processes on a GPU: a device array in the pool's
expandable segment (the plugin keeps it on) and one in a small segment, each
exported with Numba's ``get_ipc_handle``, pickled to a spawned child that opens it,
checks the parent's bytes, writes its own, and closes it; the parent then checks
the child's bytes. Prints one line per array and ``numba_ipc_check: OK``.

    NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin PYTHONPATH=python python3 python/gpu/checks/numba_ipc_check.py
"""
import multiprocessing as mp
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
os.environ.setdefault("NUMBA_CUDA_MEMORY_MANAGER", "emm.numba_plugin")


def child(handle, n, q):
    try:
        import numpy as np
        from numba import cuda

        import emm.numba_plugin  # noqa: F401

        with handle as darr:
            got = darr.copy_to_host()
            ok = bool((got == np.arange(n, dtype=np.float32)).all())
            darr.copy_to_device(np.full(n, 7.0, dtype=np.float32))
            cuda.synchronize()
        q.put(("ok" if ok else "wrong bytes in the child", type(handle).__name__))
    except Exception as e:  # reported to the parent
        q.put((f"{type(e).__name__}: {e}", type(handle).__name__))


def main():
    import numpy as np
    from numba import cuda

    import emm.numba_plugin

    ctx = cuda.current_context()
    assert isinstance(ctx.memory_manager, emm.numba_plugin.EmmNumbaManager)
    mp.set_start_method("spawn")
    failures = 0
    for n in (16 << 20, 1 << 10):  # 64 MiB: the expandable segment; 4 KiB: a small segment
        host = np.arange(n, dtype=np.float32)
        darr = cuda.to_device(host)
        handle = darr.get_ipc_handle()
        q = mp.Queue()
        p = mp.Process(target=child, args=(handle, n, q))
        p.start()
        verdict, kind = q.get(timeout=120)
        p.join(timeout=60)
        back = darr.copy_to_host()
        wrote = bool((back == 7.0).all())
        ok = verdict == "ok" and wrote and p.exitcode == 0
        failures += not ok
        print(f"{n * 4:>10} bytes  handle {kind:<16} child: {verdict}; parent sees the child's write: {wrote}")
    print("numba_ipc_check: " + ("OK" if failures == 0 else f"FAILED ({failures})"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
