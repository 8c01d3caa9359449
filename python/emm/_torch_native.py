"""Builds and loads ``_torch_native.cpp``: emm's allocator object for PyTorch, a
subclass of PyTorch's pluggable allocator whose ``allocate`` and deleter call emm
directly instead of keeping a second map of live addresses under a mutex.

The library is compiled against the PyTorch it runs with (its headers and
libraries, the C++ compiler in ``CXX`` or ``c++``; no ninja), once per PyTorch
build and source, into ``EMM_CACHE_DIR`` (else ``$XDG_CACHE_HOME/emm``, else
``~/.cache/emm``); processes starting together (the ranks of a torchrun job) build
it once, the others waiting on a lock file beside it. Any step that cannot be done raises :class:`NativeUnavailable`
saying which and why; ``emm.torch.install`` then uses PyTorch's pluggable
allocator instead and says so.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Iterator, List

SOURCE = pathlib.Path(__file__).with_name("_torch_native.cpp")

# The PyTorch libraries the subclass needs: the pluggable allocator's class
# (libtorch_cuda), CUDA streams and devices (libc10_cuda), exceptions (libc10).
LIBRARIES = ("torch_cuda", "c10_cuda", "c10")

# Seconds a compile may take before it is given up.
COMPILE_TIMEOUT = 600


class NativeUnavailable(RuntimeError):
    """The native allocator object cannot be built or installed here; the message
    says which step failed and why."""


class Refused(NativeUnavailable):
    """PyTorch refused to swap its allocator (it has handed out memory already):
    PyTorch's pluggable allocator would be refused too."""


