"""A Dask-CUDA cluster through emm (issue 16, item 2), in one command.

A ``LocalCUDACluster`` with one worker per GPU (``protocol="tcp"``) whose workers set
``emm.dask.EmmPlugin`` up at start (``emm.dask.local_cuda_cluster``: the way
Dask-CUDA applies its RMM plugin), so CuPy (``emm.cupy.install``), Numba
(``NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin`` / ``set_memory_manager``) and, with
``--rmm``, RMM (``emm.rmm.install``) allocate through emm's pool. Then:

1. each worker's routes: CuPy's allocator is emm's, Numba's memory manager is
   ``EmmNumbaManager``, and an allocation through each framework raises emm's
   allocation count (``emm.dask.verify_routes``);
2. a ``dask.array`` of CuPy chunks from ``da.random.RandomState(RandomState=
   cupy.random.RandomState)``, float64 and float32: sum, column means, standard
   deviation and the matrix product ``x.T @ x``, each checked against NumPy on the
   same data brought to the host, and a Numba kernel (``map_blocks``) whose output
   Numba allocates;
3. emm's statistics from every worker before and after (``emm.dask.worker_stats``):
   every worker allocated through emm, CuPy's own pool stayed empty, allocated bytes
   return to the baseline once the data is released, trimming gives the cache
   back, the plugin's teardown reports, and the GPUs' used memory (NVML) returns to
   where it was once the cluster is closed;
4. registering the plugin again with the same settings is accepted; with other
   settings it is refused with a clear error;
5. the command-line path, ``LocalCUDACluster(preload=["emm.dask"])`` (as
   ``dask cuda worker --preload emm.dask`` on each node): set up at start, a
   smaller checked job through it;
6. the same timed workload on this cluster and (``--baseline``, the default) on a
   plain ``LocalCUDACluster`` (CuPy's own pool): median, min and max seconds.

Prints one PASS/FAIL line per check and a summary; exits 1 on any failure; writes
``dask_cluster.json`` (per-worker statistics, checks, timings) to ``--out`` or
``$OUT``. Usage, from the repository root on the GPU machine (``.whl/dask`` and
``gpu-bundle`` carried; ``.whl/rmm`` too for the RMM route)::

    python/gpu/checks/dask_cluster.sh            # unpacks the wheels into /tmp/site, then runs this

or by hand::

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/dask/*.whl
    PYTHONPATH=/tmp/site:$PWD/python EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so \\
        python3 python/gpu/checks/dask_cluster.py --out $OUT
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = pathlib.Path(__file__).resolve().parent
PYTHON = HERE.parents[1]  # python/, for emm

# Site rule: no NVLink multicast (NVLS) anywhere; the workers inherit these.
SITE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
MiB = 1 << 20


def prepare_environment() -> None:
    """The site's variables, and this folder plus the package on every process's
    path (worker processes inherit the environment)."""
    os.environ.update(SITE_ENV)
    paths = [str(HERE), str(PYTHON)]
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)


class Checks:
    """PASS/FAIL lines, kept for the summary and the JSON."""

    def __init__(self, quiet: bool = False) -> None:
        self.items: List[Dict[str, Any]] = []
        self.quiet = quiet

    def add(self, name: str, ok: bool, detail: str = "") -> bool:
        self.items.append({"name": name, "ok": bool(ok), "detail": detail})
        if not self.quiet or not ok:
            print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        return bool(ok)

    @property
    def failed(self) -> List[str]:
        return [c["name"] for c in self.items if not c["ok"]]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def to_host(a: Any) -> Any:
    """A CuPy-backed dask array as a NumPy-backed one (converted on the workers)."""
    import numpy as np
    import dask_tasks

    return a.map_blocks(dask_tasks.to_numpy, dtype=a.dtype, meta=np.empty((0,) * a.ndim, a.dtype))


def short(stats: Dict[str, Any]) -> Dict[str, Any]:
    """One worker's figures without the long report line."""
    s = dict(stats)
    s["devices"] = [{k: v for k, v in d.items() if k != "report"} for d in stats["devices"]]
    return s


