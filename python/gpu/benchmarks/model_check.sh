#!/bin/bash
# PyTorch's real allocator on the traces the models of it are checked on
# (crates/emm-trace/tests/torch_model.rs): the random traces of
# crates/emm-trace/tests/fixtures/random/ with the stream column honoured and
# without it, and the recorded traces of the repository without it (with it:
# python/gpu/benchmarks/replay_peers.sh); native and expandable segments, 1 and 100 passes.
# One line a run: `conf=... streams=yes|no torch-caching replay=TRACE ...
# passes=N ... reserved/live=R`.
#
#   python/gpu/benchmarks/model_check.sh
#
# From the repository root on the GPU machine, ../shared/peers/torch_replay.cpp
# and the two snapshots as CSV in .peers/ (see python/gpu/benchmarks/replay_peers.sh).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
g++ -O2 -std=c++17 .peers/torch_replay.cpp -I"$T/include" -I/usr/local/cuda/include \
  -L"$T/lib" -L/usr/local/cuda/lib64 -lc10 -lc10_cuda -lcudart -Wl,-rpath,"$T/lib" -o /tmp/torch_replay || exit 1
run() { # TRACE STREAMS(yes|no)
  for conf in "" "expandable_segments:True"; do for p in 1 100; do
    flag=""; [ "$2" = yes ] && flag=--streams
    PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 /tmp/torch_replay "$1" 1 --passes $p $flag 2>&1 | grep "run=0" | sed "s|^|conf=${conf:-native} streams=$2 |"
  done; done
}
{
  for t in crates/emm-trace/tests/fixtures/random/*.csv; do run "$t" yes; run "$t" no; done
  for t in crates/emm-cli/traces/*.csv crates/emm-trace/tests/fixtures/llama_generate_h100.csv crates/emm-trace/tests/fixtures/numba_particles_h200.csv crates/emm-trace/tests/fixtures/vit_infer_h200.csv crates/emm-trace/tests/fixtures/bert_h200.csv crates/emm-trace/tests/fixtures/moe_h200.csv crates/emm-trace/tests/fixtures/t5_h200.csv crates/emm-trace/tests/fixtures/detect_infer_h200.csv crates/emm-trace/tests/fixtures/deeplab_h200.csv crates/emm-trace/tests/fixtures/gpt2_beam_h200.csv .peers/h200_infer.csv .peers/h200_train_midway.csv; do run "$t" no; done
} | tee "$OUT/model_check.txt"
