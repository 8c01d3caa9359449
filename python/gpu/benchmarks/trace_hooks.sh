#!/bin/bash
# Builds and runs trace_hooks.cpp against the PyTorch installed on the GPU machine and
# gpu-bundle/lib/libemm_capi.so. Usage (repository root):
#   python/gpu/benchmarks/trace_hooks.sh [TRACE.csv ...]   (default: the recorded H200 traces)
set -eu
T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
ABI=$(python3 -c "import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
LIB=${EMM_LIBRARY:-$PWD/gpu-bundle/lib/libemm_capi.so}
g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=$ABI python/gpu/benchmarks/trace_hooks.cpp -o /tmp/trace_hooks \
  -I$T/include -I$T/include/torch/csrc/api/include -I/usr/local/cuda/include \
  -L$T/lib -ltorch_cuda -ltorch -ltorch_cpu -lc10_cuda -lc10 "$LIB" \
  -Wl,-rpath,$T/lib -Wl,-rpath,$(dirname "$LIB")
if [ $# -eq 0 ]; then set -- crates/emm-cli/traces/{resnet50,gpt2,gpt2_infer,llama}_h200.csv; fi
# One process per trace: every allocator starts each trace from empty.
for trace in "$@"; do /tmp/trace_hooks "$trace"; done