def dev0(stats: Dict[str, Any]) -> Dict[str, Any]:
    return stats["devices"][0] if stats["devices"] else {}


def gather_stats(client: Any) -> Dict[str, Dict[str, Any]]:
    import emm.dask

    return dict(sorted(client.run(emm.dask.worker_stats).items()))


def settle(client: Any, target: Optional[Dict[str, int]] = None, timeout: float = 30.0) -> Dict[str, Dict[str, Any]]:
    """Collects garbage on the workers until each one's allocated bytes equal
    ``target`` (or stop changing); returns the last statistics."""
    deadline = time.monotonic() + timeout
    last: Optional[Dict[str, int]] = None
    while True:
        client.run(gc.collect)
        stats = gather_stats(client)
        now = {w: dev0(s).get("allocated_bytes", 0) for w, s in stats.items()}
        if (target is not None and now == target) or (target is None and now == last):
            return stats
        if time.monotonic() > deadline:
            return stats
        last = now
        time.sleep(0.25)


def workload(seed: int, n: int, k: int, chunk: int) -> Tuple[float, ...]:
    """The timed job: a float32 CuPy-backed array, its standard deviation, column
    means and Gram matrix ``x.T @ x`` (reduced to scalars on the workers)."""
    import cupy
    import dask
    import dask.array as da
    import numpy as np

    rs = da.random.RandomState(seed, RandomState=cupy.random.RandomState)
    x = rs.standard_normal((n, k), chunks=(chunk, k)).astype(np.float32)
    g = x.T @ x
    out = dask.compute(to_host(x.std()), to_host(x.mean(axis=0).sum()), to_host((g * g).sum()),
                       to_host(da.diagonal(g).sum()))
    return tuple(float(v) for v in out)


def timed(reps: int, n: int, k: int, chunk: int) -> List[float]:
    times = []
    for r in range(reps):
        t = time.perf_counter()
        workload(100 + r, n, k, chunk)
        times.append(time.perf_counter() - t)
    return times


def spread(times: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "n": len(times)}


