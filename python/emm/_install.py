"""Which emm this is: the distribution check and the ``emm`` binary's location.

The import name ``emm`` is also used by an unrelated distribution on the package
index (``emm``); this package's distribution is ``emm-cuda``. :func:`problem` says
plainly when the ``emm`` being imported is not emm-cuda's, and :func:`binary` finds
the ``emm`` command the wheel installs (a compiled program, not a Python script).
"""

from __future__ import annotations

import pathlib
from importlib import metadata
from typing import Iterator, Optional

DISTRIBUTION = "emm-cuda"
_HERE = pathlib.Path(__file__).resolve().parent


def _distribution(name: str) -> Optional[metadata.Distribution]:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _source_root() -> Optional[pathlib.Path]:
    """The checkout this package runs from (``python/emm`` beside ``Cargo.toml``), if any."""
    root = _HERE.parent.parent
    return root if (root / "Cargo.toml").is_file() and (root / "crates").is_dir() else None


def problem() -> Optional[str]:
    """``None`` when the imported ``emm`` is emm-cuda's (installed, or a source
    checkout); otherwise what is wrong and what to do, in one sentence."""
    other = _distribution("emm")
    if other is not None:
        return (
            f"the distribution `emm` {other.version} is installed: it is another project "
            "that uses the same import name, not emm-cuda; remove it with `pip uninstall emm` "
            "and reinstall emm-cuda"
        )
    if _source_root() is not None:
        return None  # a source checkout (its build may leave an egg-info beside it)
    ours = _distribution(DISTRIBUTION)
    if ours is None:
        return (
            f"the `emm` imported from {_HERE} does not belong to the distribution emm-cuda "
            "(`pip show emm-cuda` finds nothing); install emm-cuda's wheel"
        )
    files = {ours.locate_file(f).resolve() for f in (ours.files or ()) if f.name == "__init__.py"}
    if files and _HERE / "__init__.py" not in files:
        where = sorted(str(p.parent) for p in files if p.parent.name == "emm")
        return (
            f"the `emm` imported from {_HERE} is not the one emm-cuda installed "
            f"({', '.join(where) or 'elsewhere'}); check PYTHONPATH and the current directory"
        )
    return None


def _binaries() -> Iterator[pathlib.Path]:
    ours = _distribution(DISTRIBUTION)
    if ours is not None:
        for f in ours.files or ():
            if f.name == "emm" and f.parent.name == "bin":
                yield pathlib.Path(ours.locate_file(f))
    root = _source_root()
    if root is not None:
        built = [root / "target" / p / "emm" for p in ("release", "debug")]
        built.sort(key=lambda p: p.stat().st_mtime if p.is_file() else 0, reverse=True)
        yield from built


def binary() -> Optional[pathlib.Path]:
    """The ``emm`` program of this installation (or of the checkout's newest build)."""
    for p in _binaries():
        if p.is_file():
            return p
    return None
