#!/usr/bin/env bash
# Pause and resume beside torch_memory_saver (issue 39): builds torch_memory_saver
# from its carried source distribution (nvcc and PyTorch's headers are on the GPU
# machine), then runs python/gpu/benchmarks/pause_bench.py once per implementation per round,
# in rotated order, one process each. JSON per run and a log go to $OUT (default
# ./pause-out).
#   python/gpu/benchmarks/pause_rounds.sh [ROUNDS] [TMS_SDIST]
# ROUNDS defaults to 2; TMS_SDIST to .peers/tms/torch_memory_saver-0.0.10.tar.gz.
set -u
cd "$(dirname "$0")/../../.."
rounds=${1:-2}
sdist=${2:-.peers/tms/torch_memory_saver-0.0.10.tar.gz}
out=${OUT:-pause-out}
mkdir -p "$out"
export EMM_LIBRARY=${EMM_LIBRARY:-$PWD/gpu-bundle/lib/libemm_capi.so}
tms_dir=/tmp/tms-install
if [ ! -d "$tms_dir/torch_memory_saver" ]; then
  cuda_major=$(python3 -c 'import torch; print(torch.version.cuda.split(".")[0])')
  echo "building torch_memory_saver from $sdist for CUDA $cuda_major" | tee "$out/tms-build.log"
  TMS_CUDA_MAJOR=$cuda_major CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} \
    python3 -m pip install --no-deps --no-build-isolation --no-index --target "$tms_dir" "$sdist" \
    >> "$out/tms-build.log" 2>&1 || echo "torch_memory_saver did not build (see tms-build.log)"
fi
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then order="emm tms"; else order="tms emm"; fi
  for impl in $order; do
    log="$out/round$r-$impl.log"
    if [ "$impl" = tms ]; then
      PYTHONPATH="$tms_dir:python" timeout 300 python3 python/gpu/benchmarks/pause_bench.py --impl tms \
        --json "$out/round$r-tms.json" > "$log" 2>&1
    else
      PYTHONPATH=python timeout 300 python3 python/gpu/benchmarks/pause_bench.py --impl emm \
        --json "$out/round$r-emm.json" > "$log" 2>&1
    fi
    echo "round $r $impl: rc=$? $(tail -n1 "$log")"
  done
done
