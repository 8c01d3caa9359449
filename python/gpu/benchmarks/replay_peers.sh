#!/bin/bash
# PyTorch's real allocator replaying every recorded trace and snapshot of the
# repository (../shared/peers/torch_replay.cpp, copied to .peers/), expandable
# segments and native, 1 and 100 passes, the trace's streams honoured: the peer
# figures of crates/emm-trace/tests/steady_state.rs. Then emm's pool replaying the
# same traces on the GPU (gpu-bundle/emm replay --passes $EMM_PASSES, 30 unless set).
#
#   python/gpu/benchmarks/replay_peers.sh            # the repository's traces
#   EMM_PASSES=100 python/gpu/benchmarks/replay_peers.sh T1.csv T2.csv ...   # others
#
# From the repository root on the GPU machine, after `cargo xtask gpu`, with the
# snapshots converted here first:
#   python3 python/gpu/benchmarks/snapshot_to_csv.py crates/emm-trace/tests/fixtures/h200_infer.pickle .peers/h200_infer.csv
#   python3 python/gpu/benchmarks/snapshot_to_csv.py crates/emm-trace/tests/fixtures/h200_train_midway.pickle .peers/h200_train_midway.csv
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
bash python/gpu/benchmarks/build_torch_replay.sh /tmp/torch_replay || exit 1
if [ $# -gt 0 ]; then TR="$*"; else
  TR="$(ls crates/emm-cli/traces/*.csv crates/emm-trace/tests/fixtures/*.csv) .peers/h200_infer.csv .peers/h200_train_midway.csv"
fi
for t in $TR; do for conf in "expandable_segments:True" ""; do for p in 1 100; do
  PYTORCH_CUDA_ALLOC_CONF=$conf timeout 120 /tmp/torch_replay "$t" 1 --passes $p --streams 2>&1 | grep "run=0" | sed "s|^|conf=${conf:-native} |"
done; done; done > "$OUT/torch_replay.txt"
for t in $TR; do timeout 100 gpu-bundle/emm replay "$t" -m pool --passes ${EMM_PASSES:-30} 2>&1 | tail -2; done > "$OUT/emm_gpu_replay.txt"
cat "$OUT/torch_replay.txt"
