"""emm.dask: importable without Dask, a clear error from EmmPlugin without
``distributed``, and the worker-side logic (setup, statistics, trim, teardown, a
conflicting configuration refused) against a driver. What changes the process's
configuration runs in a child process; CI has no Dask, so the cluster test runs
only where ``distributed`` is installed."""

import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from conftest import HAS_GPU, ON_STANDIN

HAS_DISTRIBUTED = importlib.util.find_spec("distributed") is not None
needs_driver = pytest.mark.skipif(not (ON_STANDIN or HAS_GPU),
                                  reason="needs a driver: a GPU, or emm-standin through EMM_CUDA_DRIVER")


def child(code, timeout=120):
    """Runs ``code`` in a fresh interpreter (the library, the driver and the path
    kept; other EMM_* settings dropped); returns stdout."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EMM_") or k in ("EMM_LIBRARY", "EMM_CUDA_DRIVER")}
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_importing_emm_dask_imports_no_framework():
    # `distributed` itself imports RMM where RMM is installed: emm.dask adds none.
    out = child("""
        import importlib.util, sys
        if importlib.util.find_spec("distributed"):
            import distributed
        frameworks = ("numba", "cupy", "torch", "rmm", "dask_cuda")
        before = {f for f in frameworks if f in sys.modules}
        import emm.dask
        print(sorted(f for f in frameworks if f in sys.modules and f not in before))
        print(emm.dask.__all__)
    """)
    first, second = out.splitlines()
    assert first == "[]"
    assert "EmmPlugin" in second and "worker_stats" in second


def test_the_plugin_without_distributed_says_what_is_missing():
    # In a child where `distributed` cannot be imported (None in sys.modules: its
    # import fails as if it were not installed), whether or not it is here.
    out = child("""
        import sys
        sys.modules["distributed"] = None
        import emm.dask
        try:
            emm.dask.EmmPlugin()
            print("accepted")
        except ImportError as e:
            assert "needs the `distributed` package" in str(e), e
            print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.skipif(not HAS_DISTRIBUTED, reason="needs distributed")
def test_the_plugin_is_a_worker_plugin_that_pickles():
    from distributed import WorkerPlugin

    import emm.dask

    p = emm.dask.EmmPlugin("pool", numba=False, configure={"limit": 1 << 30})
    assert isinstance(p, WorkerPlugin) and p.name == "emm" and not p.idempotent
    q = pickle.loads(pickle.dumps(p))
    assert repr(q) == repr(p) and q.configure == {"limit": 1 << 30}
    with pytest.raises(TypeError, match="EmmPlugin's own argument"):
        emm.dask.EmmPlugin(configure={"manager": "pool"})
    q.teardown(None)  # never set up: nothing to do


