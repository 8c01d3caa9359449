"""CUDA graph capture under emm on a GPU: refused, because emm keeps no private
pool for a graph's memory yet, and what the refusal prevents.

The scenario, in its own process for each variant: a graph is captured that
makes intermediates (freed during the capture) and writes its output; after the
capture, 64 tensors are made and filled with 5; the graph is replayed; every one
of those tensors must still be all 5.

- ``native``: PyTorch's own allocator, whose private graph pool keeps the
  capture's memory: the capture runs and nothing is overwritten.
- ``emm``: emm's own allocator object: ``torch.cuda.graph`` raises
  ``RuntimeError`` with emm's reason before the capture begins.
- ``emm-pluggable``: PyTorch's pluggable object over emm: raises as well.
- ``emm-pluggable-unguarded``: the same with PyTorch's own ``graph.__enter__`` and
  ``capture_begin`` put back (the control): the capture runs with no pool to keep its memory. On the
  H200 of run 124 the process died of an illegal memory access at the first
  synchronization after the capture; otherwise the replay would write into the
  tensors made after it.

Prints one JSON line per variant and ``cuda_graph_check: OK`` (exit 0) when
native is intact and both emm variants refused; the control's fate is reported
(corrupted, died, or no harm seen).

    EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=python \\
        python3 python/gpu/cuda_graph_check.py
"""

import json
import sys

from _variants import run_variant

N = 1 << 20  # floats per tensor


def scenario(variant):
    import torch

    if variant != "native":
        import emm.torch as et

        et.install(native=variant == "emm")
        if variant == "emm-pluggable-unguarded":
            torch.cuda.graph.__enter__ = torch.cuda.graph.__enter__._emm_original
            torch.cuda.CUDAGraph.capture_begin = torch.cuda.CUDAGraph.capture_begin._emm_original
    dev = torch.device("cuda:0")
    static_in = torch.ones(N, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):  # warm-up, as PyTorch's graph examples do
        for _ in range(2):
            ((static_in * 2).relu() + 1).sum()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    result = {"variant": variant}
    try:
        with torch.cuda.graph(graph):
            a = static_in * 3  # intermediates, freed during the capture
            b = a.relu() + 7
            c = b * b
            static_out = c.sum()
            del a, b, c
    except RuntimeError as e:
        result.update(captured=False, error=str(e).splitlines()[0][:200])
        print(json.dumps(result), flush=True)
        return
    torch.cuda.synchronize(dev)
    others = [torch.full((N,), 5.0, device=dev) for _ in range(64)]
    torch.cuda.synchronize(dev)
    static_in.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize(dev)
    wrong = sum(int((t != 5).sum().item()) for t in others)
    want = float(N * (2 * 3 + 7) ** 2)
    result.update(captured=True, wrong_elements_after_replay=wrong,
                  output_right=abs(float(static_out) - want) <= want * 1e-5)
    print(json.dumps(result), flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--variant":
        scenario(sys.argv[2])
        return
    results = {}
    for variant in ("native", "emm", "emm-pluggable", "emm-pluggable-unguarded"):
        result, out = run_variant(__file__, variant)
        if result is None:
            print(out.stdout + out.stderr[-3000:])
            errors = [ln for ln in out.stderr.splitlines() if "Error" in ln]
            results[variant] = {"variant": variant, "exit": out.returncode,
                                "error": errors[-1][:200] if errors else ""}
            print(json.dumps(results[variant]))
            continue
        print(json.dumps(result))
        results[variant] = result
    problems = []
    native = results["native"]
    if not native.get("captured") or native.get("wrong_elements_after_replay") or not native.get("output_right"):
        problems.append(f"native: {native}")
    for variant in ("emm", "emm-pluggable"):
        r = results[variant]
        if r.get("captured", True) or "private memory pools for CUDA graphs" not in r.get("error", ""):
            problems.append(f"{variant} did not refuse with emm's reason: {r}")
    if problems:
        print("cuda_graph_check: FAIL: " + "; ".join(problems))
        sys.exit(1)
    control = results["emm-pluggable-unguarded"]
    if control.get("wrong_elements_after_replay"):
        seen = f"the unguarded control corrupted {control['wrong_elements_after_replay']} elements"
    elif "exit" in control:
        seen = f"the unguarded control's process died: {control['error']}"
    else:
        seen = f"the unguarded control showed no harm this time ({control})"
    print(f"cuda_graph_check: OK (native intact; emm's object and the pluggable object refused; {seen})")


if __name__ == "__main__":
    main()
