#!/bin/bash
# Issue 33's time on one GPU: every variant of a round at once, taking turns step by
# step (train_rounds.py --lockstep), fresh shapes, PyTorch native and expandable
# segments beside emm's pool, and emm's pool with its unmapping helper off (whose
# work, with the helper on, may fall in another process's turn; the tables also
# set it beside emm's pool step by step).
#
#   python/gpu/benchmarks/lockstep_rounds.sh check
#   python/gpu/benchmarks/lockstep_rounds.sh ROUNDS FIRST WORKLOAD:STEPS [WORKLOAD:STEPS ...]
#
# From the repository root on the GPU machine, after `cargo xtask gpu`. `check`
# runs eight steps of GPT-2 in a ring of the four variants (about a minute) and
# fails unless each gave a result: run it first, in a call of its own or before a
# short round. FIRST numbers the rounds: a call's limit of 600 s holds one round
# of BERT or GPT-2 at 300 steps (four processes a step index, about 0.8 s), so go
# on in the next call with the next FIRST, and table the calls' logs together
# with train_rounds.py --from-log. One log and one table file per workload in
# $OUT. The four processes share the GPU's memory: their device-used peaks on
# BERT sum to about 72 GiB (runs 367-369: 24.3 native, 16.3 expandable, 14.7
# emm), within an H100's 80; one process out of memory ends its whole round.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=python/gpu/benchmarks/train_rounds.py
V="native expandable emm-pool emm-pool:EMM_POOL_BACKGROUND_UNMAP=0"
export PYTHONUNBUFFERED=1 EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
if [ "${1:-}" = check ]; then
  python3 $R --lockstep --shapes fresh --variants $V --workloads gpt2 --steps 8 --warmup 2 --rounds 1 \
    --timeout 150 --log "$OUT/check.log" > "$OUT/check.txt" 2>&1
  echo "check rc=$?"; grep -E "^round|no result" "$OUT/check.txt"
  n=$(grep -c "^round 1 gpt2 " "$OUT/check.txt")
  [ "$n" -eq 4 ] || { echo "check: $n of 4 variants gave a result"; tail -40 "$OUT/check.log"; exit 1; }
  exit 0
fi
[ $# -ge 3 ] || { echo "usage: $0 check | ROUNDS FIRST WORKLOAD:STEPS..." >&2; exit 2; }
rounds=$1; first=$2; shift 2
for ws in "$@"; do
  w=${ws%%:*}; steps=${ws##*:}
  python3 $R --lockstep --shapes fresh --variants $V --workloads "$w" --steps "$steps" --warmup 6 \
    --rounds "$rounds" --first-round "$first" --timeout 540 --log "$OUT/$w-r$first.log" > "$OUT/$w-r$first.txt" 2>&1
  echo "$w rc=$?"; grep -E "^round" "$OUT/$w-r$first.txt"
  sed -n '/lockstep rounds/,/^$/p' "$OUT/$w-r$first.txt"
done
