#!/bin/bash
# Issue 33's long runs on a machine of several GPUs: every variant of a round at
# once, one process a GPU, the GPUs rotated between rounds (train_rounds.py --gpus),
# bucketed shapes, PyTorch native and expandable segments beside emm's pool.
#
#   python/gpu/benchmarks/long_rounds.sh ROUNDS WORKLOAD:STEPS [WORKLOAD:STEPS ...]
#
# From the repository root on the GPU machine, after `cargo xtask gpu`; one log
# and one table file per workload in $OUT. Needs 3 GPUs.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ $# -ge 2 ] || { echo "usage: $0 ROUNDS WORKLOAD:STEPS..." >&2; exit 2; }
rounds=$1; shift
export PYTHONUNBUFFERED=1 EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
for ws in "$@"; do
  w=${ws%%:*}; steps=${ws##*:}
  python3 python/gpu/benchmarks/train_rounds.py --shapes bucketed --variants native expandable emm-pool --gpus 3 \
    --workloads "$w" --steps "$steps" --rounds "$rounds" --warmup 8 --timeout 280 \
    --log "$OUT/$w.log" > "$OUT/$w.txt" 2>&1
  echo "$w rc=$?"; grep -E "^round|^\| (native|expandable|emm-pool) |device time|  (native|expandable|emm-pool):" "$OUT/$w.txt"
done
