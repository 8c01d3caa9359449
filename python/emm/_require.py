"""What to install when the framework an integration needs is missing.

Each integration (``emm.torch``, ``emm.cupy``, ``emm.numba_plugin``, ``emm.rmm``,
``emm.dask``) imports its framework through :func:`require`, so a missing one is a
``ModuleNotFoundError`` that names the extra of ``emm-cuda`` that brings it and the
distribution to install by hand.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Dict, Tuple

# Top-level import name -> (extra of emm-cuda, what to install by hand).
EXTRAS: Dict[str, Tuple[str, str]] = {
    "torch": ("torch", "torch"),
    "cupy": ("cupy", "cupy-cuda12x (or cupy-cuda13x for CUDA 13)"),
    "numba": ("numba", "numba-cuda"),
    "rmm": ("rmm", "rmm-cu12 (or rmm-cu13 for CUDA 13)"),
    "distributed": ("dask", "distributed"),
}


def missing(module: str, user: str, cause: BaseException) -> ModuleNotFoundError:
    """The error for ``user`` (e.g. ``"emm.torch.install()"``) when ``module`` did not
    import because of ``cause``."""
    top = module.split(".")[0]
    extra, by_hand = EXTRAS.get(top, (None, top))
    how = f"`pip install 'emm-cuda[{extra}]'` or `pip install {by_hand}`" if extra else f"`pip install {by_hand}`"
    return ModuleNotFoundError(
        f"{user} needs {top!r}, which did not import ({type(cause).__name__}: {cause}); "
        f"install it with {how}",
        name=top,
    )


def require(module: str, user: str) -> ModuleType:
    """Imports ``module`` for ``user``, or raises :func:`missing`'s error."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise missing(module, user, e) from e
