#!/bin/bash
# Python acceptance on a GPU machine: benchmarks (ours beside the peers, one run,
# interleaved rounds), the training loop with both allocators, the CuPy, Numba and
# MemArray checks, the C++ example.
# Usage: [ROUNDS=3] [PIN=<cpu list>] [BENCH="numba torch cupy"] [CHECKS=1] python/gpu/benchmarks/accept.sh
#   (from the repository root; logs to $OUT). PIN runs every benchmark process on
#   the same CPUs (taskset), peers and ours alike; BENCH picks the frameworks timed;
#   CHECKS=0 skips the training loop, the checks and the C++ example.
set -u
export PYTHONUNBUFFERED=1 EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/rmm/*.whl 2>/dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-np .whl/np/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site-np:/tmp/site:$PWD/python
B="timeout 120 ${PIN:+taskset -c $PIN} python3"
BENCH=${BENCH:-numba torch cupy}
has() { [[ " $BENCH " == *" $1 "* ]]; }
{
  echo "== PIN=${PIN:-none} BENCH=$BENCH ROUNDS=${ROUNDS:-3}"
  if has numba; then $B .peers/py_bench.py numba; fi
  for round in $(seq ${ROUNDS:-3}); do
    echo "== round $round"
    if has numba; then
      $B .peers/py_bench.py numba-rmm-pool; $B .peers/py_bench.py numba-rmm-async
      EMM_MEMORY_MANAGER=pool $B python/gpu/benchmarks/bench.py numba-emm
      EMM_MEMORY_MANAGER=hostonly $B python/gpu/benchmarks/bench.py numba-emm
    fi
    if has torch; then $B .peers/py_bench.py torch; $B python/gpu/benchmarks/bench.py torch-emm; fi
    if has cupy; then $B .peers/py_bench.py cupy; $B python/gpu/benchmarks/bench.py cupy-emm; fi
  done
  if has numba; then
    echo "== Numba's own cost of a pair (python/gpu/benchmarks/numba_probe.py)"
    for v in null null-nofin; do $B python/gpu/benchmarks/numba_probe.py $v; done
  fi
} > $OUT/py_bench.txt 2>&1
python3 python/gpu/benchmarks/summarize.py < $OUT/py_bench.txt > $OUT/py_bench_summary.txt
[ "${CHECKS:-1}" = 0 ] && exit 0
{ echo "== torch native"; $B python/gpu/checks/torch_train.py; echo "== torch emm"; $B python/gpu/checks/torch_train.py --emm; } > $OUT/torch_train.txt 2>&1
{ $B python/gpu/checks/cupy_check.py; $B python/gpu/checks/memarray_check.py
  for m in pool hostonly; do NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin EMM_MEMORY_MANAGER=$m $B python/gpu/checks/numba_check.py; echo "numba_check $m rc=$?"; done
} > $OUT/checks.txt 2>&1
nvcc -O2 -std=c++17 examples/cpp/emm_example.cu -Icrates/emm-capi/include -Lgpu-bundle/lib -lemm_capi \
  -Xlinker -rpath=$PWD/gpu-bundle/lib -o /tmp/emm_example > $OUT/cpp.txt 2>&1 && /tmp/emm_example pool >> $OUT/cpp.txt 2>&1
echo "rc=$?" >> $OUT/cpp.txt
