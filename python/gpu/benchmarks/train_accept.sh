#!/bin/bash
# Issue 12's acceptance on a GPU machine, in stages that each fit one call of the
# lent machine (10 minutes; about 30 s a process): the training benchmark beside PyTorch native and
# PyTorch with expandable segments, interleaved rounds, bucketed shapes.
#
#   python/gpu/benchmarks/train_accept.sh STAGE...     (from the repository root, after
#                                            `cargo xtask gpu`; logs to $OUT;
#                                            exits 1 when a stage failed)
#
# Stages:
#   tests   every GPU test binary of the bundle (gpu-bundle/run.sh)
#   probe   python/gpu/probes/vmm_costs.cu: what the driver's VMM calls cost;
#           vmm_kernels.cu: whether kernels run slower on VMM-mapped memory
#   gpt2    GPT-2 training, ROUNDS rounds of 48 timed steps
#   resnet50  ResNet-50 training, the same
#   infer   GPT-2 inference (variable batch, torch.no_grad), the same
#   ddp     GPT-2 under DDP on every GPU of the machine (needs 2 or more; DDP_GPUS=N
#           runs N ranks, e.g. 1: torchrun and NCCL on one GPU, with no traffic
#           between GPUs)
#   long    one round of LONG timed steps (default 400) of ResNet-50 and GPT-2:
#           the footprint over a long run, where `emm replay --passes` shows the
#           pool's drifting on the host (docs/benchmarks.md, twelfth session)
#   hooks   emm's own time inside PyTorch's allocator hooks per step of each
#           workload of HOOK_WORKLOADS (default gpt2; also gpt2-infer, resnet50),
#           for each library of HOOK_LIBS (space-separated paths to
#           libemm_capi.so built with `--features call-timing`, e.g. before and
#           after a change), one process each, interleaved over ROUNDS rounds
# ROUNDS (default 3); PIN (default every CPU) pins every process to the same CPUs;
# VARIANTS (default "native expandable emm-pool") names train_bench.py's variants.
set -u
: "${OUT:?set OUT to the folder for the logs}"
STAGES="tests, probe, gpt2, resnet50, infer, ddp, long, hooks"
[ $# -gt 0 ] || { echo "usage: $0 STAGE... ($STAGES)" >&2; exit 2; }
for stage in "$@"; do
  case $stage in
    tests|probe|gpt2|resnet50|infer|ddp|long|hooks) ;;
    *) echo "unknown stage $stage ($STAGES)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 EMM_LIBRARY=$PWD/gpu-bundle/lib/libemm_capi.so PYTHONPATH=$PWD/python
PIN=${PIN:-0-$(($(nproc) - 1))}
ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-native expandable emm-pool}
failed=0
rounds() { # name, then train_rounds.py's arguments
  local name=$1 rc; shift
  python3 python/gpu/benchmarks/train_rounds.py --pin "$PIN" --shapes bucketed --variants $VARIANTS \
    --warmup 8 --log "$OUT/$name.log" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  echo "== $name rc=$rc"
  tail -40 "$OUT/$name.txt"
  [ $rc -eq 0 ] || failed=1
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for stage in "$@"; do
  case $stage in
    tests)
      timeout 300 bash gpu-bundle/run.sh > "$OUT/tests.txt" 2>&1
      rc=$?; echo "== tests rc=$rc"; tail -45 "$OUT/tests.txt"; [ $rc -eq 0 ] || failed=1 ;;
    probe)
      { nvcc -O2 -o /tmp/vmm_costs python/gpu/probes/vmm_costs.cu -lcuda &&
        timeout 120 taskset -c 2 /tmp/vmm_costs; } > "$OUT/vmm_costs.txt" 2>&1
      rc=$?; echo "== probe vmm_costs rc=$rc"; tail -30 "$OUT/vmm_costs.txt"; [ $rc -eq 0 ] || failed=1
      { nvcc -O2 -o /tmp/vmm_kernels python/gpu/probes/vmm_kernels.cu -lcuda &&
        timeout 180 /tmp/vmm_kernels 4 15; } > "$OUT/vmm_kernels.txt" 2>&1
      rc=$?; echo "== probe vmm_kernels rc=$rc"; tail -15 "$OUT/vmm_kernels.txt"; [ $rc -eq 0 ] || failed=1 ;;
    gpt2|resnet50)
      rounds "$stage" --rounds "$ROUNDS" --workloads "$stage" --steps 48 --timeout 120 ;;
    infer)
      rounds gpt2-infer --rounds "$ROUNDS" --workloads gpt2-infer --steps 48 --timeout 120 ;;
    ddp)
      gpus=${DDP_GPUS:-$(nvidia-smi -L | wc -l)}
      case $gpus in ''|*[!0-9]*|0) echo "== ddp: no ranks to run (DDP_GPUS, else the GPU count, is '$gpus'; 1 or more)"; failed=1; continue ;; esac
      if [ "$gpus" -lt 2 ] && [ -z "${DDP_GPUS:-}" ]; then echo "== ddp skipped: $gpus GPU on this machine (DDP_GPUS=1 runs one rank)"; failed=1; continue; fi
      rounds ddp --rounds "$ROUNDS" --ddp "$gpus" --workloads gpt2 --steps 48 --timeout 180 ;;
    hooks)
      [ -n "${HOOK_LIBS:-}" ] || { echo "== hooks: set HOOK_LIBS to call-timing builds of libemm_capi.so"; failed=1; continue; }
      for w in ${HOOK_WORKLOADS:-gpt2}; do
        for r in $(seq "$ROUNDS"); do
          i=0
          for lib in $HOOK_LIBS; do
            i=$((i + 1))
            EMM_LIBRARY=$lib VARIANTS=emm-pool rounds "hooks-$w-$i-round$r" --rounds 1 --workloads "$w" --steps 48 --timeout 120
            echo "   (that was $lib)"
          done
        done
      done ;;
    long)
      rounds long-resnet50 --rounds 1 --workloads resnet50 --steps "${LONG:-400}" --timeout 200
      rounds long-gpt2 --rounds 1 --workloads gpt2 --steps "${LONG:-400}" --timeout 200 ;;
  esac
done
exit $failed
