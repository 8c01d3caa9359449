#!/bin/bash
# `emm replay --fit` against PyTorch's real allocator under a cap: for each
# `TRACE VARIANT BYTES` line on standard input (BYTES: the model's smallest
# device, from `emm replay TRACE -m pytorch-native --fit --passes 3 --json`),
# `torch_replay TRACE 1 --passes 3 --streams --fraction F` runs at BYTES and at
# 99 % of it (F = bytes / the device's total). The model is right when the first
# runs and the second reports its out-of-memory event. Then what a process holds
# on the device besides the allocator (the CUDA context, cuBLAS and cuDNN after a
# matmul and a convolution): the default `--overhead` to state.
#
#   python/gpu/checks/fit_check.sh < answers.txt
#
# From the repository root on the GPU machine (../shared/peers/torch_replay.cpp
# copied to .peers/ beforehand, as python/gpu/benchmarks/replay_peers.sh expects).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
bash python/gpu/benchmarks/build_torch_replay.sh /tmp/torch_replay || exit 1
TOTAL=$(python3 -c "import torch; print(torch.cuda.mem_get_info()[1])")
echo "device total $TOTAL bytes"
while read -r trace variant bytes; do
  [ -z "$trace" ] && continue
  conf=""; [ "$variant" = "pytorch-expandable" ] && conf="expandable_segments:True"
  for share in 100 99; do
    f=$(python3 -c "print($bytes * $share / 100 / $TOTAL)")
    r=$(PYTORCH_CUDA_ALLOC_CONF=$conf timeout 120 /tmp/torch_replay "$trace" 1 --passes 3 --streams --fraction "$f" 2>&1 | grep "run=0")
    case "$r" in *OOM*) verdict=OOM ;; *peak_reserved*) verdict=ran ;; *) verdict="no result" ;; esac
    echo "$trace $variant at ${share}% of $bytes: $verdict ${r##*peak_reserved=}"
  done
done | tee "$OUT/fit_check.txt"
python3 - <<'EOF' | tee -a "$OUT/fit_check.txt"
import torch
free0, total = torch.cuda.mem_get_info()
a = torch.randn(4096, 4096, device="cuda")
b = (a @ a).sum()
x = torch.randn(8, 64, 56, 56, device="cuda")
w = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
y = w(x).sum()
torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
used = total - free1
reserved = torch.cuda.memory_reserved()
print(f"overhead: device used {used} bytes, PyTorch reserved {reserved}: {used - reserved} bytes besides the allocator")
EOF
