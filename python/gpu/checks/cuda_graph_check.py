"""CUDA graph capture under emm on a GPU, beside PyTorch's own allocator.

Each variant runs in its own process:

- ``native``: PyTorch's own allocator and its private graph pools.
- ``emm``: emm's own allocator object, which keeps a private pool of emm's for
  each capture (``emm_torch_graph_pool_*``).
- ``emm-pluggable``: PyTorch's pluggable object over emm, which cannot keep one:
  ``torch.cuda.graph`` must raise with emm's reason.
- ``emm-pluggable-unguarded``: the same with PyTorch's own ``graph.__enter__`` and
  ``capture_begin`` put back (the control): the capture runs with no pool to
  keep its memory, so the replay writes into memory handed out after it (or the
  process dies of an illegal memory access, as on the H200 of run 124).

What ``native`` and ``emm`` run:

1. **Intermediates.** A graph makes intermediates (freed during the capture)
   and writes its output; after the capture 64 tensors are made and filled with
   5; the graph is replayed; every one of them must still be all 5 and the
   output right.
2. **A whole training step** (PyTorch's "whole network capture": an MLP,
   forward, backward and a capturable Adam step in one graph, after three
   warm-up steps), replayed on 20 batches copied into its static input, against
   the same warm-up and 20 steps run eagerly from the same weights in the same
   process: the losses must agree.
3. **make_graphed_callables** on a module (forward and backward graphs sharing
   one pool), trained 10 steps, against eager.
4. **Release.** The graphs are dropped and ``torch.cuda.empty_cache()`` called:
   emm's memory reserved must fall back to within 64 MiB of native's (or of
   what it was before the graphs), and ``torch.cuda.memory_reserved()`` must
   have counted the graphs' memory while they lived.
5. ``torch.compile(mode="reduce-overhead")`` (CUDA graph trees): reported, not
   required (it needs Triton and more of the allocator's interface).

Prints one JSON line per variant and ``cuda_graph_check: OK`` (exit 0) when
native and emm pass 1-4 and the pluggable object refused.

    EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=python \\
        python3 python/gpu/checks/cuda_graph_check.py
"""

import json
import sys

from _variants import run_variant

N = 1 << 20  # floats per tensor


def intermediates(torch, dev):
    static_in = torch.ones(N, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):  # warm-up, as PyTorch's graph examples do
        for _ in range(2):
            ((static_in * 2).relu() + 1).sum()
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        a = static_in * 3  # intermediates, freed during the capture
        b = a.relu() + 7
        c = b * b
        static_out = c.sum()
        del a, b, c
    torch.cuda.synchronize(dev)
    others = [torch.full((N,), 5.0, device=dev) for _ in range(64)]
    torch.cuda.synchronize(dev)
    static_in.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize(dev)
    wrong = sum(int((t != 5).sum().item()) for t in others)
    want = float(N * (2 * 3 + 7) ** 2)
    return graph, {"wrong_elements_after_replay": wrong,
                   "output_right": abs(float(static_out) - want) <= want * 1e-5}


