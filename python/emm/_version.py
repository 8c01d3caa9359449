"""The version of emm's Python package (distribution ``emm-cuda``); the workspace's
``Cargo.toml`` and ``pyproject.toml`` carry the same number (a test checks)."""

__version__ = "0.1.0"
