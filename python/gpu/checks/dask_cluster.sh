#!/bin/bash
# A Dask-CUDA cluster through emm, on a GPU machine, in one call (no network needed):
# unpacks the carried wheels (.whl/dask/: dask, distributed, dask-cuda and their pure
# dependencies; .whl/rmm/ too when present, so RMM is routed through emm as well) into
# /tmp/site (or .whl/site.tar.xz, those wheels already unpacked into a folder site/
# and packed with xz), checks that what dask-cuda imports is there (cuda.core, pynvml), then runs
# python/gpu/checks/dask_cluster.py (arguments passed on) with emm's library from gpu-bundle/
# (or the one a set EMM_LIBRARY names).
# Usage (repository root): python/gpu/checks/dask_cluster.sh [--rmm off] [--reps N] ...
# Output: PASS/FAIL lines and a summary on stdout; $OUT/dask_cluster.json (default
# /tmp/dask_out); exit status 1 if a check failed.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dask_out}
mkdir -p "$OUT"
ROOT=$PWD
SITE=/tmp/site
# Site rule: no NVLink multicast; the workers inherit these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export EMM_LIBRARY=${EMM_LIBRARY:-$ROOT/gpu-bundle/lib/libemm_capi.so}
wheels=(.whl/dask/*.whl)
# numba-cuda 0.30 fails to import under the image's NumPy 2.5 (np.row_stack): NumPy
# 2.3 from .whl/np (../shared/peers/wheels.sh) when it was carried.
compgen -G ".whl/np/numpy-*.whl" > /dev/null && wheels+=(.whl/np/numpy-*.whl)
[ -d .whl/rmm ] && wheels+=(.whl/rmm/*.whl)
if [ -f .whl/site.tar.xz ]; then
  # The same wheels unpacked here and packed as one xz tarball of a folder `site/`
  # (a third of their size: the carry limit holds it beside the checkout). Made
  # where the wheels were downloaded (a wheel is a zip of what its install puts
  # in site-packages):
  #   mkdir site && for w in .whl/dask/*.whl .whl/np/numpy-*.whl .whl/rmm/*.whl; do
  #     unzip -q -o "$w" -d site; done && tar -cJf .whl/site.tar.xz site
  wheels=(site.tar.xz)
  rm -rf $SITE && mkdir -p $SITE && tar -xJf .whl/site.tar.xz -C $SITE --strip-components=1 \
    || { echo "unpacking .whl/site.tar.xz failed"; exit 1; }
  [ -d $SITE/dask ] && [ -d $SITE/distributed ] \
    || { echo ".whl/site.tar.xz holds no site/dask and site/distributed (pack the folder as \`tar -cJf .whl/site.tar.xz site\`)"; exit 1; }
else
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target $SITE "${wheels[@]}" \
    > $OUT/pip.txt 2>&1 || { echo "pip install of the wheels failed:"; cat $OUT/pip.txt; exit 1; }
fi
export PYTHONPATH=$SITE:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
# librmm.so finds librapids_logger.so beside itself or on the path (as rmm_check.sh).
export LD_LIBRARY_PATH=$SITE/librmm/lib64:$SITE/rapids_logger/lib64:$ROOT/gpu-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "== $(python3 --version); wheels: ${wheels[*]##*/}"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
python3 -c "import cuda.core, pynvml, numba_cuda, cupy; print('cuda.core', cuda.core.__version__, '| numba-cuda', numba_cuda.__version__, '| cupy', cupy.__version__)" \
  || { echo "dask-cuda needs cuda.core and pynvml (nvidia-ml-py); the checks need numba-cuda and CuPy"; exit 1; }
exec python3 python/gpu/checks/dask_cluster.py --out "$OUT" "$@"
