"""Where the time of a Numba ``device_array`` allocate+free pair goes.

Usage: python3 numba_probe.py {null|null-nofin|emm-finalize|emm|profile}
- null: a plugin that hands out a fake pointer with a do-nothing finalizer
  (Numba's own cost of a pair through any plugin that follows NBEP 7's example).
- null-nofin: the same without a finalizer (Numba's cost without weakref.finalize).
- emm-finalize: emm's allocator behind Numba's weakref.finalize finalizer.
- emm: emm.numba_plugin as shipped.
- profile: cProfile of 20000 pairs through emm.numba_plugin, by own time.
Timed as bench.py times (median of 7, first call excluded).
"""
import ctypes
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench import SIZES, timeit  # noqa: E402


def main(variant):
    from numba import cuda
    from numba.cuda import HostOnlyCUDAMemoryManager, MemoryInfo, MemoryPointer, GetIpcHandleMixin
    import numpy as np

    if variant.startswith("null"):
        fin = None if variant == "null-nofin" else (lambda: None)

        class Null(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
            def initialize(self):
                pass

            def memalloc(self, size):
                return MemoryPointer(self.context, ctypes.c_void_p(1 << 40), size, finalizer=fin)

            def get_memory_info(self):
                return MemoryInfo(free=0, total=0)

            @property
            def interface_version(self):
                return 1

        cuda.set_memory_manager(Null)
    else:
        import emm.numba_plugin as plugin

        cls = plugin.EmmNumbaManager
        if variant == "emm-finalize":
            class Finalize(plugin.EmmNumbaManager):
                def memalloc(self, size):
                    if self._emm is None:
                        self.initialize()
                    ptr = self._emm.alloc(size)
                    free = self._emm.free
                    return MemoryPointer(self.context, ctypes.c_void_p(ptr), size,
                                         finalizer=lambda: free(ptr))
            cls = Finalize
        cuda.set_memory_manager(cls)

    if variant == "profile":
        import cProfile
        import pstats
        cuda.device_array(256, dtype=np.uint8)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20000):
            cuda.device_array(256, dtype=np.uint8)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)
        return
    for sz in SIZES:
        us = timeit(lambda: cuda.device_array(sz, dtype=np.uint8), 2000)
        print(f"numba-{variant} size={sz} us_per_pair={us:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
