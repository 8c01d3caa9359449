#!/bin/bash
# Long runs of one workload beside both PyTorch variants, and emm's pool as built
# now (emm-pool) beside a build from before a change (emm-pool-prev, the library
# EMM_PREV_LIBRARY names; default .peers/prev/libemm_capi.so): one process per
# variant, rotated rounds, bucketed shapes (python/gpu/benchmarks/train_rounds.py).
#
#   python/gpu/benchmarks/ab_rounds.sh WORKLOAD STEPS ROUNDS [tests]
#
# From the repository root on the GPU machine, after `cargo xtask gpu` (and the
# earlier build's libemm_capi.so copied to .peers/prev/); logs to $OUT. With
# `tests`, runs every GPU test binary first (gpu-bundle/run.sh).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ $# -ge 3 ] || { echo "usage: $0 WORKLOAD STEPS ROUNDS [tests]" >&2; exit 2; }
export PYTHONUNBUFFERED=1 EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so PYTHONPATH=$PWD/python
export EMM_PREV_LIBRARY=${EMM_PREV_LIBRARY:-$PWD/.peers/prev/libemm_capi.so}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
if [ "${4:-}" = tests ]; then
  timeout 300 bash gpu-bundle/run.sh > "$OUT/tests.txt" 2>&1
  echo "tests rc=$?"; grep -v "rc=0" "$OUT/tests.txt" | head
fi
python3 python/gpu/benchmarks/train_rounds.py --shapes bucketed --variants native expandable emm-pool emm-pool-prev \
  --workloads "$1" --steps "$2" --rounds "$3" --warmup 8 --timeout 200 --log "$OUT/$1.log" > "$OUT/$1.txt" 2>&1
echo "rc=$?"; tail -45 "$OUT/$1.txt"
