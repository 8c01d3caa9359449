"""Adjustments to setuptools-rust for emm's package (the rest of the configuration is
in pyproject.toml):

- the library is installed as ``emm/_native/libemm_capi.so``, not under a CPython
  extension-module name (it is not one), in a folder without ``__init__.py`` so that
  pydoc does not list it as a module;
- the wheel is tagged ``py3-none-<platform>``: it holds no CPython extension, so one
  wheel serves every Python 3 on that platform; ``EMM_WHEEL_PLAT`` names the
  platform tag (``cargo xtask wheel`` sets ``manylinux_2_28_x86_64`` after building
  for glibc 2.28);
- with ``EMM_WHEEL_PREBUILT=DIR`` (``cargo xtask wheel``), ``libemm_capi.so`` and the
  ``emm`` program are taken from DIR, already built, instead of running cargo.
"""

import os

from setuptools import setup
from setuptools_rust import RustBin, build_rust

try:  # setuptools >= 70.1 carries bdist_wheel
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - older setuptools
    from wheel.bdist_wheel import bdist_wheel

PREBUILT = os.environ.get("EMM_WHEEL_PREBUILT")
PLATFORM = os.environ.get("EMM_WHEEL_PLAT")


class build_rust_emm(build_rust):
    """Names the library ``emm/_native/libemm_capi.so``; takes prebuilt artifacts."""

    def get_dylib_ext_path(self, ext, target_fname):
        path = super().get_dylib_ext_path(ext, target_fname)
        return os.path.join(os.path.dirname(path), "_native", "libemm_capi.so")

    def run_for_extension(self, ext):
        if not PREBUILT:
            return super().run_for_extension(ext)
        name = "emm" if isinstance(ext, RustBin) else "libemm_capi.so"
        path = os.path.abspath(os.path.join(PREBUILT, name))
        if not os.path.isfile(path):
            raise SystemExit(f"EMM_WHEEL_PREBUILT={PREBUILT} holds no {name}")
        self.install_extension(ext, [(ext.name, path)], None)


class bdist_wheel_any_python(bdist_wheel):
    """Tags the wheel for any Python 3 on the build's (or EMM_WHEEL_PLAT's) platform."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", PLATFORM or plat


setup(cmdclass={"build_rust": build_rust_emm, "bdist_wheel": bdist_wheel_any_python})
