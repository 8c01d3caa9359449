#!/bin/bash
# Builds and runs torch_pair.cpp against the PyTorch installed on the GPU machine and
# gpu-bundle/lib/libemm_capi.so: the raw pairs of every variant in one process, then
# ROUNDS (default 5) interleaved rounds of tensor pairs, one process per variant.
# With TRACES (paths of recorded traces, space-separated), instead: ROUNDS rounds
# of `torch_pair trace` over each trace (PASSES passes, default 20), one process
# per variant (VARIANTS, default: native, expandable segments, emm's object), the
# order rotated each round; every line names its round and variant.
# Usage (repository root): python/gpu/benchmarks/torch_pair.sh
set -eu
T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
ABI=$(python3 -c "import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=$ABI python/gpu/benchmarks/torch_pair.cpp -o /tmp/torch_pair \
  -I$T/include -I$T/include/torch/csrc/api/include -I/usr/local/cuda/include \
  -L$T/lib -ltorch_cuda -ltorch -ltorch_cpu -lc10_cuda -lc10 -Lgpu-bundle/lib -lemm_capi \
  -L/usr/local/cuda/lib64 -lcudart -ldl \
  -Wl,-rpath,$T/lib -Wl,-rpath,$PWD/gpu-bundle/lib
if [ -n "${TRACES:-}" ]; then
  # VARIANTS: native, expandable, emm-object, each optionally with settings for
  # its process after a colon (emm-object:EMM_POOL_THREAD_CACHE=0,EMM_POOL_STREAM_POOLS=0).
  read -r -a variants <<< "${VARIANTS:-native expandable emm-object}"
  n=${#variants[@]}
  for r in $(seq "${ROUNDS:-5}"); do
    for t in $TRACES; do
      for i in $(seq 0 $((n - 1))); do
        v=${variants[$(( (i + r) % n ))]}
        base=${v%%:*}; settings=""
        [ "$base" != "$v" ] && settings=${v#*:}
        envs=(${settings//,/ })
        if [ "$base" = expandable ]; then
          envs+=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); base=native
        fi
        out=$(env "${envs[@]}" /tmp/torch_pair trace "$base" "$t" "${PASSES:-20}" 2>&1) || true
        echo "$out" | sed "s|^|round $r $v |"
      done
    done
  done
  exit 0
fi
/tmp/torch_pair
for r in $(seq "${ROUNDS:-5}"); do
  for v in native pluggable-emm emm-object; do
    printf 'round %d ' "$r"; /tmp/torch_pair tensor "$v"
  done
done
