"""emm's own PyTorch allocator object without PyTorch or a GPU: its C++ source
agrees with include/emm.h, building it fails with a reason that says which step
(no headers, no compiler, a failed compile) and leaves nothing half-written behind,
a built library is reused, and ``emm.torch.install`` falls back to PyTorch's
pluggable allocator with a warning (or raises, or skips the attempt, as asked).
The object itself runs on the GPU machine: python/gpu/checks/torch_native_check.py."""

import pathlib
import re
import sys
import types
import warnings

import pytest

import emm
import emm.torch as et
from emm import _torch_native as tn
from emm import _torch_state as ets

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEADER = ROOT / "crates" / "emm-capi" / "include" / "emm.h"


def _params(decl: str) -> list:
    """The parameter types of a C declaration's parameter list, names dropped."""
    out = []
    for p in decl.split(","):
        p = re.sub(r"\s+", " ", p.replace("*", " * ")).strip()
        words = p.split(" ")
        out.append(" ".join(words[:-1]).replace(" *", "*"))
    return out


def _struct_fields() -> list:
    """``(alias, field)`` of each member of the source's ``EmmFunctions``, in order."""
    src = tn.SOURCE.read_text()
    body = re.search(r"struct EmmFunctions \{([^}]*)\};", src)
    assert body, f"struct EmmFunctions is not in {tn.SOURCE}"
    return re.findall(r"(\w+) (\w+);", body.group(1))


def test_the_functions_table_is_the_sources_struct():
    assert [f for _, f in _struct_fields()] == [f for f, _ in tn.FUNCTIONS]
    assert [f for f, _ in tn.Functions._fields_] == [f for f, _ in tn.FUNCTIONS]


@pytest.mark.parametrize("field,function", tn.FUNCTIONS)
def test_the_sources_function_types_are_the_headers(field, function):
    alias = dict((f, a) for a, f in _struct_fields())[field]
    header = HEADER.read_text()
    m = re.search(r"\n(\w[\w\s\*]*?)\s*\*?\s*\b" + function + r"\(([^)]*)\);", header)
    assert m, f"{function} is not declared in {HEADER}"
    h_ret = m.group(0).split(function)[0].strip().replace(" *", "*")
    src = tn.SOURCE.read_text()
    s = re.search(r"using " + alias + r" = ([\w\s\*]+?)\s*\(\*\)\(([^)]*)\);", src)
    assert s, f"{alias} is not in {tn.SOURCE}"
    s_ret = s.group(1).strip().replace(" *", "*")
    norm = {"emm_status": "int"}
    assert norm.get(h_ret, h_ret).replace(" ", "") == s_ret.replace(" ", ""), (h_ret, s_ret)
    assert _params(m.group(2)) == _params(s.group(2)), (m.group(2), s.group(2))


def fake_torch(tmp_path: pathlib.Path, headers: bool = True) -> types.SimpleNamespace:
    """A stand-in for the ``torch`` module with the layout of a PyTorch install."""
    pkg = tmp_path / "torch"
    inc = pkg / "include" / "torch" / "csrc" / "cuda"
    inc.mkdir(parents=True)
    if headers:
        (inc / "CUDAPluggableAllocator.h").write_text("#pragma once\n")
    cuda = tmp_path / "cuda" / "include"
    cuda.mkdir(parents=True)
    (cuda / "cuda_runtime_api.h").write_text("#pragma once\n")
    (pkg / "lib").mkdir()
    return types.SimpleNamespace(
        __file__=str(pkg / "__init__.py"), __version__="2.99.0+test",
        version=types.SimpleNamespace(cuda="13.0"),
        _C=types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True),
        _cuda_include=str(cuda),
    )


