#!/bin/bash
# numba-cuda's own CUDA test suite with a baseline manager and with emm's plugin
# (over the manager named in $1: pool or hostonly), in one call; logs in $OUT.
# Baseline ($2): default (Numba's own manager, the default), rmm (RMM's plugin over
# cudaMalloc) or rmm-pool (RMM's plugin over an RMM pool).
# Usage (repository root, GPU machine): python/gpu/checks/suite.sh pool [default|rmm|rmm-pool]
set -u
which=${1:-pool}; base=${2:-default}
export EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so LOG_DIR=$OUT SUITE_TIMEOUT=${SUITE_TIMEOUT:-280}
unset NUMBA_CUDA_MEMORY_MANAGER
case $base in
  default) bash .peers/suite.sh default 16 ;;
  rmm) NUMBA_CUDA_MEMORY_MANAGER=rmm.allocators.numba bash .peers/suite.sh rmm 16 ;;
  rmm-pool) NUMBA_CUDA_MEMORY_MANAGER=rmm_pool_plugin PYTHONPATH=$PWD/python/gpu/checks bash .peers/suite.sh rmm-pool 16 ;;
  *) echo "unknown baseline $base"; exit 2 ;;
esac > $OUT/suite_${base}_summary.txt 2>&1
NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin EMM_MEMORY_MANAGER=$which PYTHONPATH=$PWD/python \
  bash .peers/suite.sh emm-$which 16 > $OUT/suite_emm-${which}_summary.txt 2>&1
for f in $base emm-$which; do grep -E "^(FAIL|ERROR):" $OUT/suite_$f.log | sed 's/ (.*//' | sort > $OUT/list_$f.txt; done
echo "== only with emm-$which:"; comm -13 $OUT/list_$base.txt $OUT/list_emm-$which.txt
echo "== only with $base:"; comm -23 $OUT/list_$base.txt $OUT/list_emm-$which.txt
cat $OUT/suite_*_summary.txt
