#!/bin/bash
# PyTorch's real allocator on the traces the models of it are checked on
# (crates/emm-trace/tests/torch_model.rs): the random traces of
# crates/emm-trace/tests/fixtures/random/ with the stream column honoured and
# without it, and the recorded traces of the repository without it (with it:
# python/gpu/benchmarks/replay_peers.sh); native and expandable segments, 1 and 100 passes.
# One line a run: `conf=... streams=yes|no torch-caching replay=TRACE ...
# passes=N ... reserved/live=R`.
#
#   python/gpu/benchmarks/model_check.sh
#
# From the repository root on the GPU machine, ../shared/peers/torch_replay.cpp
# and the two snapshots as CSV in .peers/ (see python/gpu/benchmarks/replay_peers.sh).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash python/gpu/benchmarks/build_torch_replay.sh /tmp/torch_replay || exit 1
run() { # TRACE STREAMS(yes|no)
  for conf in "" "expandable_segments:True"; do for p in 1 100; do
    flag=""; [ "$2" = yes ] && flag=--streams
    PYTORCH_CUDA_ALLOC_CONF=$conf timeout 200 /tmp/torch_replay "$1" 1 --passes $p $flag 2>&1 | grep "run=0" | sed "s|^|conf=${conf:-native} streams=$2 |"
  done; done
}
{
  for t in crates/emm-trace/tests/fixtures/random/*.csv; do run "$t" yes; run "$t" no; done
  # The recorded traces the models are checked on, from the test's own table (a
  # snapshot as its CSV in .peers/), so a fixture added there is run here too.
  recorded=$(grep -o '"emm-[a-z]*/[^"]*\.\(csv\|pickle\)"' crates/emm-trace/tests/torch_model.rs | tr -d '"' \
    | grep -v /random/ | sort -u | sed 's|^.*/\([^/]*\)\.pickle$|.peers/\1.csv|; s|^emm-|crates/emm-|')
  [ -n "$recorded" ] || { echo "model_check.sh: no recorded traces found in torch_model.rs" >&2; exit 1; }
  for t in $recorded; do run "$t" no; done
} | tee "$OUT/model_check.txt"
