"""emm.configure(), the one default manager, and warnings from the library.

Calls that change the process's configuration run in a child process, so the
other tests (and a GPU run of them) keep the defaults.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import emm
from conftest import HAS_GPU, ON_STANDIN


def child(code, **env):
    """Runs ``code`` in a fresh interpreter with ``env`` added; returns stdout."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("EMM_") or k == "EMM_LIBRARY"}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("kwargs, error", [
    ({"limit": -1}, ValueError), ({"limit": 2**64}, OverflowError), ({"limit": b"8G"}, TypeError),
    ({"limit": "8X"}, emm.EmmError), ({"limit": " "}, ValueError), ({"limit": "8G\0"}, ValueError),
    ({"pool_thread_cache": "1.5"}, emm.EmmError), ({"limit": 8.0}, TypeError),
    ({"pool_release_threshold": 1.5}, TypeError), ({"no_such_setting": 1}, TypeError),
    ({"expandable": "yes"}, TypeError), ({"max_pending_ratio": 1.5}, ValueError),
    ({"max_pending_ratio": True}, TypeError), ({"max_pending_count": -1}, ValueError),
    ({"release_threshold": -1}, ValueError), ({"release_threshold": "min"}, emm.EmmError),
    ({"devices": [-1]}, ValueError), ({"devices": 2**31}, OverflowError), ({"manager": 5}, TypeError),
    # The bad limit is found before the unknown manager would be.
    ({"manager": "no-such-manager", "limit": -1}, ValueError),
])
def test_arguments_are_checked_before_anything_is_applied(kwargs, error):
    with pytest.raises(error):
        emm.configure(**kwargs)


def test_a_size_given_as_text_is_refused_with_what_was_found():
    with pytest.raises(emm.EmmError) as e:
        emm.configure(pool_limit="8 gigs")
    assert e.value.code == 1 and "8 gigs" in str(e.value), e.value


@pytest.mark.standin
@pytest.mark.skipif(not ON_STANDIN, reason="the stand-in driver's device is what the limit is checked against")
def test_sizes_as_text_mean_what_the_environment_variables_mean():
    # "3M" is 3 MiB, as EMM_POOL_LIMIT=3M is: 2 MiB fits, 2 MiB more does not.
    out = child("""
        import emm
        (m,) = emm.configure(pool_limit="3M", pool_thread_cache="0", devices=[0])
        p = m.alloc(2 << 20)
        try:
            m.alloc(2 << 20)
        except emm.OutOfMemoryError as e:
            print("refused", e.requested)
        m.free(p)
        emm.configure(pool_limit="1.5GiB")  # a run-time setting: applied at once
        q = m.alloc(1 << 30)
        print("fits", q != 0)
        m.free(q)
        emm.configure(pool_limit="MAX")
    """, **{k: v for k, v in os.environ.items() if k in ("EMM_CUDA_DRIVER", "EMM_STANDIN_CAPACITY")})
    assert out.split() == ["refused", str(2 << 20), "fits", "True"], out


def test_one_setting_named_twice_is_refused():
    # `limit` is an alias of `pool_limit`: which of the two was meant is not guessed.
    with pytest.raises(TypeError, match="both set 'pool_limit'"):
        emm.configure(limit=1 << 30, pool_limit=2 << 30)
    # A keyword given as None leaves its setting alone: no second value.
    out = child("""
        import emm
        print(emm.configure(limit=None, pool_limit=1 << 30))
    """)
    assert out.strip() == "[]", out


def test_values_the_pool_refuses_at_creation_are_refused_by_configure():
    # A growth step of 0 and more stream pools than a pool has slots for were
    # taken here and refused only at the first allocation, under internal names.
    out = child("""
        import emm
        for kw in ({"pool_expand_step": 0}, {"pool_stream_pools": 100000}):
            try:
                emm.configure(pool_thread_cache=1 << 20, **kw)
            except emm.EmmError as e:
                print(e.code, str(e).split(":")[0])
        emm.configure(pool_thread_cache=2 << 20)  # nothing frozen, nothing half-applied
        print("ok")
    """)
    lines = out.splitlines()
    assert lines[0].startswith("1 ") and lines[1].startswith("1 "), out  # EMM_ERR_INVALID_ARGUMENT
    assert lines[-1] == "ok", out


@pytest.mark.standin
@pytest.mark.skipif(not (ON_STANDIN or HAS_GPU), reason="needs a driver to count devices")
def test_a_device_past_the_driver_applies_nothing():
    out = child("""
        import emm
        try:
            emm.configure(pool_thread_cache=1 << 20, devices=[0, 99])
        except ValueError as e:
            print("refused:", e)
        emm.configure(pool_thread_cache=2 << 20)  # nothing created, nothing frozen
        print("ok")
    """, **{k: v for k, v in os.environ.items() if k == "EMM_CUDA_DRIVER"})
    assert "refused: devices [99] are past the" in out and out.rstrip().endswith("ok"), out


