#!/bin/bash
# Builds ../shared/peers/torch_replay.cpp (copied to .peers/) against the
# installed PyTorch, as DEST (/tmp/torch_replay unless given). From the
# repository root on the GPU machine:
#
#   bash python/gpu/benchmarks/build_torch_replay.sh [DEST]
set -u
DEST=${1:-/tmp/torch_replay}
T=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))") || exit 1
g++ -O2 -std=c++17 .peers/torch_replay.cpp -I"$T/include" -I/usr/local/cuda/include \
  -L"$T/lib" -L/usr/local/cuda/lib64 -lc10 -lc10_cuda -lcudart -Wl,-rpath,"$T/lib" -o "$DEST"
