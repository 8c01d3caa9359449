"""Pause and resume on a GPU, an RL-shaped loop, beside torch_memory_saver
(issue 39). One process per implementation; run each in its own process:

    EMM_LIBRARY=gpu-bundle/lib/libemm_capi.so PYTHONPATH=python \\
        python3 python/gpu/benchmarks/pause_bench.py --impl emm  [--json OUT]
    PYTHONPATH=<torch_memory_saver build> python3 python/gpu/benchmarks/pause_bench.py --impl tms

``emm``: PyTorch allocates through emm's own allocator object (``emm.torch``),
regions are ``emm.region``. ``tms``: PyTorch's own allocator, regions are
``torch_memory_saver.region`` (its in-process "torch" hook mode, a MemPool over
its allocator); the weights' region keeps a CPU backup, as ``keep="host"`` does.

What it does (the same for both), each figure checked at the device
(``torch.cuda.mem_get_info``):

1. Training state under tag ``train``: a Llama-style model (random weights,
   bf16, nothing downloaded) and AdamW, one training step (the optimizer's state
   made).
2. A reference output (fixed input, eval, no grad), and a CUDA graph of the
   forward captured on a static input.
3. ``pause("train", keep host)``: the device's free memory must rise by at least
   95 % of the tag's reserved bytes (emm) / of the bytes the process held beyond
   its untagged memory (both: the figure printed is the device's).
4. Generation phase under tag ``kv``: a KV cache (``--kv-gib``) filled and used
   (attention-like matmuls over it).
5. ``pause("kv")`` without keeping, ``resume("train")``; the output and the graph's
   replay must be bit-identical to the reference; another training step runs.
6. Peak device memory over the loop (sampled at every phase) beside the two
   phases' sum: it must stay near the larger phase.
7. Pause and resume times per GiB, with and without host copies (``--reps``
   repeats, median and spread).

Prints one JSON document (also to ``--json``) and ``pause_bench: OK``, or what
failed and exits 1.
"""
import argparse
import json
import statistics
import sys
import time

GIB = 1 << 30


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--impl", choices=["emm", "tms"], required=True)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--kv-gib", type=float, default=12.0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json")
    return p.parse_args()


class Emm:
    name = "emm"

    def __init__(self):
        import emm.torch as et
        import emm

        et.install(native=True)
        self.emm = emm

    def region(self, tag, keep_host):
        return self.emm.region(tag)

    def pause(self, tag, keep_host):
        self.emm.pause(tag, keep="host" if keep_host else "none")

    def resume(self, tag):
        self.emm.resume(tag)

    def tag_reserved(self, tag):
        return self.emm.tag_stats(tag)["reserved_bytes"]


class Tms:
    name = "torch_memory_saver"

    def __init__(self):
        import torch_memory_saver as tms

        self.tms = tms.torch_memory_saver
        self.tms.hook_mode = "torch"

    def region(self, tag, keep_host):
        return self.tms.region(tag=tag, enable_cpu_backup=keep_host)

    def pause(self, tag, keep_host):
        self.tms.pause(tag)

    def resume(self, tag):
        self.tms.resume(tag)

    def tag_reserved(self, tag):
        return None


