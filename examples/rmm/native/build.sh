#!/bin/bash
# Builds examples/rmm/native/emm_rmm_native.pyx (emm::rmm_resource as a Python RMM
# resource: a DeviceMemoryResource subclass, no Python per allocation) into
# $BUILD/emm_rmm_native<ext>, then runs examples/rmm/native/smoke.py.
# Needs: Cython (importable, or a wheel in .whl/rmm/), Python's headers, a C++20
# compiler, the CUDA runtime's headers and static library (CUDA_HOME, default: the
# toolkit of nvcc), RMM installed (SITE, default /tmp/site: the wheels of .whl/rmm/)
# and libemm_capi.so (LIB, default gpu-bundle/lib).
# Usage (repository root): examples/rmm/native/build.sh   (exit 3: a prerequisite is missing)
set -u
ROOT=$PWD
SITE=${SITE:-/tmp/site}
LIB=${LIB:-$ROOT/gpu-bundle/lib}
BUILD=${BUILD:-/tmp/emm_rmm_native}
CXX=${CXX:-g++}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")}
mkdir -p "$BUILD"
export PYTHONPATH=$SITE:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import Cython" 2>/dev/null; then
  w=$(ls .whl/rmm/cython-*.whl 2>/dev/null | head -1)
  [ -n "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "$BUILD/cython" "$w"
  export PYTHONPATH=$BUILD/cython:$PYTHONPATH
fi
python3 -c "import Cython" 2>/dev/null || { echo "native: skipped: Cython is not importable (pip install cython, or put its wheel in .whl/rmm/)"; exit 3; }
PYINC=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])")
[ -f "$PYINC/Python.h" ] || { echo "native: skipped: no Python.h in $PYINC (install python3-dev)"; exit 3; }
[ -f "$CUDA_HOME/include/cuda_runtime_api.h" ] || { echo "native: skipped: no CUDA headers in $CUDA_HOME/include"; exit 3; }
CUDA_PXD=$(python3 -c "import cuda.bindings, os; print(os.path.dirname(os.path.dirname(os.path.dirname(cuda.bindings.__file__))))")
EXT=$(python3 -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
CUDA_LIBDIR=$CUDA_HOME/lib64; [ -d "$CUDA_LIBDIR" ] || CUDA_LIBDIR=$CUDA_HOME/lib
set -e
python3 -m cython -3 --cplus -I "$SITE" -I "$CUDA_PXD" examples/rmm/native/emm_rmm_native.pyx -o "$BUILD/emm_rmm_native.cpp"
# RMM's bundled CCCL (include/rapids) before the toolkit's; the runtime linked
# statically, as librmm itself links it.
"$CXX" -std=c++20 -O2 -shared -fPIC -w -I"$PYINC" -I"$ROOT/crates/emm-capi/include" \
  -I"$SITE/librmm/include" -I"$SITE/librmm/include/rapids" -I"$SITE/rapids_logger/include" -I"$CUDA_HOME/include" \
  -DCUB_DISABLE_NAMESPACE_MAGIC -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR -DTHRUST_DISABLE_ABI_NAMESPACE -DTHRUST_IGNORE_ABI_NAMESPACE_ERROR \
  "$BUILD/emm_rmm_native.cpp" -o "$BUILD/emm_rmm_native$EXT" \
  -Wl,--no-as-needed -L"$SITE/librmm/lib64" -lrmm -L"$SITE/rapids_logger/lib64" -lrapids_logger -L"$LIB" -lemm_capi \
  -Wl,--as-needed -L"$CUDA_LIBDIR" -lcudart_static -ldl -lrt -lpthread \
  -Wl,-rpath,"$SITE/librmm/lib64:$SITE/rapids_logger/lib64:$LIB"
# (librapids_logger is named here so that the loader, which maps direct dependencies
# first, finds it through this rpath before librmm.so, whose RUNPATH is only $ORIGIN,
# asks for it: the module then imports before or without `import rmm`.)
echo "native: built $BUILD/emm_rmm_native$EXT"
PYTHONPATH=$BUILD:$PYTHONPATH python3 examples/rmm/native/smoke.py