def counting_compiler(tmp_path, monkeypatch, seconds=0.0):
    """Makes ``CXX`` a stand-in compiler that takes ``seconds``, writes the output
    file (the argument after ``-o``) and appends an ``x`` to the returned log per
    call."""
    compiler = tmp_path / "cxx"
    log = tmp_path / "calls"
    compiler.write_text(
        "#!/bin/sh\necho x >> " + str(log) + f"\nsleep {seconds}\n"
        "while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then shift; echo lib > \"$1\"; fi; shift; done\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    return log


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("EMM_CACHE_DIR", str(d))
    monkeypatch.setattr(tn, "_cuda_includes", lambda torch: [torch._cuda_include])
    return d


def test_missing_headers_say_where_they_were_looked_for(tmp_path, cache):
    torch = fake_torch(tmp_path, headers=False)
    with pytest.raises(tn.NativeUnavailable, match="CUDAPluggableAllocator.h"):
        tn.build(torch)


def test_a_missing_compiler_is_named(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(tn.NativeUnavailable, match=r"no C\+\+ compiler.*no-such-compiler"):
        tn.build(fake_torch(tmp_path))


def test_a_failed_compile_leaves_nothing_behind(tmp_path, cache, monkeypatch):
    compiler = tmp_path / "cxx"
    compiler.write_text("#!/bin/sh\necho 'error: this compiler refuses' >&2\nexit 3\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    with pytest.raises(tn.NativeUnavailable, match=r"exit 3.*this compiler refuses"):
        tn.build(fake_torch(tmp_path))
    assert [p.name for p in (cache / "torch-native").iterdir() if p.suffix != ".lock"] == []


def test_the_command_builds_against_the_torch_given(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("CXX", sys.executable)  # any program on PATH
    torch = fake_torch(tmp_path)
    cmd = tn.compile_command(torch, tmp_path / "out.so")
    base = pathlib.Path(torch.__file__).parent
    assert cmd[0] == sys.executable
    assert f"-I{base / 'include'}" in cmd and f"-I{torch._cuda_include}" in cmd
    assert f"-L{base / 'lib'}" in cmd and f"-Wl,-rpath,{base / 'lib'}" in cmd
    assert "-D_GLIBCXX_USE_CXX11_ABI=1" in cmd
    assert {"-ltorch_cuda", "-lc10_cuda", "-lc10"} <= set(cmd)
    assert str(tn.SOURCE) in cmd and cmd[cmd.index("-o") + 1] == str(tmp_path / "out.so")


def test_a_built_library_is_reused_and_a_new_torch_builds_again(tmp_path, cache, monkeypatch):
    log = counting_compiler(tmp_path, monkeypatch)
    torch = fake_torch(tmp_path)
    first = tn.build(torch)
    assert first.is_file() and first.parent == cache / "torch-native"
    assert tn.build(torch) == first
    assert log.read_text().count("x") == 1, "the cached library is reused"
    torch.__version__ = "3.0.0+test"
    second = tn.build(torch)
    assert second != first and log.read_text().count("x") == 2


class _Recorder:
    """A stand-in for ``torch`` that records which allocator was installed."""

    def __init__(self):
        self.changed = []
        rec = self

        class Pluggable:
            def __init__(self, path, alloc, free):
                self.names = (path, alloc, free)

        class Tensor:
            def record_stream(self, stream):
                pass

        def change(alloc):
            rec.changed.append(alloc.names)

        def pytorchs(name):
            def tool(*args, **kwargs):
                raise AssertionError(f"PyTorch's own {name} was called")
            tool.__doc__ = f"PyTorch's {name}."
            return tool

        class CUDAGraph:
            def capture_begin(self, pool=None):
                rec.captures.append(pool)

        class graph:  # noqa: N801 (PyTorch's name)
            def __enter__(self):
                rec.captures.append("enter")

        self.captures = []
        self.Tensor = Tensor
        self.cuda = types.SimpleNamespace(
            CUDAGraph=CUDAGraph,
            graph=graph,
            is_initialized=lambda: True,
            use_mem_pool=pytorchs("use_mem_pool"),
            current_device=lambda: 0,
            memory_snapshot=pytorchs("memory_snapshot"),
            empty_cache=pytorchs("empty_cache"),
            memory=types.SimpleNamespace(
                CUDAPluggableAllocator=Pluggable, change_current_allocator=change,
                _get_current_allocator=lambda: "current",
                _record_memory_history=pytorchs("_record_memory_history"),
                _snapshot=pytorchs("_snapshot"), memory_snapshot=pytorchs("memory_snapshot"),
                memory_stats_as_nested_dict=pytorchs("memory_stats_as_nested_dict"),
                reset_peak_memory_stats=pytorchs("reset_peak_memory_stats"),
                reset_accumulated_memory_stats=pytorchs("reset_accumulated_memory_stats"),
                empty_cache=pytorchs("empty_cache"), use_mem_pool=pytorchs("use_mem_pool")))


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    monkeypatch.setitem(sys.modules, "torch", rec)
    monkeypatch.setattr(et, "_INSTALLED", None)
    monkeypatch.delenv("EMM_TORCH_NATIVE", raising=False)
    return rec


def test_install_falls_back_to_the_pluggable_allocator_and_says_why(recorder, monkeypatch):
    def unavailable(torch, lib):
        raise tn.NativeUnavailable("no C++ compiler: `c++` is not on PATH")

    monkeypatch.setattr(tn, "install", unavailable)
    with pytest.warns(emm.EmmWarning, match="unavailable.*no C\\+\\+ compiler.*CUDAPluggableAllocator"):
        assert et.install() == "current"
    assert et.installed() == "pluggable"
    assert recorder.changed == [(str(emm.library_path()), "emm_torch_alloc", "emm_torch_free")]


def test_a_refusal_by_pytorch_is_raised_without_trying_the_pluggable_path(recorder, monkeypatch):
    def refused(torch, lib):
        raise tn.Refused("PyTorch refused emm's allocator: Can't swap an already initialized allocator")

    monkeypatch.setattr(tn, "install", refused)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(tn.Refused, match="already initialized"):
            et.install()
    assert recorder.changed == [] and et.installed() is None


def test_a_second_install_returns_the_first(recorder, monkeypatch):
    calls = []
    monkeypatch.setattr(tn, "install", lambda torch, lib: calls.append(1))
    assert et.install() == "current" and et.install() == "current"
    assert calls == [1] and et.installed() == "native"


def test_an_unwritable_cache_is_a_reason_not_a_crash(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("CXX", sys.executable)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(cache))

    monkeypatch.setattr(tn.tempfile, "mkstemp", refuse)
    with pytest.raises(tn.NativeUnavailable, match="Permission denied"):
        tn.build(fake_torch(tmp_path))


def test_install_native_true_raises_instead(recorder, monkeypatch):
    def unavailable(torch, lib):
        raise tn.NativeUnavailable("PyTorch refused emm's allocator: already initialized")

    monkeypatch.setattr(tn, "install", unavailable)
    with pytest.raises(tn.NativeUnavailable, match="already initialized"):
        et.install(native=True)
    assert recorder.changed == [] and et.installed() is None


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_pluggable_allocator_can_be_asked_for(recorder, monkeypatch, how):
    def must_not_run(torch, lib):
        raise AssertionError("the native object was attempted")

    monkeypatch.setattr(tn, "install", must_not_run)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if how == "argument":
            et.install(native=False)
        else:
            monkeypatch.setenv("EMM_TORCH_NATIVE", "0")
            et.install()
    assert et.installed() == "pluggable" and len(recorder.changed) == 1


def test_install_uses_the_native_object_when_it_builds(recorder, monkeypatch):
    seen = []
    monkeypatch.setattr(tn, "install", lambda torch, lib: seen.append((torch, lib)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert et.install() == "current"
    assert et.installed() == "native"
    assert recorder.changed == [], "PyTorch's pluggable allocator was not made"
    assert seen and seen[0][0] is recorder


def test_the_source_ships_with_the_package():
    assert tn.SOURCE.is_file()
    assert tn.SOURCE.parent == pathlib.Path(et.__file__).parent
    assert "emm_torch_native_install" in tn.SOURCE.read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert "_torch_native.cpp" in pyproject, "package data must list the C++ source"


def test_record_stream_is_routed_only_for_pytorchs_pluggable_object(recorder, monkeypatch):
    original = recorder.Tensor.record_stream
    monkeypatch.setattr(tn, "install", lambda torch, lib: None)
    et.install()
    assert recorder.Tensor.record_stream is original, "emm's object takes recordStream in C++"

    monkeypatch.setattr(et, "_INSTALLED", None)
    monkeypatch.setattr(tn, "install", lambda torch, lib: (_ for _ in ()).throw(tn.NativeUnavailable("x")))
    with pytest.warns(emm.EmmWarning):
        et.install()
    assert getattr(recorder.Tensor.record_stream, "_emm_routed", False)


class _History:
    """A stand-in for a device's manager: what the history tools ask of it."""

    def __init__(self, device):
        self.device, self.name, self.asked = device, "pool", []

    def record_history(self, n):
        self.asked.append(n)

    def snapshot(self):
        seg = {"address": 4096, "total_size": 1024, "stream": 0, "large": True, "expandable": False,
               "blocks": [{"address": 4096, "size": 512, "requested_size": 500, "allocated": 1}]}
        return {"segments": [seg], "trace": [
            {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 7}]}


@pytest.mark.parametrize("kind", ["native", "pluggable"])
def test_pytorchs_history_tools_reach_emms_history(recorder, monkeypatch, kind):
    managers = {}
    monkeypatch.setattr(ets, "manager", lambda d=None: managers.setdefault(
        ets.device_index(d), _History(ets.device_index(d))))
    monkeypatch.setattr(tn, "install", lambda torch, lib: None)
    et.install(native=kind == "native")
    memory = recorder.cuda.memory

    memory._record_memory_history(max_entries=5, context="all", stacks="python")
    memory._record_memory_history("state", device=1)
    memory._record_memory_history(enabled=None)
    assert managers[0].asked == [5, 0] and managers[1].asked == [sys.maxsize]
    memory._record_memory_history("all", "all", "all", 7, 1)  # PyTorch's positional order
    memory._record_memory_history("all", max_entries=8, device=1, clear_history=True)
    memory._record_memory_history(True, trace_alloc_max_entries=9)  # PyTorch's older form
    memory._record_memory_history(False)
    assert managers[1].asked == [sys.maxsize, 7, 0, 8] and managers[0].asked == [5, 0, 9, 0]

    snap = memory._snapshot()
    assert snap["segments"][0]["blocks"][0]["state"] == "active_allocated"
    assert snap["device_traces"] == [[{"action": "alloc", "addr": 4096, "size": 512, "stream": 0,
                                       "time_us": 7, "frames": []}]]
    assert recorder.cuda.memory_snapshot() == memory.memory_snapshot() == snap["segments"]
    assert memory._snapshot._emm_original.__doc__ == "PyTorch's _snapshot."
    assert "PyTorch's _snapshot." in memory._snapshot.__doc__

    routed = memory._snapshot
    from emm import _torch_routes

    _torch_routes.route_memory_history(recorder)
    assert memory._snapshot is routed, "routing twice wraps once"


def test_graph_capture_is_refused_under_pytorchs_pluggable_object(recorder, monkeypatch):
    monkeypatch.setattr(tn, "install", lambda torch, lib: (_ for _ in ()).throw(tn.NativeUnavailable("x")))
    with pytest.warns(emm.EmmWarning):
        et.install()
    cuda = recorder.cuda
    for call in (lambda: cuda.graph().__enter__(), lambda: cuda.CUDAGraph().capture_begin(),
                 lambda: cuda.memory.use_mem_pool("pool"), lambda: cuda.use_mem_pool("pool")):
        with pytest.raises(RuntimeError, match="private memory pools for CUDA graphs"):
            call()
    assert recorder.captures == [], "a capture went ahead"
    cuda.CUDAGraph.capture_begin._emm_original(cuda.CUDAGraph(), "p")
    assert recorder.captures == ["p"], "PyTorch's own capture_begin is kept"


def test_emms_object_leaves_graph_capture_to_its_own_pools(recorder, monkeypatch):
    originals = (recorder.cuda.graph.__enter__, recorder.cuda.CUDAGraph.capture_begin)
    monkeypatch.setattr(tn, "install", lambda torch, lib: None)
    et.install()
    assert (recorder.cuda.graph.__enter__, recorder.cuda.CUDAGraph.capture_begin) == originals
    src = tn.SOURCE.read_text()
    for hook in ("beginAllocateToPool", "endAllocateToPool", "releasePool"):
        assert re.search(r"void " + hook + r"\([^;{]*\) override", src), f"{hook} is not overridden"
    assert "kNoGraphPools" not in src


def test_builds_at_once_compile_once(tmp_path, cache, monkeypatch):
    log = counting_compiler(tmp_path, monkeypatch, seconds=0.5)
    torch = fake_torch(tmp_path)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        built = list(pool.map(lambda _: tn.build(torch), range(4)))
    assert len(set(built)) == 1 and built[0].is_file()
    assert log.read_text().count("x") == 1, "each waiting build compiled again"


class _FakeLib:
    """libemm_capi's PyTorch statistics, as the routes call them."""

    def __init__(self, counters):
        self.counters, self.calls = counters, []

    def emm_torch_memory_stats(self, device, keys, values, n, found):
        self.calls.append(("stats", device))
        for i in range(n):
            values[i] = self.counters.get(keys[i].decode(), 0)
        return 0

    def emm_torch_reset_peak_stats(self, device):
        self.calls.append(("peak", device))
        return 0

    def emm_torch_empty_cache(self, device, released):
        self.calls.append(("empty", device))
        return 0

    def emm_take_warning(self, buf, cap, length, level):
        # Nothing queued (the routes take the library's messages first).
        length._obj.value = 0
        return 0


def test_pytorchs_statistics_reach_emm_under_the_pluggable_object(recorder, monkeypatch):
    from emm import _torch_routes

    monkeypatch.setattr(_torch_routes, "_RESET_BASE", {})
    counters = {"allocated_bytes.all.current": 100, "allocated_bytes.all.peak": 300,
                "allocated_bytes.all.allocated": 1000, "num_device_alloc": 4}
    lib = _FakeLib(counters)
    monkeypatch.setattr(_torch_routes, "load", lambda: lib)
    monkeypatch.setattr(tn, "install", lambda torch, lib: (_ for _ in ()).throw(tn.NativeUnavailable("x")))
    with pytest.warns(emm.EmmWarning):
        et.install()
    memory = recorder.cuda.memory
    nested = memory.memory_stats_as_nested_dict(0)
    assert nested["allocated_bytes"]["all"] == {"current": 100, "peak": 300, "allocated": 1000, "freed": 0}
    assert nested["allocated_bytes"]["large_pool"]["current"] == 0, "every key PyTorch's summary reads"
    assert nested["oversize_segments"]["peak"] == 0 and nested["num_device_alloc"] == 4
    memory.reset_peak_memory_stats(1)
    recorder.cuda.empty_cache()
    assert lib.calls == [("stats", 0), ("peak", 1), ("empty", -1)]

    memory.reset_accumulated_memory_stats(0)
    counters.update({"allocated_bytes.all.allocated": 1500, "num_device_alloc": 5, "allocated_bytes.all.current": 90})
    again = memory.memory_stats_as_nested_dict(0)
    assert again["allocated_bytes"]["all"]["allocated"] == 500 and again["num_device_alloc"] == 1
    assert again["allocated_bytes"]["all"]["current"] == 90, "current values are not reset"

    # Before CUDA is initialized: nothing reported, nothing done, nothing set up.
    recorder.cuda.is_initialized = lambda: False
    lib.calls.clear()
    assert memory.memory_stats_as_nested_dict(0) == {}
    memory.reset_peak_memory_stats(0)
    memory.reset_accumulated_memory_stats(0)
    memory.empty_cache()
    assert lib.calls == []


def test_emms_object_leaves_pytorchs_statistics_alone(recorder, monkeypatch):
    original = recorder.cuda.memory.memory_stats_as_nested_dict
    monkeypatch.setattr(tn, "install", lambda torch, lib: None)
    et.install()
    assert recorder.cuda.memory.memory_stats_as_nested_dict is original, "the C++ object answers them"