def model(torch, dev, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                               torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(dev)


def batches(torch, dev, n):
    g = torch.Generator(device="cpu").manual_seed(1234)
    return [(torch.randn(256, 512, generator=g).to(dev), torch.randint(0, 10, (256,), generator=g).to(dev))
            for _ in range(n)]


def whole_step(torch, dev):
    loss_fn = torch.nn.CrossEntropyLoss()
    data = batches(torch, dev, 20)

    def step(m, opt, x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(m(x), y)
        loss.backward()
        opt.step()
        return loss

    def fresh():
        m = model(torch, dev, 0)
        return m, torch.optim.Adam(m.parameters(), lr=1e-3, capturable=True)

    # Both runs warm up with three steps on the first batch (PyTorch's example
    # warms up before capturing; Adam makes its state then), then train on 20.
    m, opt = fresh()
    for _ in range(3):
        step(m, opt, *data[0])
    eager = [float(step(m, opt, x, y)) for x, y in data]

    m, opt = fresh()
    static_x, static_y = data[0][0].clone(), data[0][1].clone()
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        for _ in range(3):
            step(m, opt, static_x, static_y)
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(m(static_x), static_y)
        static_loss.backward()
        opt.step()
    graphed = []
    for x, y in data:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        graphed.append(float(static_loss))
    diff = max(abs(a - b) for a, b in zip(eager, graphed))
    return graph, {"step_losses_max_diff": diff, "first_loss": eager[0], "last_loss": eager[-1],
                   "last_graphed": graphed[-1]}


def graphed_callables(torch, dev):
    loss_fn = torch.nn.CrossEntropyLoss()
    data = batches(torch, dev, 10)
    results = []
    for graphed in (False, True):
        m = model(torch, dev, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        if graphed:
            m = torch.cuda.make_graphed_callables(m, (data[0][0].clone(),))
        losses = []
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(m(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        results.append((losses, m))
    (eager, _), (graphed, module) = results
    return module, {"callables_losses_max_diff": max(abs(a - b) for a, b in zip(eager, graphed))}


def compiled(torch, dev):
    try:
        m = model(torch, dev, 2)
        f = torch.compile(m, mode="reduce-overhead")
        x = torch.randn(64, 512, device=dev)
        want = m(x)
        for _ in range(3):
            got = f(x)
        torch.cuda.synchronize(dev)
        return {"compile_ok": bool(torch.allclose(got, want, atol=1e-3, rtol=1e-3))}
    except Exception as e:  # reported, not required
        return {"compile_ok": False, "compile_error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}


def scenario(variant):
    import gc

    import torch

    if variant != "native":
        import emm.torch as et

        et.install(native=variant == "emm")
        if variant == "emm-pluggable-unguarded":
            torch.cuda.graph.__enter__ = torch.cuda.graph.__enter__._emm_original
            torch.cuda.CUDAGraph.capture_begin = torch.cuda.CUDAGraph.capture_begin._emm_original
    dev = torch.device("cuda:0")
    result = {"variant": variant}
    torch.ones(1, device=dev)
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    base_reserved = torch.cuda.memory_reserved(dev)
    try:
        g1, r = intermediates(torch, dev)
    except RuntimeError as e:
        result.update(captured=False, error=" | ".join(str(e).splitlines()[:4])[:600])
        print(json.dumps(result), flush=True)
        return
    result.update(captured=True, **r)
    if variant.startswith("emm-pluggable"):
        print(json.dumps(result), flush=True)
        return
    g2, r = whole_step(torch, dev)
    result.update(r)
    g3, r = graphed_callables(torch, dev)
    result.update(r)
    torch.cuda.synchronize(dev)
    result["reserved_with_graphs_mib"] = torch.cuda.memory_reserved(dev) / 2**20
    del g1, g2, g3
    gc.collect()
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    result["reserved_before_mib"] = base_reserved / 2**20
    result["reserved_after_release_mib"] = torch.cuda.memory_reserved(dev) / 2**20
    result.update(compiled(torch, dev))
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
        if variant == "emm" and not result.get("captured"):
            print(out.stderr[-3000:])  # emm's log (EMM_LOG) says what failed
        results[variant] = result
    problems = []
    for variant in ("native", "emm"):
        r = results[variant]
        if not r.get("captured") or r.get("wrong_elements_after_replay") or not r.get("output_right"):
            problems.append(f"{variant}: intermediates {r}")
            continue
        if r.get("step_losses_max_diff", 1) > 1e-3 or r.get("callables_losses_max_diff", 1) > 1e-3:
            problems.append(f"{variant}: graphed training differs from eager: {r}")
        if r["reserved_with_graphs_mib"] <= r["reserved_before_mib"]:
            problems.append(f"{variant}: the graphs' memory is not in memory_reserved: {r}")
    native, ours = results["native"], results["emm"]
    if not problems and ours["reserved_after_release_mib"] > max(native["reserved_after_release_mib"],
                                                                 ours["reserved_before_mib"]) + 64:
        problems.append(f"emm: the graphs' memory did not go back as far as native's: {ours}")
    r = results["emm-pluggable"]
    if r.get("captured", True) or "private memory pools for CUDA graphs" not in r.get("error", ""):
        problems.append(f"emm-pluggable did not refuse with emm's reason: {r}")
    if problems:
        print("cuda_graph_check: FAIL: " + "; ".join(problems))
        sys.exit(1)
    control = results["emm-pluggable-unguarded"]
    if control.get("wrong_elements_after_replay"):
        seen = f"the unguarded control corrupted {control['wrong_elements_after_replay']} elements"
    elif "exit" in control or "illegal memory access" in control.get("error", ""):
        seen = f"the unguarded control died: {control['error'][:120]}"
    else:
        seen = f"the unguarded control showed no harm this time ({control})"
    print(f"cuda_graph_check: OK (native and emm: replays intact, graphed training equal to eager, memory "
          f"back after release; the pluggable object refused; {seen})")


if __name__ == "__main__":
    main()
