#!/bin/bash
# The binary wheel of `cargo xtask wheel` on a GPU machine (no package index there):
# a fresh venv that sees the system's PyTorch (--system-site-packages), the wheel
# installed with pip alone, then from outside the checkout: the version, `emm info`,
# `emm replay` of a PyTorch snapshot on the GPU, and PyTorch through emm's own
# allocator object compiled from the wheel's source.
#
#   python/gpu/checks/wheel_check.sh [WHEEL]    # default: target/wheels/*.whl
set -u
WHEEL=${1:-$(ls target/wheels/*.whl | head -1)}
SNAP=$PWD/crates/emm-trace/tests/fixtures/h200_infer.pickle
V=$(mktemp -d)/venv
python3 -m venv --system-site-packages "$V" || exit 1
"$V/bin/pip" install --quiet --no-index --no-deps "$WHEEL" || { echo "wheel_check: pip install failed"; exit 1; }
# PyTorch may live outside the system site (a user site, another prefix): a .pth
# file makes the folder that holds it visible to the venv, and nothing else changes.
TORCH_SITE=$(python3 -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))" 2>/dev/null)
[ -n "$TORCH_SITE" ] && echo "$TORCH_SITE" > "$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/system-torch.pth"
cd "$(dirname "$V")" || exit 1
export PATH="$V/bin:$PATH"; unset PYTHONPATH EMM_LIBRARY
fail=0
python -m emm --version || fail=1
emm info | head -4 || fail=1
emm replay "$SNAP" --passes 3 2>&1 | grep -E "backend|manager|h200_infer.pickle +(default|pool|hostonly|pytorch)" || fail=1
python - <<'PY' || fail=1
import torch, emm, emm.torch, pathlib
emm.torch.install()
x = torch.ones(64 << 20, device="cuda"); y = (x * 2).sum().item()
s = emm.torch.memory_stats()
assert y == 2 * (64 << 20), y
assert s["allocated_bytes.all.current"] >= 256 << 20, s["allocated_bytes.all.current"]
p = pathlib.Path(emm.__file__).parent
assert "site-packages" in str(p) and emm.library_path() == p / "_native" / "libemm_capi.so"
print("wheel torch: OK", emm.__version__, torch.__version__, "allocated through emm:", s["allocated_bytes.all.current"])
PY
[ $fail = 0 ] && echo "wheel_check: OK" || echo "wheel_check: FAILED"
exit $fail