def correctness(checks: Checks, n: int, k: int, chunk: int, seed: int, label: str = "") -> Dict[str, Any]:
    """Sum, column means, standard deviation, ``x.T @ x`` and a Numba kernel on a
    CuPy-backed array, float64 and float32, against NumPy on the same data."""
    import cupy
    import dask
    import dask.array as da
    import dask_tasks
    import numpy as np
    from distributed import wait

    rs = da.random.RandomState(seed, RandomState=cupy.random.RandomState)
    x64 = rs.standard_normal((n, k), chunks=(chunk, k)).persist()
    wait(x64)
    host = to_host(x64).compute()
    errors: Dict[str, Any] = {}
    for name, tol_sum, tol_std, tol_mm in (("float64", 1e-11, 1e-10, 1e-11), ("float32", 1e-5, 1e-4, 5e-5)):
        if name == "float64":
            x, h = x64, host
        else:
            x = x64.astype(np.float32).persist()
            wait(x)
            h = host.astype(np.float32).astype(np.float64)
        s, colmean, std, gram = dask.compute(to_host(x.sum()), to_host(x.mean(axis=0)), to_host(x.std()),
                                             to_host(x.T @ x))
        absh = np.abs(h)
        e_sum = abs(float(s) - h.sum()) / absh.sum()
        e_mean = float(np.max(np.abs(colmean - h.mean(axis=0)))) / float(np.max(absh.mean(axis=0)))
        ref_std = h.std()
        e_std = abs(float(std) - ref_std) / ref_std
        ref_gram = h.T @ h
        # Cauchy-Schwarz: every |entry| and every sum of |products| is at most the
        # largest diagonal entry, so this bounds the error relative to what is summed.
        e_gram = float(np.max(np.abs(gram - ref_gram))) / float(np.max(np.diag(ref_gram)))
        # Numba: a kernel whose output Numba allocates, on every chunk.
        a, b = 2.0, 0.5
        y = x.map_blocks(dask_tasks.numba_affine, a, b, dtype=x.dtype, meta=x._meta)
        diff, first = dask.compute(to_host(abs(y - (a * x + b)).max()), to_host(y[:chunk]))
        scale = a * float(absh.max()) + b
        e_numba_gpu = float(diff) / scale
        e_numba_host = float(np.max(np.abs(first - (a * h[:chunk] + b)))) / scale
        tol_numba = 1e-12 if name == "float64" else 1e-6
        errs = {"sum": e_sum, "colmean": e_mean, "std": e_std, "gram": e_gram,
                "numba_vs_cupy": e_numba_gpu, "numba_vs_numpy": e_numba_host}
        errors[name] = errs
        tag = f"{label}{name}"
        checks.add(f"{tag} sum vs NumPy", e_sum <= tol_sum, f"{float(s):.6g} vs {h.sum():.6g}, error {e_sum:.2e} "
                   f"of sum|x| (tolerance {tol_sum:g})")
        checks.add(f"{tag} column means vs NumPy", e_mean <= tol_sum, f"max error {e_mean:.2e} (tolerance {tol_sum:g})")
        checks.add(f"{tag} std vs NumPy", e_std <= tol_std, f"{float(std):.9g} vs {ref_std:.9g}, relative error "
                   f"{e_std:.2e} (tolerance {tol_std:g})")
        checks.add(f"{tag} x.T @ x vs NumPy", e_gram <= tol_mm, f"{gram.shape}, max error {e_gram:.2e} of the "
                   f"largest diagonal entry (tolerance {tol_mm:g})")
        checks.add(f"{tag} Numba kernel (map_blocks)", max(e_numba_gpu, e_numba_host) <= tol_numba,
                   f"vs CuPy {e_numba_gpu:.2e}, vs NumPy {e_numba_host:.2e} (tolerance {tol_numba:g})")
        del x, y
    del x64
    return errors


