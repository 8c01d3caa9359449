#!/usr/bin/env bash
# numba_long.py on the GPU machine, whose NumPy Numba cannot use: NumPy 2.3
# from a wheel carried in `.whl/np` (`../shared/peers/wheels.sh` fetches it),
# and emm's library carried compressed, since the tracked tree, the wheel and
# the whole bundle pass the device tool's 64 MiB. Here, first:
#
#     cargo xtask gpu && xz -9 -c gpu-bundle/lib/libemm_capi.so > .whl/libemm_capi.so.xz
#
# then on the device, from the repository root, carrying `.whl`:
#
#     bash python/gpu/benchmarks/numba_long_gpu.sh --batches 400 --rounds 5 \
#         --variants numba emm emm-novmm emm-novmm:EMM_POOL_INITIAL_SIZE=1102M --log "$OUT/numba.log"
#
# Arguments go to numba_long.py as they are.
set -euo pipefail
cd "$(dirname "$0")/../../.."
lib=$(mktemp -d)
trap 'rm -rf "$lib"' EXIT
wheel=(.whl/np/numpy-*.whl)
[ -f "${wheel[0]}" ] || { echo "numba_long_gpu.sh: no NumPy wheel in .whl/np (carry .whl)" >&2; exit 2; }
[ -f .whl/libemm_capi.so.xz ] || { echo "numba_long_gpu.sh: no .whl/libemm_capi.so.xz (see the header)" >&2; exit 2; }
python3 -m pip install -q --no-deps --disable-pip-version-check --target "$lib/np" "${wheel[0]}"
xz -dc .whl/libemm_capi.so.xz > "$lib/libemm_capi.so"
PYTHONPATH="$lib/np:python" EMM_LIBRARY="$lib/libemm_capi.so" \
    python3 python/gpu/benchmarks/numba_long.py "$@"