def main():
    args = parse()
    impl = Emm() if args.impl == "emm" else Tms()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    failures = []
    peak = {"used": 0}

    def used():
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(dev)
        u = total - free
        peak["used"] = max(peak["used"], u)
        return u

    base = used()
    cfg = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                      num_hidden_layers=args.layers, num_attention_heads=args.hidden // 128,
                      num_key_value_heads=args.hidden // 512, max_position_embeddings=4096)
    with impl.region("train", True):
        model = LlamaForCausalLM(cfg).to(dev, dtype=torch.bfloat16)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def train_step(seed):
            g = torch.Generator(device=dev).manual_seed(seed)
            ids = torch.randint(0, cfg.vocab_size, (4, 512), device=dev, generator=g)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss)

        loss0 = train_step(1)
    # Outside the region: the reference, and a CUDA graph of the forward captured
    # before the pause (its own pool's memory is not paused; the weights it reads
    # are).
    static_in = torch.randint(0, cfg.vocab_size, (2, 128), device=dev,
                              generator=torch.Generator(device=dev).manual_seed(7))
    model.eval()
    with torch.no_grad():
        ref = model(input_ids=static_in).logits.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                model(input_ids=static_in)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_out = model(input_ids=static_in).logits
        graph.replay()
        graph_ref = graph_out.clone()
        if impl.name == "emm":
            # A pause during a capture is refused (it would synchronize the
            # device and invalidate the capture); the capture goes on.
            g2 = torch.cuda.CUDAGraph()
            refused = False
            with torch.cuda.graph(g2):
                try:
                    impl.pause("kv", False)
                except impl.emm.TagStateError:
                    refused = True
                y = static_in * 2
            g2.replay()
            if not refused or not torch.equal(y, static_in * 2):
                failures.append("a pause during a CUDA graph capture was not refused cleanly")
            del g2, y
    model.train()
    params = sum(p.numel() for p in model.parameters())
    train_phase = used() - base
    tag_reserved = impl.tag_reserved("train")

    # Pause the training state, keeping it in host memory.
    before = used()
    t = time.perf_counter()
    impl.pause("train", True)
    torch.cuda.synchronize()
    pause_host_s = time.perf_counter() - t
    after = used()
    released = before - after
    want = tag_reserved if tag_reserved is not None else train_phase
    # (emm says what the tag holds; torch_memory_saver does not, and the
    # process's memory beyond its regions is part of `train_phase`: reported only.)
    if tag_reserved is not None and released < 0.95 * want:
        failures.append(f"pause of the training state gave the device {released / GIB:.2f} GiB, "
                        f"under 95 % of {want / GIB:.2f} GiB")

    # Generation phase: a KV cache under its own tag.
    n_kv = int(args.kv_gib * GIB) // (2 * 64 * 1024)  # bf16 [n, 64, 1024]
    with impl.region("kv", False):
        layers = 8
        cache = [torch.empty((n_kv // layers, 64, 1024), dtype=torch.bfloat16, device=dev) for _ in range(layers)]
        for i, c in enumerate(cache):
            c.normal_(generator=torch.Generator(device=dev).manual_seed(100 + i))
        q = torch.randn((64, 1024), dtype=torch.bfloat16, device=dev)
        score = sum(float((c[:256] * q).sum()) for c in cache)
    gen_phase = used() - after
    t = time.perf_counter()
    impl.pause("kv", False)
    torch.cuda.synchronize()
    pause_none_s = time.perf_counter() - t
    kv_released = (after + gen_phase) - used()

    # Back to training: same addresses, same bytes.
    t = time.perf_counter()
    impl.resume("train")
    torch.cuda.synchronize()
    resume_host_s = time.perf_counter() - t
    model.eval()
    with torch.no_grad():
        out = model(input_ids=static_in).logits
        if not torch.equal(out, ref):
            failures.append("the output after pause and resume differs from before")
        graph.replay()
        if not torch.equal(graph_out, graph_ref):
            failures.append("the CUDA graph captured before the pause replays differently after the resume")
    model.train()
    with impl.region("train", True):
        loss1 = train_step(2)
    used()

    # Pause/resume times per GiB, repeated (the reference made again: the
    # training step changed the weights).
    model.eval()
    with torch.no_grad():
        ref = model(input_ids=static_in).logits.clone()
    model.train()
    reps = {"pause_host": [], "resume_host": []}
    for _ in range(args.reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        impl.pause("train", True)
        torch.cuda.synchronize()
        reps["pause_host"].append(time.perf_counter() - t)
        t = time.perf_counter()
        impl.resume("train")
        torch.cuda.synchronize()
        reps["resume_host"].append(time.perf_counter() - t)
    with torch.no_grad():
        model.eval()
        if not torch.equal(model(input_ids=static_in).logits, ref):
            failures.append(f"the output differs after {args.reps} more pauses")
    reps["pause_none"], reps["resume_none"] = [], []
    for _ in range(args.reps):
        t = time.perf_counter()
        impl.resume("kv")
        torch.cuda.synchronize()
        reps["resume_none"].append(time.perf_counter() - t)
        t = time.perf_counter()
        impl.pause("kv", False)
        torch.cuda.synchronize()
        reps["pause_none"].append(time.perf_counter() - t)
    impl.resume("kv")
    del cache

    larger = max(train_phase, gen_phase)
    total_peak = peak["used"] - base
    if total_peak > larger + 0.10 * min(train_phase, gen_phase) + 1.5 * GIB:
        failures.append(f"peak {total_peak / GIB:.2f} GiB is not near the larger phase {larger / GIB:.2f} GiB "
                        f"(sum {(train_phase + gen_phase) / GIB:.2f})")
    train_gib = released / GIB
    kv_gib = kv_released / GIB

    def per_gib(xs, gib):
        return {"median_ms_per_gib": 1e3 * statistics.median(xs) / gib,
                "min": 1e3 * min(xs) / gib, "max": 1e3 * max(xs) / gib}

    doc = {
        "impl": impl.name, "torch": torch.__version__, "device": torch.cuda.get_device_name(dev),
        "params": params, "loss_first": loss0, "loss_after_resume": loss1,
        "train_phase_gib": train_phase / GIB, "gen_phase_gib": gen_phase / GIB,
        "tag_reserved_gib": None if tag_reserved is None else tag_reserved / GIB,
        "released_by_pause_gib": train_gib, "released_fraction": released / want if want else None,
        "kv_released_gib": kv_gib,
        "peak_gib": total_peak / GIB, "sum_of_phases_gib": (train_phase + gen_phase) / GIB,
        "first_pause_host_ms_per_gib": 1e3 * pause_host_s / train_gib,
        "first_resume_host_ms_per_gib": 1e3 * resume_host_s / train_gib,
        "first_pause_none_ms_per_gib": 1e3 * pause_none_s / kv_gib if kv_gib else None,
        "pause_host": per_gib(reps["pause_host"], train_gib),
        "resume_host": per_gib(reps["resume_host"], train_gib),
        "pause_none": per_gib(reps["pause_none"], kv_gib),
        "resume_none": per_gib(reps["resume_none"], kv_gib),
        "score": score, "failures": failures,
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    if failures:
        print("pause_bench: FAILED\n" + "\n".join(failures))
        return 1
    print("pause_bench: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
