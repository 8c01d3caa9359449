"""Peer for the suite comparison: RMM's Numba plugin over an RMM pool (RMM's own
plugin module uses whatever resource is current, by default cudaMalloc per
allocation). Usage: NUMBA_CUDA_MEMORY_MANAGER=rmm_pool_plugin (with this folder
on PYTHONPATH)."""
import rmm
from rmm.allocators.numba import RMMNumbaManager

rmm.reinitialize(pool_allocator=True, initial_pool_size=1 << 30)
_numba_memory_manager = RMMNumbaManager
