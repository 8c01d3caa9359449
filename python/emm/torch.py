"""PyTorch through emm: ``emm.torch.install()`` swaps PyTorch's CUDA allocator for
emm's (``torch.cuda.memory.CUDAPluggableAllocator`` over ``emm_torch_alloc`` /
``emm_torch_free`` of libemm_capi). Call it before PyTorch allocates any CUDA memory;
PyTorch allows one swap per process. The manager is the process's (``pool`` unless
``emm.configure`` or ``EMM_MEMORY_MANAGER`` names another). Importing this module does not import PyTorch.

Under a pluggable allocator PyTorch's own ``torch.cuda.memory_stats()`` is
unavailable; use ``emm.Manager(device=0).stats()`` instead.
"""

from __future__ import annotations

from typing import Any

from ._lib import library_path

__all__ = ["install"]


def install() -> Any:
    """Makes PyTorch allocate CUDA memory through emm; returns the allocator object."""
    import torch

    alloc = torch.cuda.memory.CUDAPluggableAllocator(str(library_path()), "emm_torch_alloc", "emm_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc
