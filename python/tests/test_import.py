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
        for m in ("emm", "emm.cupy", "emm.torch", "emm._lib"):
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
        self.assertEqual(self.lib.emm_abi_version(), 100)

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


if __name__ == "__main__":
    unittest.main()
