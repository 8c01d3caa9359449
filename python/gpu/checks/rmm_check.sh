#!/bin/bash
# emm as RMM's memory resource, on a GPU machine, in one call: unpacks RMM's wheels
# (.whl/rmm/: librmm_cu13, rmm_cu13, rapids_logger; no network needed) into /tmp/site,
# builds and runs the C++ check (examples/rmm/rmm_resource_check.cu: emm::rmm_resource
# under rmm::device_buffer, device_uvector, statistics_resource_adaptor, with a
# timing beside RMM's resources), then the Python check (python/gpu/checks/rmm_check.py over
# emm.rmm.install(), once per emm manager), the pytest file python/tests/test_rmm.py
# (where pytest imports), the compiled Python path (examples/rmm/native/build.sh: a
# Cython DeviceMemoryResource over the C++ adaptor) and the Python benchmark
# (python/gpu/benchmarks/rmm_bench.py).
# Usage (repository root, after gpu-bundle/ is built): python/gpu/checks/rmm_check.sh
# Logs in $OUT (default /tmp/rmm_out); a summary on stdout; exit status 1 if a check failed.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rmm_out}
mkdir -p "$OUT"
ROOT=$PWD
LIB=$ROOT/gpu-bundle/lib
SITE=/tmp/site
export EMM_LIBRARY=$LIB/libemm_capi.so
rc=0

python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target $SITE .whl/rmm/*.whl \
  > $OUT/pip.txt 2>&1 || { echo "pip install of .whl/rmm failed:"; cat $OUT/pip.txt; exit 1; }
export PYTHONPATH=$SITE:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
INC="-I$ROOT/crates/emm-capi/include -I$SITE/librmm/include -I$SITE/librmm/include/rapids -I$SITE/rapids_logger/include"
# As RMM's CMake package configures CCCL for its users.
DEFS="-DCUB_DISABLE_NAMESPACE_MAGIC -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR -DTHRUST_DISABLE_ABI_NAMESPACE -DTHRUST_IGNORE_ABI_NAMESPACE_ERROR -DCCCL_DISABLE_PDL"
# librmm.so finds librapids_logger.so only beside itself ($ORIGIN) or on the path.
export LD_LIBRARY_PATH=$SITE/librmm/lib64:$SITE/rapids_logger/lib64:$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

{
  echo "== $(nvcc --version | tail -1); $(python3 --version); $(g++ --version | head -1)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  printf '#include <cuda/version>\nCCCL_VERSION\n' > /tmp/cccl_version.cu
  echo "CCCL seen by nvcc with RMM's include path first: $(nvcc -E -x cu $INC /tmp/cccl_version.cu 2>&1 | tail -1) (3005000 = RMM's bundled 3.5.0)"
  echo "== build examples/rmm/rmm_resource_check.cu"
  time nvcc -std=c++20 -O2 -arch=native --expt-relaxed-constexpr --expt-extended-lambda $INC $DEFS \
    examples/rmm/rmm_resource_check.cu -o /tmp/rmm_resource_check \
    -L$SITE/librmm/lib64 -lrmm -L$SITE/rapids_logger/lib64 -lrapids_logger -L$LIB -lemm_capi \
    -Xlinker -rpath=$SITE/librmm/lib64:$SITE/rapids_logger/lib64:$LIB
  echo "build rc=$?"
  echo "== run"
  timeout 120 /tmp/rmm_resource_check
  echo "rmm_resource_check rc=$?"
} > $OUT/rmm_cpp.txt 2>&1
grep -q "^rmm_resource_check: OK" $OUT/rmm_cpp.txt || rc=1

for m in pool default hostonly; do
  echo "== EMM_MEMORY_MANAGER=$m"
  EMM_MEMORY_MANAGER=$m timeout 90 python3 python/gpu/checks/rmm_check.py
  echo "rmm_check $m rc=$?"
done > $OUT/rmm_check.txt 2>&1
[ "$(grep -c '^rmm_check: OK' $OUT/rmm_check.txt)" = 3 ] || rc=1

if python3 -c "import pytest" 2>/dev/null; then
  timeout 120 python3 -m pytest -p no:cacheprovider -q -rs python/tests/test_rmm.py > $OUT/rmm_pytest.txt 2>&1
  echo "pytest rc=$?" >> $OUT/rmm_pytest.txt
  grep -q "^pytest rc=0" $OUT/rmm_pytest.txt || rc=1
else
  echo "pytest does not import on this machine: skipped" > $OUT/rmm_pytest.txt
fi

# The compiled Python path (a prototype): emm::rmm_resource under a Cython
# DeviceMemoryResource; the benchmark times it when it built.
SITE=$SITE timeout 150 examples/rmm/native/build.sh > $OUT/rmm_native.txt 2>&1
nrc=$?; echo "build.sh rc=$nrc" >> $OUT/rmm_native.txt
[ $nrc = 0 ] || [ $nrc = 3 ] || rc=1
PYTHONPATH=/tmp/emm_rmm_native:$PYTHONPATH timeout 150 python3 python/gpu/benchmarks/rmm_bench.py > $OUT/rmm_bench.txt 2>&1
echo "rmm_bench rc=$?" >> $OUT/rmm_bench.txt

echo "== C++ ($OUT/rmm_cpp.txt)"
grep -E "^(== |CCCL|build rc|FAIL|rmm_resource_check|RMM |manager|  [a-z:]|  RMM|emm at|allocate\+)|error" $OUT/rmm_cpp.txt | grep -v "^  (a message" | head -60
echo "== Python ($OUT/rmm_check.txt)"
grep -E "^(== |FAIL|rmm_check|  RMM|emm at|rmm |Traceback)" $OUT/rmm_check.txt
echo "== pytest ($OUT/rmm_pytest.txt)"
tail -3 $OUT/rmm_pytest.txt
echo "== native ($OUT/rmm_native.txt)"
grep -E "^(native|FAIL|build.sh|Traceback)|error" $OUT/rmm_native.txt | head -20
echo "== bench ($OUT/rmm_bench.txt)"
sed -n '/^path/,$p' $OUT/rmm_bench.txt
echo "rmm_check.sh: $([ $rc = 0 ] && echo OK || echo FAILED)"
exit $rc
