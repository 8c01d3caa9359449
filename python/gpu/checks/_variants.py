"""Runs one variant of a GPU check in a process of its own (the GPU checks that
compare allocators: one allocator per process, as PyTorch allows one swap)."""

import json
import os
import subprocess
import sys


def run_variant(script, variant):
    """Runs ``script --variant VARIANT`` with this process's environment; returns
    the JSON object of its first line that starts with ``{`` (None when it printed
    none) and the completed process."""
    out = subprocess.run([sys.executable, script, "--variant", variant], capture_output=True, text=True,
                         env=dict(os.environ), check=False)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
    return (json.loads(line) if line is not None else None), out