def test_settings_are_read_from_the_library():
    by_name = {s.name: s for s in emm.settings()}
    assert list(by_name)[:3] == ["manager", "pool_limit", "pool_release_threshold"]
    limit = by_name["pool_limit"]
    assert (limit.env, limit.kind, limit.default, limit.runtime) == ("EMM_POOL_LIMIT", "bytes_or_max", "max", True)
    assert by_name["pool_expandable"].runtime is False and by_name["pool_expandable"].kind == "bool"
    for s in by_name.values():
        assert s.env.startswith("EMM_") and s.doc, s
    assert {"max_pending_deallocs_ratio", "hostonly_release_threshold", "pool_thread_cache"} <= set(by_name)


def test_an_unknown_keyword_names_the_settings():
    with pytest.raises(TypeError, match="pool_limit, pool_release_threshold|the settings are"):
        emm.configure(pool_limt=1)


def test_an_unknown_manager_is_an_emm_error():
    with pytest.raises(emm.EmmError) as e:
        emm.configure(manager="poool")
    assert e.value.code == 5 and "known managers: default, hostonly, pool" in str(e.value)


def test_every_setting_is_accepted_before_first_use_without_a_driver():
    out = child("""
        import warnings, emm
        warnings.simplefilter("error")
        got = emm.configure(manager="pool", limit=1 << 30, expandable=False, release_threshold="max",
                            max_pending_count=10, max_pending_ratio=0.25)
        print(got)
        print(emm.configure(limit=1 << 30, release_threshold=123))
        # Every setting the library declares, by its own name.
        print(emm.configure(pool_limit="max", pool_release_threshold=1 << 30, pool_exportable=True,
                            pool_legacy_merge=2, pool_thread_cache=0, pool_adopt_parked=True,
                            pool_wait_parked=False, pool_replace_pieces=8, pool_piece_share=0,
                            pool_thread_cache_largest="max", pool_thread_cache_keep=0,
                            pool_expand_step=20 << 20,
                            pool_piece_pages=8, pool_background_unmap=False,
                            pool_stream_pools=2, pool_initial_size=1 << 30,
                            hostonly_release_threshold=0,
                            max_pending_deallocs_count=3, max_pending_deallocs_ratio=0.5))
    """)
    assert out.split() == ["[]", "[]", "[]"]


def test_the_environment_overriding_a_manager_chosen_in_code_warns(monkeypatch):
    # NBEP 7: EMM_MEMORY_MANAGER wins over set_memory_manager, with a warning. The
    # warning is raised in Rust (tracing) and reaches Python's warnings module.
    monkeypatch.setenv("EMM_MEMORY_MANAGER", "default")
    with pytest.warns(emm.EmmWarning, match=r'EMM_MEMORY_MANAGER=default overrides set_memory_manager\("pool"\)'):
        emm.configure(manager="pool")


def test_the_environment_overriding_a_setting_warns():
    out = child("""
        import warnings, emm
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            emm.configure(limit=4096)
            emm.configure(limit=8192, expandable=True)
        for x in w:
            print(x.category.__name__, x.message)
    """, EMM_POOL_LIMIT="8192")
    assert "EmmWarning EMM_POOL_LIMIT=8192 overrides configure(pool_limit=4096)" in out
    assert out.count("EmmWarning") == 1, out  # the same value (and an unset variable) is quiet


def test_warnings_can_be_taken_without_raising():
    code = """
        import warnings, emm
        warnings.simplefilter("error")
        lib = emm.load()
        lib.emm_configure(b"manager", b"pool")  # straight to C: nothing drains the queue
        print(emm.take_warnings())
        print(emm.take_warnings())
    """
    out = child(code, EMM_MEMORY_MANAGER="hostonly").splitlines()
    assert out[0] == "[(2, 'EMM_MEMORY_MANAGER=hostonly overrides set_memory_manager(\"pool\")" \
        " (requested=\"pool\", environment=\"hostonly\")')]"
    assert out[1] == "[]"


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU: a manager must be created")
def test_pool_is_the_default_and_configure_after_first_use_raises():  # pragma: no cover - GPU
    out = child("""
        import emm
        m = emm.Manager()
        print(m.name)
        p = m.alloc(1 << 20); m.free(p)
        emm.configure(manager="pool", limit=None)  # the value in effect: accepted
        try:
            emm.configure(expandable=False)  # read when the pool was made
        except emm.EmmError as e:
            print(e.code)
        emm.configure(limit=1 << 20)  # a run-time setting: the pool applies it now
        try:
            m.alloc(8 << 20)
        except emm.OutOfMemoryError as e:
            print("limited" if "byte limit" in str(e) else str(e))
        emm.configure(limit="max")
        m.close()
        try:
            m.alloc(16)
        except emm.ClosedError:
            print("closed")
    """)
    assert out.split() == ["pool", "7", "limited", "closed"]
