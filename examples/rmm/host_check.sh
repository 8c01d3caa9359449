#!/bin/bash
# emm/rmm_resource.hpp without a GPU: builds examples/rmm/host_check.cpp with the host
# compiler against RMM's headers (librmm wheel: RMM and its bundled CCCL) and the CUDA
# runtime's headers (nvidia-cuda-runtime and nvidia-cuda-crt wheels), and runs it over
# emm-standin. No CUDA toolkit, no GPU.
#
# Usage (repository root, after `cargo build -p emm-capi -p emm-standin`):
#   examples/rmm/host_check.sh
# Wheels come from .whl/rmm/ (librmm_cu13, rapids_logger) and $WHEELS
# (default target/rmm-host-check/wheels); those missing are fetched with
# `pip download` (about 8 MB). CXX (default g++) compiles; TARGET (default
# target/debug) holds libemm_capi.so and libemm_standin.so.
set -euo pipefail
PY=${PYTHON:-python3}
CXX=${CXX:-g++}
TARGET=${TARGET:-target/debug}
WORK=target/rmm-host-check
WHEELS=${WHEELS:-$WORK/wheels}
mkdir -p "$WHEELS" "$WORK/unpacked"

for lib in libemm_capi.so libemm_standin.so; do
  [ -f "$TARGET/$lib" ] || { echo "host_check.sh: $TARGET/$lib is missing; run cargo build -p emm-capi -p emm-standin"; exit 2; }
done
TARGET=$(cd "$TARGET" && pwd)

wheel() {  # wheel <glob> <pip requirement>: the path of a wheel, downloaded when missing
  local found
  found=$(ls .whl/rmm/$1 "$WHEELS"/$1 2>/dev/null | head -1 || true)
  if [ -z "$found" ]; then
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$WHEELS" "$2" >&2
    found=$(ls "$WHEELS"/$1 | head -1)
  fi
  echo "$found"
}
U=$(cd "$WORK/unpacked" && pwd)
for spec in "librmm_cu13-26.10*.whl|librmm-cu13==26.10.*" "rapids_logger-0.3*.whl|rapids-logger==0.3.*" \
            "nvidia_cuda_runtime-13*.whl|nvidia-cuda-runtime==13.*" "nvidia_cuda_crt-13*.whl|nvidia-cuda-crt==13.*"; do
  w=$(wheel "${spec%%|*}" "${spec#*|}")
  "$PY" -m zipfile -e "$w" "$U"
done
CUDA_INC=$U/nvidia/cu13/include
CUDA_LIB=$U/nvidia/cu13/lib
[ -e "$CUDA_LIB/libcudart.so" ] || ln -sf libcudart.so.13 "$CUDA_LIB/libcudart.so"

"$CXX" -std=c++20 -O1 -Wall -Wextra -Werror \
  -Icrates/emm-capi/include -I$U/librmm/include -I$U/librmm/include/rapids -I$U/rapids_logger/include -I$CUDA_INC \
  -DCUB_DISABLE_NAMESPACE_MAGIC -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR -DTHRUST_DISABLE_ABI_NAMESPACE -DTHRUST_IGNORE_ABI_NAMESPACE_ERROR \
  examples/rmm/host_check.cpp -o $WORK/host_check \
  -L$U/librmm/lib64 -lrmm -L$U/rapids_logger/lib64 -lrapids_logger -L$TARGET -lemm_capi -L$CUDA_LIB -lcudart -ldl \
  -Wl,-rpath,$U/librmm/lib64:$U/rapids_logger/lib64:$TARGET:$CUDA_LIB
echo "host_check.sh: built with $("$CXX" --version | head -1); running over emm-standin (host memory, not a GPU)"
# librmm.so finds librapids_logger.so only beside itself ($ORIGIN), or on the path.
LD_LIBRARY_PATH=$U/rapids_logger/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  EMM_CUDA_DRIVER=$TARGET/libemm_standin.so $WORK/host_check
