"""``python/gpu/README.md`` names every script of ``python/gpu/`` (what each
verifies or measures), so a new one cannot land unindexed."""

import os

import pytest

GPU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu")


def test_every_gpu_script_is_in_the_index():
    readme = os.path.join(GPU, "README.md")
    if not os.path.exists(readme):
        pytest.skip("python/gpu is not here (an installed package without the checkout)")
    with open(readme) as f:
        index = f.read()
    scripts = sorted(n for n in os.listdir(GPU) if n.endswith((".py", ".sh", ".cpp", ".c")))
    assert scripts, "no scripts found"
    missing = [n for n in scripts if f"`{n}`" not in index]
    assert not missing, f"python/gpu/README.md does not name: {', '.join(missing)}"
