"""``Tensor.record_stream`` through emm on a GPU: a tensor used on a side stream
and freed while that stream still works on it must not be handed to the next
allocation before the side stream is done.

The scenario, in its own process for each variant: ``x`` is made on the default
stream; a side stream sleeps (``torch.cuda._sleep``, one thread spinning, so the
default stream's kernels run beside it) and then adds 1 to ``x``;
``x.record_stream(side)``; ``del x``; ``y = torch.full(..., 7.0)`` of the same size
on the default stream, then the device is synchronized and ``y`` checked. The side
stream's delay is timed with events and reported (``side_ms``): a check whose side
stream finished before ``y`` was made proves nothing, and says so.

- ``emm``: ``emm.torch.install()`` with emm's own allocator object, whose
  ``recordStream`` (what PyTorch's ``Tensor.record_stream`` and its C++ callers
  reach) tells emm. ``y`` takes ``x``'s memory (the thread cache) after the default
  stream waited for the side stream, so ``y`` is all 7.
- ``emm-pluggable``: PyTorch's pluggable allocator object over emm, with
  ``Tensor.record_stream`` routed to emm in Python; ``y`` is all 7 as well.
- ``emm-unrouted``: the pluggable object without the routing (PyTorch's own
  ``record_stream``, which does nothing under a pluggable allocator): ``y`` takes
  ``x``'s memory at once and the side stream's late add makes it 8. This control
  shows that the scenario catches the race; it is expected to corrupt.
- ``native``: PyTorch's own allocator, which keeps ``x``'s block until the side
  stream's event completes.

Prints one JSON line per variant and ``record_stream_check: OK`` (exit 0) when
emm's variants and native are intact and the control corrupted; ``INCONCLUSIVE``
(exit 2) when the control's ``y`` was made only after the side stream had finished
(nothing overlapped).

    EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=python \\
        python3 python/gpu/checks/record_stream_check.py
"""

import json
import sys

from _variants import run_variant

N = 1 << 22  # floats: 16 MiB
DELAY_CYCLES = 400_000_000  # the side stream's spin: about 0.2 s at an H200's 1.98 GHz


def scenario(variant):
    import torch

    if variant != "native":
        import emm.torch as et

        et.install(native=variant == "emm")
        assert et.installed() == ("native" if variant == "emm" else "pluggable"), et.installed()
        if variant == "emm-unrouted":
            torch.Tensor.record_stream = torch.Tensor.record_stream._emm_original
    dev = torch.device("cuda:0")
    side = torch.cuda.Stream(dev)
    x = torch.zeros(N, device=dev)
    # Every kernel the scenario launches runs once first: CUDA loads kernels on
    # first launch (lazy loading), and a load while the side stream spins waits
    # for the device, which would hold the host back until the side stream is done.
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        x.add_(1)
    x.fill_(7.0)
    torch.cuda.synchronize(dev)
    start, end, made = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    torch.cuda.synchronize(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        start.record()
        torch.cuda._sleep(DELAY_CYCLES)
        x.add_(1)  # the side stream writes x only after the delay
        end.record()
    x.record_stream(side)
    xp = x.data_ptr()
    del x
    y = torch.full((N,), 7.0, device=dev)
    made.record()  # on the default stream, right after y was filled
    reused = y.data_ptr() == xp
    torch.cuda.synchronize(dev)
    wrong = int((y != 7).sum().item())
    print(json.dumps({"variant": variant, "reused_memory": reused, "wrong_elements": wrong,
                      "side_ms": round(start.elapsed_time(end), 2),
                      "y_made_ms_after_side_start": round(start.elapsed_time(made), 2)}), flush=True)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--variant":
        scenario(sys.argv[2])
        return
    results = {}
    for variant in ("emm", "emm-pluggable", "emm-unrouted", "native"):
        result, out = run_variant(__file__, variant)
        if out.returncode != 0 or result is None:
            print(out.stdout + out.stderr)
            print(f"record_stream_check: FAIL: variant {variant} exited {out.returncode}")
            sys.exit(1)
        print(json.dumps(result))
        results[variant] = result
    control = results["emm-unrouted"]
    if control["y_made_ms_after_side_start"] >= control["side_ms"] and not control["wrong_elements"]:
        # Nothing overlapped: y was made only once the side stream had finished (the
        # host reached it late), so neither a correct nor a broken allocator could
        # be told apart here.
        print("record_stream_check: INCONCLUSIVE: in the control, y was made "
              f"{control['y_made_ms_after_side_start']} ms after the side stream started, which ran "
              f"{control['side_ms']} ms: no overlap to catch")
        sys.exit(2)
    problems = []
    for variant in ("emm", "emm-pluggable"):
        if results[variant]["wrong_elements"]:
            problems.append(f"{variant}: the side stream's late write reached the next allocation")
        if not results[variant]["reused_memory"]:
            problems.append(f"{variant}: y did not take x's memory, so the check proved nothing")
    if results["native"]["wrong_elements"]:
        problems.append("native: corrupted (the scenario itself is wrong)")
    if not control["wrong_elements"]:
        problems.append("the control (record_stream not routed) did not corrupt: the scenario catches nothing")
    if problems:
        print("record_stream_check: FAIL: " + "; ".join(problems))
        sys.exit(1)
    print("record_stream_check: OK (emm's object and the routed pluggable one intact with reuse; "
          "the unrouted control corrupted; native intact)")


if __name__ == "__main__":
    main()
