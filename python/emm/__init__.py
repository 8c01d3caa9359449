"""emm from Python: the CUDA memory managers of emm over its C ABI (ctypes only).

Importing this package imports none of Numba, CuPy or PyTorch (NBEP 7, "Numba as a
dependency"). The integrations are submodules that import their framework only
when used:

- ``emm.numba_plugin``: a Numba EMM plugin; ``NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin``
  or ``numba.cuda.set_memory_manager(emm.numba_plugin.EmmNumbaManager)``.
- ``emm.cupy``: ``emm.cupy.install()`` makes CuPy allocate through emm.
- ``emm.torch``: ``emm.torch.install()`` makes PyTorch allocate through emm.

The manager is chosen by ``EMM_MEMORY_MANAGER`` (``default``, ``pool``,
``hostonly``); one manager per device is shared by every user in the process.
"""

from ._lib import EmmError, Manager, library_path, load

__all__ = ["EmmError", "Manager", "library_path", "load"]
