#!/bin/bash
# Managed memory on a GPU, in one call (logs in $OUT):
#  1. emm's Rust GPU tests of managed memory (gpu-bundle/bin/emm__managed_gpu) and
#     the conformance suite of each built-in manager (its managed_memory check);
#  2. python/gpu/checks/managed_check.py through emm.numba_plugin over pool, hostonly and
#     default (cuda.managed_array written by kernels and read by the host, ...);
#  3. numba-cuda's own managed-memory tests (test_managed_alloc, the managed cases
#     of test_cuda_memory, test_deallocations, test_cuda_array_interface and
#     test_warning, and the NRT tests, whose statistics live in managed arrays)
#     with Numba's default manager and through emm's plugin over pool and hostonly,
#     then a table of counts and what fails only with emm.
# Needs gpu-bundle/ from `cargo xtask gpu` (C ABI 304; its test binaries packed in
# bin.tar.xz are unpacked here) and .whl/np; about 4 minutes on an H200.
# Usage (repository root, GPU machine): python/gpu/checks/managed_suite.sh
set -u
: "${OUT:?set OUT to a directory for the logs}"
mkdir -p "$OUT"
export EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so PYTHONUNBUFFERED=1
# numba-cuda 0.30 imports np.row_stack, which NumPy 2.5 dropped: NumPy 2.3 from .whl/np.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-np .whl/np/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site-np:$PWD/python
unset NUMBA_CUDA_MEMORY_MANAGER EMM_MEMORY_MANAGER
start=$(date +%s)
status=0

echo "== 1. Rust GPU tests (gpu-bundle)"
# `cargo xtask gpu` packs the test binaries into bin.tar.xz.
[ -d gpu-bundle/bin ] || [ ! -f gpu-bundle/bin.tar.xz ] \
  || (cd gpu-bundle && python3 -c 'import tarfile; tarfile.open("bin.tar.xz").extractall(".")')
rust() {  # name, test binary, filter...
  local name=$1 bin=gpu-bundle/bin/$2; shift 2
  if [ ! -f "$bin" ]; then echo "$name: $bin missing (run cargo xtask gpu)"; status=1; return; fi
  chmod +x "$bin" 2>/dev/null
  timeout 90 "$bin" --include-ignored --test-threads=1 "$@" > "$OUT/rust_$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc $(grep -E '^test result:' "$OUT/rust_$name.log" | tail -n1)"
  [ $rc -eq 0 ] || status=1
}
rust managed_gpu emm__managed_gpu
rust conformance_default emm-default__gpu conformance
rust conformance_pool emm-pool__gpu conformance
rust conformance_hostonly emm-hostonly__gpu conformance
grep -h -E "managed_memory|FAIL" "$OUT"/rust_conformance_*.log | sort | uniq -c

echo "== 2. cuda.managed_array through emm.numba_plugin (python/gpu/checks/managed_check.py)"
for m in pool hostonly default; do
  NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin EMM_MEMORY_MANAGER=$m timeout 90 \
    python3 python/gpu/checks/managed_check.py > "$OUT/check_$m.log" 2>&1
  rc=$?
  echo "check $m: rc=$rc $(grep -c '^  ok' "$OUT/check_$m.log") checks ok; $(tail -n1 "$OUT/check_$m.log")"
  [ $rc -eq 0 ] || status=1
done

echo "== 3. numba-cuda's managed-memory tests (16 processes)"
TESTS="numba.cuda.tests.cudadrv.test_managed_alloc numba.cuda.tests.cudadrv.test_cuda_memory
  numba.cuda.tests.cudadrv.test_deallocations numba.cuda.tests.cudapy.test_cuda_array_interface
  numba.cuda.tests.cudapy.test_warning numba.cuda.tests.nrt"
suite() {  # label, environment...
  local label=$1; shift
  local t0=$(date +%s)
  env "$@" timeout ${SUITE_TIMEOUT:-150} python3 -m numba.runtests -m 16 $TESTS > "$OUT/suite_$label.log" 2>&1
  echo "suite $label: rc=$? in $(( $(date +%s) - t0 )) s"
}
suite default
suite emm-pool NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin EMM_MEMORY_MANAGER=pool
suite emm-hostonly NUMBA_CUDA_MEMORY_MANAGER=emm.numba_plugin EMM_MEMORY_MANAGER=hostonly
python3 python/gpu/checks/suite_table.py "$OUT" default emm-pool emm-hostonly | tee "$OUT/suite_table.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== managed_suite: status=$status in $(( $(date +%s) - start )) s"
exit $status
