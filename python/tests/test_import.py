"""Runs in CI (no GPU, no frameworks needed): importing emm and its integration
modules imports none of Numba, CuPy or PyTorch, and the C library answers."""

import importlib
import os
import pathlib
import sys
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

FRAMEWORKS = ("numba", "cupy", "torch")


class ImportWithoutFrameworks(unittest.TestCase):
    def test_importing_emm_imports_no_framework(self):
        for m in ("emm", "emm.cupy", "emm.torch", "emm._lib", "emm.array"):
            importlib.import_module(m)
        for f in FRAMEWORKS:
            self.assertNotIn(f, sys.modules, f"importing emm imported {f}")

    def test_the_numba_plugin_needs_numba_and_says_so(self):
        if importlib.util.find_spec("numba") is not None:
            self.skipTest("numba is installed here; the plugin's own tests cover it")
        with self.assertRaises(ImportError):
            importlib.import_module("emm.numba_plugin")


class Library(unittest.TestCase):
    def setUp(self):
        import emm
        try:
            self.lib = emm.load()
        except emm.EmmError as e:
            self.fail(f"libemm_capi did not load: {e}")

    def test_abi_version(self):
        self.assertEqual(self.lib.emm_abi_version(), 200)

    def test_a_manager_without_a_driver_is_a_typed_error(self):
        import emm
        if pathlib.Path("/dev/nvidia0").exists():
            m = emm.Manager(None, 0)
            self.assertIn(m.name, ("default", "pool", "hostonly"))
            return
        with self.assertRaises(emm.EmmError) as cm:
            emm.Manager("pool", 0)
        self.assertEqual(cm.exception.code, 3)
        self.assertIn("CUDA driver", str(cm.exception))

    def test_unknown_manager_names_the_known_ones(self):
        import emm
        with self.assertRaises(emm.EmmError) as cm:
            emm.Manager("poool", 0)
        self.assertEqual(cm.exception.code, 5)
        self.assertIn("default, hostonly, pool", str(cm.exception))


class HostArray(unittest.TestCase):
    """MemArray rules that need no GPU, through the C ABI."""

    def test_checked_access_locks_and_unsupported_types(self):
        import emm
        from emm.array import MemArray
        a = MemArray((3, 4), "int32", host_only=True)
        a[2, 3] = 7
        self.assertEqual(a[2, 3], 7)
        with self.assertRaises(emm.EmmError) as cm:
            a[3, 0]
        self.assertIn("out of bounds", str(cm.exception))
        lid = a.lock()
        with self.assertRaises(emm.EmmError) as cm:
            a[0, 0] = 1
        self.assertIn("locked", str(cm.exception))
        a.unlock(lid)
        a[0, 0] = 1
        with self.assertRaises(emm.EmmError) as cm:
            MemArray((2,), "complex64", host_only=True)
        self.assertIn("supported: int8", str(cm.exception))
        with self.assertRaises(emm.EmmError):
            MemArray((1, 1, 1, 1, 1), "float32", host_only=True)
        self.assertEqual(a.__dlpack_device__(), (1, 0))

    def test_an_unconsumed_capsule_runs_its_deleter_once(self):
        import emm
        from emm.array import MemArray
        a = MemArray((8,), "float64", host_only=True)
        cap = a.__dlpack__(max_version=(1, 0))
        with self.assertRaises(emm.EmmError):
            a[0] = 1.0  # the export locks the array
        del cap
        self.assertEqual(a.deleters_run, 1)
        a[0] = 1.0
        legacy = a.__dlpack__()
        del legacy
        self.assertEqual(a.deleters_run, 2)
        with self.assertRaises(BufferError):
            a.__dlpack__(copy=True)


class CupyBlock(unittest.TestCase):
    """The object that frees a CuPy allocation (no CuPy needed to test it)."""

    class FakeManager:
        def __init__(self, fail):
            self.fail, self.freed = fail, []

        def alloc(self, size, stream):
            self.allocated = (size, stream)
            return 0x3000

        def free(self, ptr, stream=0):
            self.freed.append((ptr, stream))
            if self.fail:
                raise RuntimeError(f"free of {ptr:#x} refused")

    def test_the_block_is_freed_once_on_its_stream(self):
        from emm.cupy import _Block
        mgr = self.FakeManager(fail=False)
        b = _Block(mgr, 0x1000, 7)
        del b
        self.assertEqual(mgr.freed, [(0x1000, 7)])

    def test_a_failing_free_is_reported_not_swallowed(self):
        from emm.cupy import _Block
        mgr = self.FakeManager(fail=True)
        seen = []
        old, sys.unraisablehook = sys.unraisablehook, seen.append
        try:
            b = _Block(mgr, 0x2000, 0)
            del b
        finally:
            sys.unraisablehook = old
        self.assertEqual(mgr.freed, [(0x2000, 0)])
        self.assertEqual(len(seen), 1)
        self.assertIn("0x2000", str(seen[0].exc_value))


    def test_the_python_function_allocator_pair(self):
        import emm.cupy as ec

        class Stream:
            ptr = 42

        mgr = self.FakeManager(fail=False)
        saved = ec._current_stream, dict(ec._managers)
        ec._current_stream, ec._managers[5] = Stream, mgr
        try:
            self.assertEqual(ec.malloc(100, 5), 0x3000)
            self.assertEqual(mgr.allocated, (100, 42))  # CuPy's current stream
            ec.free(0x3000, 5)
            self.assertEqual(mgr.freed, [(0x3000, 0)])  # 0: the block's own stream
        finally:
            ec._current_stream = saved[0]
            ec._managers.clear()
            ec._managers.update(saved[1])


if __name__ == "__main__":
    unittest.main()
