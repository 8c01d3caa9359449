"""Worker processes and emm (issue 36, item 3): a child that ``multiprocessing``
forks after emm initialised CUDA gets :class:`emm.ForkedError` from every call and
never touches the parent's pool; a child it spawns is a fresh process with a
working manager; the parent works on.

``fork`` is safe only from a single-threaded process, so each case runs in a
helper interpreter of its own (``python helper.py``), whose main thread forks or
spawns. `cargo xtask ci` runs these over emm-standin, which fails every driver
call in a forked child as the real driver does; on a GPU machine they run on the
GPU."""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import HAS_GPU, ON_STANDIN

pytestmark = [
    pytest.mark.standin,
    pytest.mark.skipif(not (ON_STANDIN or HAS_GPU),
                       reason="needs a driver: a GPU, or emm-standin through EMM_CUDA_DRIVER"),
]

HELPER = textwrap.dedent('''
    import multiprocessing as mp
    import os
    import sys

    import emm

    MIB = 1 << 20


    def forked_child(mgr, held, parent, out):
        """In a child forked after CUDA: every call is refused, typed."""
        results = {}
        for what, call in [
            ("alloc", lambda: mgr.alloc(2 * MIB)),
            ("free", lambda: mgr.free(held)),
            ("stats", mgr.stats),
            ("trim", mgr.trim),
            ("new manager", lambda: emm.Manager(None, 0)),
        ]:
            try:
                call()
                results[what] = "succeeded"
            except emm.ForkedError as e:
                text = str(e)
                ok = (e.code == 11 and f"process {os.getpid()}" in text
                      and f"process {parent}" in text and "spawn" in text)
                results[what] = "ok" if ok else f"wrong message: {text}"
            except Exception as e:  # noqa: BLE001 - reported to the parent
                results[what] = f"{type(e).__name__}: {e}"
        out.put(results)


    def spawned_child(out):
        """In a spawned child: a fresh process, a manager of its own."""
        mgr = emm.Manager(None, 0)
        p = mgr.alloc(MIB)
        mgr.free(p)
        out.put(("ok", os.getpid(), os.getppid(), mgr.stats()["allocations"]))
        mgr.close()


    def main(method):
        mgr = emm.Manager(sys.argv[2] if len(sys.argv) > 2 else None, 0)
        held = mgr.alloc(4 * MIB)
        mgr.free(mgr.alloc(2 * MIB))  # cached by the pool
        before = mgr.stats()
        ctx = mp.get_context(method)
        out = ctx.Queue()
        if method == "fork":
            child = ctx.Process(target=forked_child, args=(mgr, held, os.getpid(), out))
        else:
            child = ctx.Process(target=spawned_child, args=(out,))
        child.start()
        result = out.get(timeout=120)
        child.join(120)
        assert child.exitcode == 0, f"the child exited with {child.exitcode}"
        after = mgr.stats()
        assert after == before, f"the parent's counters moved: {before} -> {after}"
        mgr.free(mgr.alloc(8 * MIB))
        mgr.free(held)
        assert mgr.stats()["allocated_bytes"] == 0
        mgr.close()
        print("RESULT", result)


    if __name__ == "__main__":
        main(sys.argv[1])
''')


def run_helper(tmp_path, method, manager=None):
    script = tmp_path / "helper.py"
    script.write_text(HELPER)
    args = [sys.executable, str(script), method] + ([manager] if manager else [])
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert p.returncode == 0, f"helper failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, p.stdout + p.stderr
    import ast

    return ast.literal_eval(line[-1][len("RESULT "):])


@pytest.mark.parametrize("manager", ["pool", "default", "hostonly"])
def test_a_child_forked_after_cuda_gets_forked_errors_and_the_parent_goes_on(tmp_path, manager):
    results = run_helper(tmp_path, "fork", manager)
    assert results == {w: "ok" for w in ["alloc", "free", "stats", "trim", "new manager"]}, results


def test_a_spawned_child_has_a_working_manager_of_its_own(tmp_path):
    status, pid, parent, allocations = run_helper(tmp_path, "spawn")
    # A process of its own (not the helper that spawned it), with a manager of
    # its own that served its allocation.
    assert status == "ok" and pid != parent and allocations >= 1