def gpu_used_bytes() -> Optional[int]:
    """Used memory summed over every GPU (NVML), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
        return sum(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used for i in range(n))
    except Exception:
        return None


def run_emm(args: argparse.Namespace, checks: Checks, result: Dict[str, Any], n_gpus: int) -> None:
    import emm.dask
    import dask_tasks
    from distributed import Client

    configure = {} if args.expandable == "default" else {"expandable": args.expandable == "on"}
    plugin = emm.dask.EmmPlugin("pool", numba=True, cupy=True, rmm=args.rmm_on, configure=configure)
    result["plugin"] = repr(plugin)
    log(f"starting LocalCUDACluster through emm: {plugin!r}")
    t0 = time.perf_counter()
    cluster = emm.dask.local_cuda_cluster(plugin, protocol="tcp", threads_per_worker=args.threads,
                                          dashboard_address=None)
    client = Client(cluster)
    try:
        result["emm_startup_s"] = time.perf_counter() - t0
        workers = sorted(client.scheduler_info()["workers"])
        log(f"{len(workers)} workers up in {result['emm_startup_s']:.1f} s: {workers}")
        checks.add("one worker per GPU", len(workers) == n_gpus, f"{len(workers)} workers, {n_gpus} GPUs")
        env = client.run(dask_tasks.environment, list(SITE_ENV))
        checks.add("site variables reach every worker", all(v == SITE_ENV for v in env.values()),
                   json.dumps(next(iter(env.values()))))

        stats = gather_stats(client)
        result["stats_setup"] = {w: short(s) for w, s in stats.items()}
        visible = [(s["cuda_visible_devices"] or "").split(",")[0] for s in stats.values()]
        checks.add("each worker has its own GPU", len(set(visible)) == len(visible),
                   f"first visible device per worker: {visible}")
        for w, s in stats.items():
            d = dev0(s)
            checks.add(f"{s['name']}: plugin set up at start", s["plugin"]["set_up"] and d.get("manager") == "pool"
                       and s["cupy"] == "emm" and s["numba"] == "EmmNumbaManager"
                       and (s["rmm"] == "emm" or not args.rmm_on),
                       f"manager {d.get('manager')}, CuPy allocator {s['cupy']} ({s['cupy_path']} path), Numba {s['numba']}, "
                       f"RMM {s['rmm']}, warnings {s['plugin']['warnings']}")
        routes = client.run(emm.dask.verify_routes)
        result["routes"] = routes
        for w, r in sorted(routes.items()):
            wanted = ["cupy", "numba"] + (["rmm"] if args.rmm_on else [])
            checks.add(f"{stats[w]['name']}: allocations through {', '.join(wanted)} are emm's",
                       all(r[f] is True for f in wanted), json.dumps(r))

        log("warm-up (kernels compiled, libraries' handles made)")
        warm = Checks(quiet=True)
        correctness(warm, args.rows // 4, args.cols // 2, args.chunk // 4, seed=1, label="warm-up ")
        checks.add("warm-up job correct", not warm.failed, f"{len(warm.items)} comparisons with NumPy")
        workload(99, args.time_rows // 8, args.time_cols, args.time_chunk // 8)
        base = settle(client)
        baseline = {w: dev0(s)["allocated_bytes"] for w, s in base.items()}
        result["stats_baseline"] = {w: short(s) for w, s in base.items()}
        log(f"baseline allocated bytes per worker: {baseline}")

        log(f"correctness: {args.rows} x {args.cols}, chunks of {args.chunk} rows")
        t = time.perf_counter()
        result["errors"] = correctness(checks, args.rows, args.cols, args.chunk, seed=7)
        result["correctness_s"] = time.perf_counter() - t
        after_correct = gather_stats(client)

        log(f"timing through emm: {args.reps} x workload {args.time_rows} x {args.time_cols} float32")
        times = timed(args.reps, args.time_rows, args.time_cols, args.time_chunk)
        result["times_emm"] = times
        peak = gather_stats(client)
        result["stats_peak"] = {w: short(s) for w, s in peak.items()}
        pools = client.run(dask_tasks.cupy_pool_bytes)
        result["cupy_pool_emm"] = pools
        for w, s in peak.items():
            d, b = dev0(s), dev0(base[w])
            grew = d["allocations"] - b["allocations"]
            checks.add(f"{s['name']}: its allocations went through emm",
                       grew > 0 and dev0(after_correct[w])["allocations"] > b["allocations"]
                       and pools[w]["total"] == 0 and s["numba"] == "EmmNumbaManager",
                       f"{grew} allocations by emm during the jobs, peak allocated {d['allocated_bytes_peak'] / MiB:.0f} MiB, "
                       f"peak reserved {d['reserved_bytes_peak'] / MiB:.0f} MiB; CuPy's own pool holds "
                       f"{pools[w]['total']} B; Numba's manager {s['numba']}")

        log("releasing: every allocated byte must come back")
        released = settle(client, baseline)
        result["stats_released"] = {w: short(s) for w, s in released.items()}
        for w, s in released.items():
            now = dev0(s)["allocated_bytes"]
            checks.add(f"{s['name']}: allocated bytes back to the baseline", now == baseline[w],
                       f"{now} B now, {baseline[w]} B before the jobs")
        trimmed = client.run(emm.dask.trim)
        futures = [client.submit(emm.dask.trim, workers=[w], allow_other_workers=False, pure=False) for w in workers]
        trimmed_exec = dict(zip(workers, client.gather(futures)))
        del futures
        after_trim = gather_stats(client)
        result["stats_trimmed"] = {w: short(s) for w, s in after_trim.items()}
        for w, s in after_trim.items():
            d, p = dev0(s), dev0(peak[w])
            limit = max(512 * MiB, p["reserved_bytes_peak"] // 10)
            checks.add(f"{s['name']}: trimming gives the cache back", d["reserved_bytes"] <= limit,
                       f"reserved {p['reserved_bytes'] / MiB:.0f} MiB -> {d['reserved_bytes'] / MiB:.0f} MiB "
                       f"(event loop released {sum(trimmed[w].values()) / MiB:.0f} MiB, executor thread "
                       f"{sum(trimmed_exec[w].values()) / MiB:.0f} MiB); device free {d['free'] / 2**30:.1f} GiB "
                       f"of {d['total'] / 2**30:.1f}")

        same = emm.dask.EmmPlugin("pool", numba=True, cupy=True, rmm=args.rmm_on, configure=configure)
        try:
            client.register_plugin(same)
            checks.add("registering the plugin again with the same settings is accepted", True)
        except Exception as e:
            checks.add("registering the plugin again with the same settings is accepted", False, repr(e)[:300])
        # A setting read when the manager is made (not `limit`: a run-time setting
        # every manager applies at once, so a plugin changing it is accepted).
        other = emm.dask.EmmPlugin("pool", numba=True, cupy=True, configure={**configure, "thread_cache": 64 * MiB},
                                   name="emm-other-settings")
        try:
            client.register_plugin(other)
            checks.add("other settings on a running worker are refused clearly", False, "accepted")
        except Exception as e:
            checks.add("other settings on a running worker are refused clearly",
                       "fixed at first use" in str(e), f"{type(e).__name__}: {str(e)[:160]}...")
        client.unregister_worker_plugin("emm-other-settings")

        client.unregister_worker_plugin("emm")  # the plugin's teardown: a trim and a report
        down = gather_stats(client)
        result["stats_teardown"] = {w: short(s) for w, s in down.items()}
        events = client.get_events("emm")
        result["events"] = len(events)
        for w, s in down.items():
            rep = s["plugin"]["teardown"]
            checks.add(f"{s['name']}: teardown trimmed and reported", s["plugin"]["torn_down"] and len(rep) == 1,
                       f"allocated {rep[0]['allocated_bytes'] if rep else '?'} B, reserved "
                       f"{rep[0]['reserved_bytes'] / MiB if rep else 0:.0f} MiB, {rep[0]['allocations'] if rep else '?'} "
                       f"allocations in all")
        checks.add("the scheduler holds the plugin's setup and teardown events", len(events) >= 2 * len(workers),
                   f"{len(events)} events on topic 'emm'")
    finally:
        client.close()
        cluster.close()


def run_preload(args: argparse.Namespace, checks: Checks, result: Dict[str, Any]) -> None:
    """The command-line path (``dask cuda worker --preload emm.dask``), here as
    ``LocalCUDACluster(preload=["emm.dask"])``: the workers set emm up at start
    from ``EMM_DASK_*``; a small checked job runs through it."""
    import emm.dask
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    os.environ["EMM_DASK_RMM"] = "1" if args.rmm_on else "0"
    log("starting LocalCUDACluster(preload=['emm.dask'])")
    t0 = time.perf_counter()
    cluster = LocalCUDACluster(protocol="tcp", threads_per_worker=args.threads, dashboard_address=None,
                               preload=["emm.dask"])
    client = Client(cluster)
    try:
        result["preload_startup_s"] = time.perf_counter() - t0
        stats = gather_stats(client)
        routes = client.run(emm.dask.verify_routes)
        wanted = ["cupy", "numba"] + (["rmm"] if args.rmm_on else [])
        for w, s in stats.items():
            checks.add(f"preload {s['name']}: set up at start, allocations through emm",
                       s["plugin"]["set_up"] and s["cupy"] == "emm" and all(routes[w][f] is True for f in wanted),
                       f"manager {dev0(s).get('manager')}, routes {json.dumps(routes[w])}")
        correctness(checks, args.rows // 4, args.cols // 2, args.chunk // 4, seed=3, label="preload ")
        after = gather_stats(client)
        result["stats_preload"] = {w: short(s) for w, s in after.items()}
        checks.add("preload: every worker allocated through emm",
                   all(dev0(s)["allocations"] > dev0(stats[w])["allocations"] for w, s in after.items()),
                   ", ".join(f"{s['name']}: {dev0(s)['allocations']} allocations" for s in after.values()))
    finally:
        client.close()
        cluster.close()


def run_baseline(args: argparse.Namespace, result: Dict[str, Any]) -> None:
    import dask_tasks
    from dask_cuda import LocalCUDACluster
    from distributed import Client

    log("starting a plain LocalCUDACluster (CuPy's own pool) for the timing baseline")
    t0 = time.perf_counter()
    cluster = LocalCUDACluster(protocol="tcp", threads_per_worker=args.threads, dashboard_address=None)
    client = Client(cluster)
    try:
        result["baseline_startup_s"] = time.perf_counter() - t0
        workload(99, args.time_rows // 8, args.time_cols, args.time_chunk // 8)
        log(f"timing with CuPy's pool: {args.reps} x workload")
        result["times_cupy_pool"] = timed(args.reps, args.time_rows, args.time_cols, args.time_chunk)
        result["cupy_pool_baseline"] = client.run(dask_tasks.cupy_pool_bytes)
        result["baseline_is"] = ("CuPy's default memory pool; frames received from other workers in "
                                 + ("rmm.DeviceBuffer (RMM's default resource)" if importlib.util.find_spec("rmm")
                                    else "Numba's default memory manager (numba.cuda.to_device)"))
    finally:
        client.close()
        cluster.close()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT"), help="folder for dask_cluster.json (default: $OUT)")
    p.add_argument("--rows", type=int, default=32768, help="rows of the checked array")
    p.add_argument("--cols", type=int, default=1024, help="columns of the checked array")
    p.add_argument("--chunk", type=int, default=4096, help="rows per chunk of the checked array")
    p.add_argument("--time-rows", type=int, default=262144, help="rows of the timed array")
    p.add_argument("--time-cols", type=int, default=1024, help="columns of the timed array")
    p.add_argument("--time-chunk", type=int, default=32768, help="rows per chunk of the timed array")
    p.add_argument("--reps", type=int, default=7, help="timed repetitions per cluster")
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    p.add_argument("--rmm", choices=("auto", "on", "off"), default="auto",
                   help="route RMM through emm too (auto: when emm.rmm and rmm are importable)")
    p.add_argument("--expandable", choices=("default", "on", "off"), default="default",
                   help="the pool's expandable segment (default: what emm.numba_plugin leaves: off)")
    p.add_argument("--no-preload", dest="preload", action="store_false",
                   help="skip the LocalCUDACluster(preload=['emm.dask']) check")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="skip the plain cluster (CuPy's own pool) timing")
    args = p.parse_args(argv)
    prepare_environment()
    t_start = time.perf_counter()

    import cupy
    import dask
    import distributed
    import dask_cuda
    import numpy as np
    from dask_cuda.utils import get_n_gpus

    import emm
    import emm.dask  # noqa: F401

    has_emm_rmm = importlib.util.find_spec("emm.rmm") is not None
    has_rmm = importlib.util.find_spec("rmm") is not None
    args.rmm_on = args.rmm == "on" or (args.rmm == "auto" and has_emm_rmm and has_rmm)
    versions = {"python": sys.version.split()[0], "dask": dask.__version__, "distributed": distributed.__version__,
                "dask_cuda": dask_cuda.__version__, "cupy": cupy.__version__, "numpy": np.__version__,
                "emm_library": str(emm.library_path()), "emm.rmm": has_emm_rmm, "rmm": has_rmm}
    try:
        import numba
        import numba.cuda  # noqa: F401

        versions["numba"] = numba.__version__
        try:
            from importlib import metadata as importlib_metadata

            versions["numba_cuda"] = importlib_metadata.version("numba-cuda")
        except Exception:  # numba's own CUDA target
            versions["numba_cuda"] = None
    except ImportError as e:
        versions["numba"] = f"missing: {e}"
    log("versions: " + json.dumps(versions))
    n_gpus = get_n_gpus()
    result: Dict[str, Any] = {"versions": versions, "args": {k: v for k, v in vars(args).items()},
                              "gpus": n_gpus, "site_env": SITE_ENV}
    checks = Checks()
    # The client makes its own CUDA context on the first GPU (dask builds each random
    # array's meta with a zero-size CuPy draw, through CuPy's own pool): made now, so
    # the NVML figure below includes it.
    import dask.array as da

    da.random.RandomState(0, RandomState=cupy.random.RandomState).standard_normal((2, 2), chunks=(1, 2))
    cupy.zeros(1)
    used_before = gpu_used_bytes()
    try:
        if has_rmm and not args.rmm_on:
            checks.add("arrays received from other workers allocate through emm", False,
                       "rmm is installed, so distributed deserializes received CuPy arrays into rmm.DeviceBuffer; "
                       "without emm.rmm (--rmm on) those bypass emm")
        run_emm(args, checks, result, n_gpus)
        used_after = gpu_used_bytes()
        deadline = time.monotonic() + 15
        while used_before is not None and used_after is not None and used_after > used_before + 256 * MiB \
                and time.monotonic() < deadline:
            time.sleep(0.5)  # the worker processes' contexts go with the processes
            used_after = gpu_used_bytes()
        if used_before is not None and used_after is not None:
            checks.add("GPU memory returned once the cluster closed", used_after <= used_before + 256 * MiB,
                       f"NVML used on all GPUs: {used_before / MiB:.0f} MiB before, {used_after / MiB:.0f} MiB after")
        result["gpu_used_mib"] = {"before": used_before and used_before / MiB, "after": used_after and used_after / MiB}
        if args.preload:
            run_preload(args, checks, result)
        if args.baseline:
            run_baseline(args, result)
    except Exception as e:  # a failure in the middle is a FAIL line, then the summary
        import traceback

        traceback.print_exc()
        checks.add("the run completed", False, f"{type(e).__name__}: {e}"[:500])
    result["checks"] = checks.items
    result["total_s"] = time.perf_counter() - t_start

    print("\n== summary")
    te, tb = result.get("times_emm"), result.get("times_cupy_pool")
    if te:
        se = spread(te)
        line = f"timed workload through emm: median {se['median']:.3f} s (min {se['min']:.3f}, max {se['max']:.3f}, n={se['n']})"
        if tb:
            sb = spread(tb)
            line += (f"; CuPy's own pool: median {sb['median']:.3f} s (min {sb['min']:.3f}, max {sb['max']:.3f}); "
                     f"emm/CuPy {se['median'] / sb['median']:.3f}")
        print(line)
    for w, s in sorted(result.get("stats_peak", {}).items()):
        d = dev0(s)
        print(f"worker {s['name']} (GPU {s['cuda_visible_devices'].split(',')[0] if s['cuda_visible_devices'] else '?'}):"
              f" {d.get('allocations')} allocations through emm ({d.get('manager')}), peak allocated "
              f"{d.get('allocated_bytes_peak', 0) / MiB:.0f} MiB, peak reserved {d.get('reserved_bytes_peak', 0) / MiB:.0f} MiB, "
              f"{d.get('upstream_allocs')} from the driver")
    print(f"{len(checks.items) - len(checks.failed)}/{len(checks.items)} checks passed in {result['total_s']:.0f} s")
    out = args.out
    if out:
        path = pathlib.Path(out) / "dask_cluster.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {path}")
    if checks.failed:
        print("FAIL: " + "; ".join(checks.failed))
        return 1
    print("PASS: a Dask-CUDA cluster through emm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
