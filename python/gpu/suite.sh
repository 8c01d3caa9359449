#!/bin/bash
# numba-cuda's own CUDA test suite with the default manager and with emm's plugin
# (over the manager named in $1, e.g. pool or hostonly), in one call; logs in $OUT.
# Usage (repository root, GPU machine): python/gpu/suite.sh pool
set -u
which=${1:-pool}
export EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so LOG_DIR=$OUT SUITE_TIMEOUT=${SUITE_TIMEOUT:-280}
unset NUMBA_CUDA_MEMORY_MANAGER
bash .peers/suite.sh default 16 > $OUT/suite_default_summary.txt 2>&1
NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin EMM_MEMORY_MANAGER=$which PYTHONPATH=$PWD/python \
  bash .peers/suite.sh emm-$which 16 > $OUT/suite_emm-${which}_summary.txt 2>&1
for f in default emm-$which; do grep -E "^(FAIL|ERROR):" $OUT/suite_$f.log | sed 's/ (.*//' | sort > $OUT/list_$f.txt; done
echo "== only with emm-$which:"; comm -13 $OUT/list_default.txt $OUT/list_emm-$which.txt
echo "== only with default:"; comm -23 $OUT/list_default.txt $OUT/list_emm-$which.txt
cat $OUT/suite_*_summary.txt