def test_worker_stats_before_any_setup_opens_no_manager():
    out = child("""
        import sys
        import emm, emm.dask
        s = emm.dask.worker_stats()
        assert s["devices"] == [] and not s["plugin"]["set_up"], s
        assert s["cupy"] is None and s["numba"] is None, s
        # `distributed` imports RMM where RMM is installed; emm is not its resource.
        assert s["rmm"] is None if "rmm" not in sys.modules else s["rmm"] != "emm", s
        assert emm.dask.verify_routes() == {"cupy": None, "numba": None, "rmm": None}
        assert emm.dask.trim() == {}
        emm.configure(limit=1 << 30)  # still before first use
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.standin
@needs_driver
def test_setup_stats_trim_teardown_and_a_conflict_on_a_driver():
    out = child("""
        import json, emm, emm.dask
        s = emm.dask.setup_worker("pool", numba=False, cupy=False, configure={"limit": 1 << 30})
        (d,) = s["devices"]
        assert d["device"] == 0 and d["manager"] == "pool" and d["allocations"] == 0, d
        assert s["plugin"]["set_up"] and s["plugin"]["options"]["configure"] == {"limit": 1 << 30}
        assert d["report"] and d["total"] > 0
        m = emm.Manager(None, 0)
        ptrs = [m.alloc(3 << 20) for _ in range(4)]
        (d,) = emm.dask.worker_stats()["devices"]
        assert d["allocations"] == 4 and d["allocated_bytes"] >= 12 << 20, d
        for p in ptrs:
            m.free(p)
        (d,) = emm.dask.worker_stats()["devices"]
        assert d["allocated_bytes"] == 0 and d["allocated_bytes_peak"] >= 12 << 20, d
        released = emm.dask.trim()
        assert set(released) == {0}
        # The same settings again: accepted; a run-time one (the limit) changed:
        # applied. Others: refused, saying why.
        emm.dask.setup_worker("pool", numba=False, cupy=False, configure={"limit": 1 << 30})
        emm.dask.setup_worker("pool", numba=False, cupy=False, configure={"limit": 1 << 31})
        try:
            emm.dask.setup_worker("pool", numba=False, cupy=False, configure={"expandable": False})
            raise AssertionError("a different expandable was accepted after first use")
        except RuntimeError as e:
            assert "fixed at first use" in str(e) and "client.restart()" in str(e), e
        assert emm.dask.verify_routes() == {"cupy": None, "numba": None, "rmm": None}
        (t,) = emm.dask.teardown_worker()
        s = emm.dask.worker_stats()
        assert s["plugin"]["torn_down"] and s["plugin"]["teardown"] == [t]
        assert t["allocated_bytes"] == 0 and t["reserved_bytes"] == 0, t
        json.dumps(s)  # plain data
        print("ok", t["allocations"], t["allocated_bytes_peak"])
    """)
    assert out.split()[:2] == ["ok", "4"]


@pytest.mark.standin
@needs_driver
def test_frameworks_that_are_missing_are_named():
    missing = [f for f in ("numba", "cupy") if importlib.util.find_spec(f) is None]
    if not missing:
        pytest.skip("Numba and CuPy are both installed here")
    out = child(f"""
        import emm.dask
        for f in {missing!r}:
            try:
                emm.dask.setup_worker("pool", numba=f == "numba", cupy=f == "cupy")
                raise AssertionError(f"no error without {{f}}")
            except ImportError as e:
                assert f"{{f}}=False" in str(e), e
        import importlib.util
        try:
            emm.dask.setup_worker("pool", numba=False, cupy=False, rmm=True)
        except ImportError as e:
            assert "emm.rmm needs 'rmm'" in str(e) and "emm-cuda[rmm]" in str(e), e
        else:
            assert importlib.util.find_spec("rmm") is not None, "rmm=True without RMM raised nothing"
        print("ok")
    """)
    assert out.strip() == "ok"


@pytest.mark.standin
@needs_driver
@pytest.mark.skipif(not HAS_DISTRIBUTED, reason="needs distributed")
def test_a_local_cluster_with_the_plugin():
    out = child("""
        from distributed import Client, LocalCluster
        import emm.dask

        def work(n):
            import emm
            m = emm.Manager(None, 0)
            ptrs = [m.alloc(1 << 20) for _ in range(n)]
            for p in ptrs:
                m.free(p)
            return n

        if __name__ == "__main__":
            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c, \\
                    Client(c) as client:
                client.register_plugin(emm.dask.EmmPlugin(numba=False, cupy=False, configure={"limit": 1 << 30}))
                assert sum(client.gather(client.map(work, range(1, 9)))) == 36
                stats = client.run(emm.dask.worker_stats)
                assert len(stats) == 2
                assert sum(s["devices"][0]["allocations"] for s in stats.values()) == 36, stats
                assert all(s["devices"][0]["allocated_bytes"] == 0 for s in stats.values()), stats
                try:
                    # (The limit may change while the pool serves; expandable may not.)
                    client.register_plugin(emm.dask.EmmPlugin(numba=False, cupy=False,
                                                              configure={"expandable": False}, name="other"))
                    raise AssertionError("accepted")
                except RuntimeError as e:
                    assert "fixed at first use" in str(e)
                client.unregister_worker_plugin("other")
                client.unregister_worker_plugin("emm")
                down = client.run(emm.dask.worker_stats)
                assert all(s["plugin"]["torn_down"] for s in down.values()), down
                # A worker's events reach the scheduler on its batched stream, after
                # the unregister call has returned: wait for them (up to 30 s).
                import time
                deadline = time.monotonic() + 30
                while True:
                    events = client.get_events("emm")
                    if [e[1]["action"] for e in events].count("teardown") == 2 or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)
                assert [e[1]["action"] for e in events].count("teardown") == 2, events
                print("ok")
    """, timeout=180)
    assert out.strip().endswith("ok")


@pytest.mark.standin
@needs_driver
@pytest.mark.skipif(not HAS_DISTRIBUTED, reason="needs distributed")
def test_the_preload_sets_the_plugin_up_at_worker_start():
    out = child("""
        import os
        os.environ.update(EMM_DASK_NUMBA="0", EMM_DASK_CUPY="0", EMM_POOL_LIMIT=str(1 << 30))
        from distributed import Client, LocalCluster
        import emm.dask

        def plugins(dask_worker):
            return sorted(dask_worker.plugins)

        if __name__ == "__main__":
            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                              preload=["emm.dask"], preload_argv=["--ignored"]) as c, Client(c) as client:
                stats = client.run(emm.dask.worker_stats)
                assert all(s["plugin"]["set_up"] and s["devices"][0]["manager"] == "pool" for s in stats.values())
                assert all(s["plugin"]["options"]["numba"] is False for s in stats.values()), stats
                assert all("emm" in p for p in client.run(plugins).values())
                print("ok")
    """, timeout=180)
    assert out.strip().endswith("ok")


def test_plugin_from_env_reads_its_flags(monkeypatch):
    if not HAS_DISTRIBUTED:
        pytest.skip("needs distributed")
    import emm.dask

    monkeypatch.setenv("EMM_DASK_NUMBA", "0")
    monkeypatch.setenv("EMM_DASK_RMM", "yes")
    monkeypatch.delenv("EMM_DASK_CUPY", raising=False)
    p = emm.dask.plugin_from_env()
    assert (p.manager, p.numba, p.cupy, p.rmm) == (None, False, True, True)
    monkeypatch.setenv("EMM_DASK_CUPY", "maybe")
    with pytest.raises(ValueError, match="EMM_DASK_CUPY"):
        emm.dask.plugin_from_env()
