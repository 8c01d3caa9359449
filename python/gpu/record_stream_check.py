"""``Tensor.record_stream`` through emm on a GPU: a tensor used on a side stream
and freed while that stream still works on it must not be handed to the next
allocation before the side stream is done.

The scenario, in its own process for each variant: ``x`` is made on the default
stream; a side stream sleeps (``torch.cuda._sleep``) and then adds 1 to ``x``;
``x.record_stream(side)``; ``del x``; ``y = torch.full(..., 7.0)`` of the same size
on the default stream, then the device is synchronized and ``y`` checked.

- ``emm``: ``emm.torch.install()``, which routes ``record_stream`` to emm. ``y``
  takes ``x``'s memory (the thread cache) after the default stream waited for the
  side stream, so ``y`` is all 7.
- ``emm-unrouted``: the same without the routing (PyTorch's own ``record_stream``,
  which does nothing under a pluggable allocator): ``y`` takes ``x``'s memory at
  once and the side stream's late add makes it 8. This control shows that the
  scenario catches the race; it is expected to corrupt.
- ``native``: PyTorch's own allocator, which keeps ``x``'s block until the side
  stream's event completes.

Prints one JSON line per variant and ``record_stream_check: OK`` (exit 0) when emm
and native are intact and the control corrupted.

    EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=python \\
        python3 python/gpu/record_stream_check.py
"""

import json
import os
import subprocess
import sys

N = 1 << 22  # floats: 16 MiB
SLEEP_CYCLES = 400_000_000  # about 0.2 s at 2 GHz


def scenario(variant):
    import torch

    if variant != "native":
        import emm.torch as et

        et.install()
        if variant == "emm-unrouted":
            torch.Tensor.record_stream = torch.Tensor.record_stream._emm_original
    dev = torch.device("cuda:0")
    side = torch.cuda.Stream(dev)
    x = torch.zeros(N, device=dev)
    torch.cuda.synchronize(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.add_(1)
    x.record_stream(side)
    xp = x.data_ptr()
    del x
    y = torch.full((N,), 7.0, device=dev)
    reused = y.data_ptr() == xp
    torch.cuda.synchronize(dev)
    wrong = int((y != 7).sum().item())
    print(json.dumps({"variant": variant, "reused_memory": reused, "wrong_elements": wrong}), flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--variant":
        scenario(sys.argv[2])
        return
    results = {}
    for variant in ("emm", "emm-unrouted", "native"):
        out = subprocess.run([sys.executable, __file__, "--variant", variant], capture_output=True, text=True,
                             env=dict(os.environ), check=False)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
        if out.returncode != 0 or line is None:
            print(out.stdout + out.stderr)
            print(f"record_stream_check: FAIL: variant {variant} exited {out.returncode}")
            sys.exit(1)
        print(line)
        results[variant] = json.loads(line)
    problems = []
    if results["emm"]["wrong_elements"]:
        problems.append("emm: the side stream's late write reached the next allocation")
    if not results["emm"]["reused_memory"]:
        problems.append("emm: y did not take x's memory, so the check proved nothing")
    if results["native"]["wrong_elements"]:
        problems.append("native: corrupted (the scenario itself is wrong)")
    if not results["emm-unrouted"]["wrong_elements"]:
        problems.append("the control (record_stream not routed) did not corrupt: the scenario catches nothing")
    if problems:
        print("record_stream_check: FAIL: " + "; ".join(problems))
        sys.exit(1)
    print("record_stream_check: OK (emm intact with reuse; the unrouted control corrupted; native intact)")


if __name__ == "__main__":
    main()
