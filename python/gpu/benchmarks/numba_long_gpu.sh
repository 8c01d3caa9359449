#!/usr/bin/env bash
# numba_long.py on the GPU machine, whose NumPy numba-cuda cannot use (it lacks
# `np.row_stack`): NumPy 2.3 and emm's library travel compressed in `.whl/`,
# since the tracked tree and the NumPy wheel pass the 64 MiB a device call
# carries. Here, first (after `cargo xtask gpu`; the wheel from
# `../shared/peers/wheels.sh` in `.whl/np`):
#
#     bash python/gpu/benchmarks/numba_long_gpu.sh --pack
#
# which writes `.whl/np.tar.xz` (the wheel without its tests and stubs, 8.9 MB)
# and `.whl/libemm_capi.so.xz`. Then on the device, from the repository root,
# carrying those two files:
#
#     bash python/gpu/benchmarks/numba_long_gpu.sh --batches 400 --rounds 5 \
#         --variants numba emm emm-novmm emm-novmm:EMM_POOL_INITIAL_SIZE=1102M --log "$OUT/numba.log"
#
# Arguments go to numba_long.py as they are (run 333 ran it this way, by hand).
set -euo pipefail
cd "$(dirname "$0")/../../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "${1:-}" = "--pack" ]; then
    wheel=(.whl/np/numpy-*.whl)
    [ -f "${wheel[0]}" ] || { echo "numba_long_gpu.sh: no NumPy wheel in .whl/np" >&2; exit 2; }
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "${wheel[0]}" "$tmp"
    rm -rf "$tmp"/numpy/tests "$tmp"/numpy/*/tests "$tmp"/numpy/f2py "$tmp"/numpy/typing \
        "$tmp"/numpy/_pyinstaller "$tmp"/numpy/doc
    find "$tmp" -name '*.pyi' -delete
    (cd "$tmp" && XZ_OPT=-9 tar -cJf - numpy numpy.libs numpy-*.dist-info) > .whl/np.tar.xz
    xz -9 -c gpu-bundle/lib/libemm_capi.so > .whl/libemm_capi.so.xz
    ls -l .whl/np.tar.xz .whl/libemm_capi.so.xz
    exit 0
fi
for f in .whl/np.tar.xz .whl/libemm_capi.so.xz; do
    [ -f "$f" ] || { echo "numba_long_gpu.sh: no $f (carry it; see the header)" >&2; exit 2; }
done
mkdir -p "$tmp/np"
tar -xJf .whl/np.tar.xz -C "$tmp/np"
xz -dc .whl/libemm_capi.so.xz > "$tmp/libemm_capi.so"
PYTHONPATH="$tmp/np:python" EMM_LIBRARY="$tmp/libemm_capi.so" \
    python3 python/gpu/benchmarks/numba_long.py "$@"
