"""``python/gpu/README.md`` names every script of ``python/gpu/`` under the folder
it lies in (``checks/``, ``benchmarks/``, ``probes/``: what each verifies or
measures), so a new one cannot land unindexed or misfiled, and no script lies
outside those folders."""

import os
import re

import pytest

GPU = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu")
FOLDERS = ("checks", "benchmarks", "probes")
SCRIPT = (".py", ".sh", ".cpp", ".c", ".cu", ".h")


def sections(index):
    """{folder: the README's text under its ``## folder/`` heading}."""
    parts = re.split(r"^## (\w+)/\s*$", index, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_every_gpu_script_is_in_the_index_under_its_folder():
    readme = os.path.join(GPU, "README.md")
    if not os.path.exists(readme):
        pytest.skip("python/gpu is not here (an installed package without the checkout)")
    with open(readme) as f:
        index = sections(f.read())
    loose = [n for n in os.listdir(GPU) if n.endswith(SCRIPT)]
    assert not loose, f"scripts outside {FOLDERS}: {loose}"
    missing, seen = [], 0
    for folder in FOLDERS:
        assert folder in index, f"python/gpu/README.md has no '## {folder}/' section"
        for name in sorted(os.listdir(os.path.join(GPU, folder))):
            if name.endswith(SCRIPT):
                seen += 1
                if f"`{name}`" not in index[folder]:
                    missing.append(f"{folder}/{name}")
    assert seen > 30, f"only {seen} scripts found"
    assert not missing, f"python/gpu/README.md does not name, under their folder: {', '.join(missing)}"
