#!/bin/bash
# Python acceptance on a GPU machine: benchmarks (ours beside the peers, one run),
# the training loop with both allocators, the CuPy check, the C++ example.
# Usage: python/gpu/accept.sh  (from the repository root; logs to $OUT)
set -u
export PYTHONUNBUFFERED=1 EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/rmm/*.whl 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-np .whl/np/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site-np:/tmp/site:$PWD/python
{
  for v in numba numba-rmm-pool numba-rmm-async torch cupy; do timeout 120 python3 .peers/py_bench.py $v; done
  for v in numba-emm torch-emm cupy-emm; do timeout 120 python3 python/gpu/bench.py $v; done
  echo "== again, interleaved"
  for i in 1 2; do timeout 120 python3 .peers/py_bench.py torch; timeout 120 python3 python/gpu/bench.py torch-emm;
    timeout 120 python3 .peers/py_bench.py numba-rmm-pool; timeout 120 python3 python/gpu/bench.py numba-emm; done
} > $OUT/py_bench.txt 2>&1
{ echo "== torch native"; timeout 120 python3 python/gpu/torch_train.py; echo "== torch emm"; timeout 120 python3 python/gpu/torch_train.py --emm; } > $OUT/torch_train.txt 2>&1
{ timeout 120 python3 python/gpu/cupy_check.py; timeout 120 python3 python/gpu/memarray_check.py; } > $OUT/cupy.txt 2>&1
nvcc -O2 -std=c++17 examples/cpp/emm_example.cu -Icrates/emm-capi/include -Lgpu-bundle/lib -lemm_capi \
  -Xlinker -rpath=$PWD/gpu-bundle/lib -o /tmp/emm_example > $OUT/cpp.txt 2>&1 && /tmp/emm_example pool >> $OUT/cpp.txt 2>&1
echo "rc=$?" >> $OUT/cpp.txt
