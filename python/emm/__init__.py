"""emm from Python: the CUDA memory managers of emm over its C ABI (ctypes only).

The distribution is ``emm-cuda`` (``emm`` on the package index is another project):
``pip install emm_cuda-<version>-py3-none-manylinux_2_28_x86_64.whl`` (made by
``cargo xtask wheel``; no Rust toolchain needed to install it) brings this package,
its compiled library and the ``emm`` command (``python -m emm`` runs it too); extras
``[torch]``, ``[cupy]``, ``[numba]``, ``[rmm]`` and ``[dask]`` bring the frameworks.
``pip install <checkout>`` builds the same from source with the Rust toolchain.
``EMM_LIBRARY`` points at another build of the library.

Importing this package imports none of Numba, CuPy or PyTorch (NBEP 7, "Numba as a
dependency"). The integrations are submodules that import their framework only
when used:

- ``emm.numba_plugin``: a Numba EMM plugin; ``NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin``
  or ``numba.cuda.set_memory_manager(emm.numba_plugin.EmmNumbaManager)``.
- ``emm.cupy``: ``emm.cupy.install()`` makes CuPy allocate through emm.
- ``emm.torch``: ``emm.torch.install()`` makes PyTorch allocate through emm.
- ``emm.rmm``: ``emm.rmm.install()`` makes emm RMM's device memory resource.
- ``emm.dask``: ``EmmPlugin``, a Dask worker plugin that puts every worker of a
  cluster on emm (CuPy, Numba, RMM); ``worker_stats`` gathers their figures.

:func:`region`, :func:`pause` and :func:`resume` give a tagged part of the
program's GPU memory back to the device and take it again at the same addresses
(sleep mode for RL and serving; see ``emm._tags``).

:func:`replay` replays a PyTorch snapshot (or any trace ``emm replay`` reads)
through emm's managers and the models of PyTorch's allocator and returns
``emm replay --json``'s document: ``emm.replay("snapshot.pickle", fit=True)``.

The manager is ``pool`` unless :func:`configure` (``manager=``) or
``EMM_MEMORY_MANAGER`` names another (``default``, ``hostonly``); one manager per
device is shared by every user in the process (Python, C, PyTorch, CuPy, Numba).

Errors: :class:`OutOfMemoryError` (a ``MemoryError``, with ``requested``, ``free``
and ``total`` bytes), :class:`ClosedError` (a ``ValueError``: a closed handle),
:class:`ForkedError` (a child forked after CUDA was initialised),
:class:`TagStateError` (a paused tag, see :func:`pause`), and
:class:`EmmError` (``code`` and message) for the rest. Warnings of the library
(e.g. ``EMM_MEMORY_MANAGER`` overriding ``configure(manager=...)``) arrive as
:class:`EmmWarning` through the ``warnings`` module; its errors on the ``emm``
logger. Both are queued by the library and taken by the ``Manager``'s calls but
the allocation calls themselves (``alloc``, ``free`` and the like, which stay one
C call), by the tag functions and by ``emm.torch``'s statistics, before their C
call (under ``-W error`` a queued warning stops the call before it acts): those
of paths that run no Python (the native PyTorch allocator, CuPy's C allocator)
arrive at the next such call (``stats``, ``memory_info``, ``snapshot``,
``trim``, a failure, ...), :func:`take_warnings` takes them at any time, and any
left at exit go to stderr. The queue keeps the newest 256; when older ones were
dropped, an error says how many.
"""

from ._version import __version__
from ._lib import (
    ClosedError,
    EmmError,
    EmmWarning,
    ForkedError,
    Manager,
    OutOfMemoryError,
    Setting,
    TagStateError,
    configure,
    library_path,
    load,
    settings,
    stat_names,
    take_warnings,
)
from ._replay import replay
from ._tags import pause, region, resume, tag_stats

__all__ = [
    "__version__",
    "ClosedError",
    "EmmError",
    "EmmWarning",
    "ForkedError",
    "Manager",
    "OutOfMemoryError",
    "Setting",
    "TagStateError",
    "configure",
    "library_path",
    "load",
    "pause",
    "region",
    "replay",
    "resume",
    "settings",
    "stat_names",
    "tag_stats",
    "take_warnings",
]
