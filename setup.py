"""Two adjustments to setuptools-rust for a ctypes-loaded library (the rest of the
configuration is in pyproject.toml):

- the library is installed as ``emm/libemm_capi.so``, not under a CPython
  extension-module name (it is not one), and
- the wheel is tagged ``py3-none-<platform>``: it holds no CPython extension, so one
  wheel serves every Python 3 (CPython or PyPy) on that platform.
"""

import os

from setuptools import setup
from setuptools_rust import build_rust

try:  # setuptools >= 70.1 carries bdist_wheel
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - older setuptools
    from wheel.bdist_wheel import bdist_wheel


class build_rust_shared_library(build_rust):
    """Names the built library ``libemm_capi.so`` inside the package."""

    def get_dylib_ext_path(self, ext, target_fname):
        path = super().get_dylib_ext_path(ext, target_fname)
        return os.path.join(os.path.dirname(path), "libemm_capi.so")


class bdist_wheel_any_python(bdist_wheel):
    """Tags the wheel for any Python 3 on the build's platform."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_rust": build_rust_shared_library, "bdist_wheel": bdist_wheel_any_python})
