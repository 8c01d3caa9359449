#!/bin/bash
# Traces kept outside the repository (a held-out set) through PyTorch's real
# allocator, expandable segments and native, and through emm's pool, all on the
# GPU, PASSES passes each (100 unless set), JOBS replays at a time (12 unless
# set: footprints only, so processes may share the GPU; the times printed are
# not a benchmark). One line a replay on standard output (a replay that fails or
# times out: its exit status):
#   torch CONF TRACE peak_live=... peak_reserved=... reserved/live=...
#   emm TRACE ... (the pool's line of `emm replay`'s table: pass 1 and the last)
#
#   python/gpu/benchmarks/heldout_peers.sh SET.tar.xz ...   # on the GPU machine
#
# Each SET.tar.xz holds a folder of CSV traces (python/tools/record_cpu_trace.py
# makes them); ../shared/peers/torch_replay.cpp is expected at
# .peers/torch_replay.cpp and gpu-bundle/emm built by `cargo xtask gpu`.
set -u
PASSES=${PASSES:-100}; JOBS=${JOBS:-12}
D=$(mktemp -d); trap 'rm -rf "$D"' EXIT
for s in "$@"; do tar -xJf "$s" -C "$D" || exit 1; done
bash python/gpu/benchmarks/build_torch_replay.sh "$D/torch_replay" || exit 1
export D PASSES
find "$D" -name '*.csv' | sort | while read -r t; do echo "$t expandable_segments:True"; echo "$t native"; done |
  xargs -P "$JOBS" -n 2 sh -c 'n=$(basename "$(dirname "$0")")/$(basename "$0"); c=$1; [ "$c" = native ] && c=;
    l=$(PYTORCH_CUDA_ALLOC_CONF=$c timeout 300 "$D/torch_replay" "$0" 1 --passes "$PASSES" --streams 2>&1 | grep "run=0");
    [ -n "$l" ] && echo "$l" | sed "s|^torch-caching replay=[^ ]*|torch ${1%%_*} $n|" || echo "torch ${1%%_*} $n: no result"'
# (`emm replay`'s table shortens a long path: the line is named here instead.)
find "$D" -name '*.csv' | sort | xargs -P "$JOBS" -n 1 sh -c 'n=$(basename "$(dirname "$0")")/$(basename "$0");
    timeout 300 gpu-bundle/emm replay "$0" -m pool --passes "$PASSES" > "$0.emm" 2>&1 || echo "emm $n: rc=$?";
    grep " pool " "$0.emm" | head -1 | sed "s|^[^ ]*|emm $n|"'