def cache_dir() -> pathlib.Path:
    """Where built libraries are kept."""
    explicit = os.environ.get("EMM_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "emm"


def _cuda_includes(torch: Any) -> List[str]:
    """Directories holding ``cuda_runtime_api.h``: the CUDA toolkit PyTorch finds,
    and the include folders of NVIDIA's pip packages beside PyTorch."""
    found: List[str] = []
    try:
        from torch.utils import cpp_extension

        home = cpp_extension.CUDA_HOME
        if home:
            found.append(os.path.join(home, "include"))
    except Exception:  # noqa: BLE001 - an odd PyTorch install: try the pip layout
        pass
    for entry in sys.path:
        nvidia = pathlib.Path(entry) / "nvidia"
        if nvidia.is_dir():
            found.extend(str(p) for p in sorted(nvidia.glob("*/include")) if p.is_dir())
    return [d for d in found if os.path.isfile(os.path.join(d, "cuda_runtime_api.h"))]


def compile_command(torch: Any, output: pathlib.Path) -> List[str]:
    """The compiler command that builds the library at ``output`` against ``torch``."""
    torch_dir = pathlib.Path(torch.__file__).parent
    include = torch_dir / "include"
    lib = torch_dir / "lib"
    if not (include / "torch" / "csrc" / "cuda" / "CUDAPluggableAllocator.h").is_file():
        raise NativeUnavailable(
            f"PyTorch at {torch_dir} has no torch/csrc/cuda/CUDAPluggableAllocator.h under {include}"
        )
    cuda = _cuda_includes(torch)
    if not cuda:
        raise NativeUnavailable(
            "no cuda_runtime_api.h found (set CUDA_HOME to a CUDA toolkit, or install "
            "NVIDIA's nvidia-cuda-runtime package)"
        )
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        raise NativeUnavailable(f"no C++ compiler: `{cxx}` is not on PATH (set CXX)")
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return [
        cxx, "-O2", "-std=c++17", "-shared", "-fPIC",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
        *(f"-I{d}" for d in cuda),
        str(SOURCE), "-o", str(output),
        f"-L{lib}", f"-Wl,-rpath,{lib}", *(f"-l{name}" for name in LIBRARIES),
    ]


def _key(torch: Any) -> str:
    """What the built library depends on: the source, PyTorch's build, the compiler."""
    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (torch.__version__, str(getattr(torch.version, "cuda", None)),
                 str(getattr(torch.version, "git_version", None)),
                 str(pathlib.Path(torch.__file__).parent), os.environ.get("CXX") or "c++"):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


def build(torch: Any) -> pathlib.Path:
    """The library for ``torch``: the cached one, else compiled now (a few seconds
    to a minute, once). Raises :class:`NativeUnavailable`."""
    try:
        return _build(torch)
    except NativeUnavailable:
        raise
    except (OSError, UnicodeError, RuntimeError, ValueError) as e:
        raise NativeUnavailable(f"building {SOURCE.name} failed: {e}") from e


def _build(torch: Any) -> pathlib.Path:
    if not SOURCE.is_file():
        raise NativeUnavailable(f"{SOURCE} is missing from the emm package")
    out = cache_dir() / "torch-native" / f"emm_torch_native-{_key(torch)}.so"
    if out.is_file():
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NativeUnavailable(f"cannot create the cache folder {out.parent}: {e}") from e
    # One build at a time per library (the ranks of a torchrun job start
    # together): the others wait for it and load what it built.
    with _build_lock(out.with_suffix(".lock")):
        if out.is_file():
            return out
        return _compile(torch, out)


@contextlib.contextmanager
def _build_lock(path: pathlib.Path) -> Iterator[None]:
    """Holds an exclusive lock on ``path`` (created if missing) while in the
    block. Where none can be had (no ``fcntl``, a lock file another user made
    unreadable, a file system without locks), the block runs without one: the
    build's rename into place keeps that safe, at the cost of compiling twice. A
    failed build is not remembered, so each process that waited tries again."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        locked = True
    except OSError:
        locked = False
    try:
        yield
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _compile(torch: Any, out: pathlib.Path) -> pathlib.Path:
    # Built beside its final name and renamed into place, so that a process
    # that does not wait for the lock never loads a half-written library.
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=out.stem + ".", suffix=".tmp.so")
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    try:
        cmd = compile_command(torch, tmp)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                               timeout=COMPILE_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NativeUnavailable(f"compiling {SOURCE.name} failed to run: {e}") from e
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-12:]
            raise NativeUnavailable(
                f"compiling {SOURCE.name} failed (exit {r.returncode}): " + " | ".join(tail)
            )
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


FUNCTIONS = (
    ("alloc", "emm_torch_alloc"),
    ("release", "emm_torch_release"),
    ("last_error", "emm_last_error"),
    ("last_error_code", "emm_last_error_code"),
    ("record_stream", "emm_torch_record_stream"),
    ("memory_stats", "emm_torch_memory_stats"),
    ("reset_peak_stats", "emm_torch_reset_peak_stats"),
    ("empty_cache", "emm_torch_empty_cache"),
    ("cache_info", "emm_torch_cache_info"),
    ("graph_pool_begin", "emm_torch_graph_pool_begin"),
    ("graph_pool_end", "emm_torch_graph_pool_end"),
    ("graph_pool_release", "emm_torch_graph_pool_release"),
    ("graph_pool_alloc", "emm_torch_graph_pool_alloc"),
    ("graph_pool_live", "emm_torch_graph_pool_live"),
    ("graph_pool_create", "emm_torch_graph_pool_create"),
    ("graph_pool_info", "emm_torch_graph_pool_info"),
)
"""The fields of the source's ``EmmFunctions``, in its order, each with the
function of libemm_capi whose address it holds."""


class Functions(ctypes.Structure):
    """The source's ``EmmFunctions``: the addresses of emm's functions the object
    calls (the library does not link emm)."""

    _fields_ = [(field, ctypes.c_void_p) for field, _ in FUNCTIONS]


def install(torch: Any, lib: ctypes.CDLL) -> pathlib.Path:
    """Builds (or finds) the library, loads it and makes PyTorch's CUDA allocator
    the native one over ``lib`` (libemm_capi). Returns the library's path. A cached
    library that does not load is built again once. Raises :class:`Refused` when
    PyTorch refuses the swap, :class:`NativeUnavailable` for anything else;
    PyTorch's allocator is unchanged then."""
    path = build(torch)
    try:
        native = ctypes.CDLL(str(path))
    except OSError as first:
        try:
            path.unlink()
        except OSError as e:
            raise NativeUnavailable(f"cannot load {path} ({first}) nor remove it: {e}") from e
        path = build(torch)
        try:
            native = ctypes.CDLL(str(path))
        except OSError as e:
            raise NativeUnavailable(f"cannot load {path}, built again: {e}") from e
    try:
        fn = native.emm_torch_native_install
    except AttributeError as e:
        raise NativeUnavailable(f"{path} does not export emm_torch_native_install: {e}") from e
    fn.argtypes = [ctypes.POINTER(Functions), ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    fns = Functions(**{field: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                       for field, name in FUNCTIONS})
    err = ctypes.create_string_buffer(2048)
    status = fn(ctypes.byref(fns), ctypes.sizeof(fns), err, len(err))
    if status == 2:
        raise Refused(f"PyTorch refused emm's allocator: {err.value.decode(errors='replace')}")
    if status != 0:
        raise NativeUnavailable(err.value.decode(errors="replace"))
    # The library must stay loaded while PyTorch holds the allocator.
    _LOADED.append(native)
    return path


_LOADED: List[ctypes.CDLL] = []
