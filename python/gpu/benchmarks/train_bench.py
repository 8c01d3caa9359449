"""Real training and inference steps through one allocator per process.

    python3 train_bench.py --variant V --workload W [--steps N] [--warmup N]
                           [--profile DIR] [--snapshot FILE]
    torchrun --nproc_per_node=G train_bench.py --variant V --workload gpt2 --ddp

Variants (fixed before PyTorch touches the GPU, so one per process):
  native       PyTorch's caching allocator as shipped
  expandable   the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  emm-pool     emm.torch.install() over emm's pool (emm's own allocator object,
               built on first use; the RESULT line's "torch_allocator" says which)
  emm-pool-pluggable  the same through PyTorch's CUDAPluggableAllocator
               (EMM_TORCH_NATIVE=0): what that object's bookkeeping costs
  emm-pool-novmm  the same with EMM_POOL_EXPANDABLE=0 (no virtual memory: what
               IPC-exportable blocks need)
  emm-pool-prev  emm-pool over the library EMM_PREV_LIBRARY names (a build from
               before a change), beside emm-pool in the same run
  emm-hostonly emm.torch.install() over emm's hostonly manager (CUDA's own pool)
  pluggable-floor  PyTorch's CUDAPluggableAllocator over floor_alloc.cpp, an
               exact-size cache that does almost nothing (built with g++ on first
               use): what PyTorch's pluggable path costs any allocator, a baseline

Workloads (random weights from configs; nothing is downloaded; shapes drawn from a
seeded generator, so every variant sees the same sequence of shapes and data):
  gpt2         transformers GPT-2, 8 layers, 768 wide, bf16 autocast, AdamW;
               sequence length 32-1024 and batch 2-12 per step
  llama        transformers Llama-style decoder, 8 layers, 1024 wide, same shapes
  llama-1b     a Llama-style decoder of 1.1 B parameters (TinyLlama's shape: 22
               layers, 2048 wide, 5632 in the MLP, 32 heads, 4 key/value heads),
               same shapes: FSDP2's all-gather buffers matter at this size
  resnet50     torchvision ResNet-50, channels-last, bf16, SGD; batch 8-96 and
               image size 128-256 per step
  gpt2-infer   GPT-2 under torch.no_grad(), batch 1-32, sequence 16-1024
  llama-generate  the Llama-style model with grouped-query attention (4 key/value
               heads) under torch.no_grad(): one `generate` of 48 new tokens a step
               (greedy, transformers' dynamic KV cache, which grows by one token a
               step in every layer), prompts of 16-768 tokens, batch 1-23
  bert         transformers BERT-base with its masked-LM head (12 layers, 768
               wide), every token its own label (no token masked: the memory of
               masked-LM training, not its task), bf16 autocast, AdamW; sequence
               32-512, batch 8-39 per step
  vit-infer    torchvision ViT-B/16 under torch.no_grad(), bf16 autocast;
               224-pixel images, batch 1-127 per step
  moe          transformers Mixtral-style mixture of experts (8 layers, 768 wide,
               8 experts, 2 a token, grouped-query attention), bf16 autocast,
               AdamW; sequence 32-1024, batch 2-12: how many tokens each expert
               gets changes every step, whatever the shapes
  t5           transformers T5 (T5-small's shape: 6 + 6 layers, 512 wide),
               encoder-decoder training, bf16 autocast, AdamW; source 32-512
               tokens, target half of it, batch 8-48
  detect-infer torchvision Faster R-CNN (ResNet-50 FPN) under torch.no_grad(),
               fp32: 1-8 images a step, each 480 high and 320-1024 wide (the
               model resizes them); proposals and kept boxes vary per image; the
               "loss" is the number of boxes kept
  segment      torchvision DeepLabV3 (ResNet-50, 21 classes), channels-last, bf16
               autocast, AdamW; batch 2-16 of 256-512 square images, a label per
               pixel
  gpt2-beam    the GPT-2 of gpt2-infer under torch.no_grad(): one `generate` of
               48 new tokens a step with 4 beams (the KV caches are reordered for
               the surviving beams at every token), prompts of 16-512, batch 1-8
  detect-train torchvision Mask R-CNN (ResNet-50 FPN, 91 classes) trained, fp32,
               AdamW: 1-4 images a step, 320-1024 wide and 320-768 high, each
               with 1-20 random boxes, their labels and box-shaped masks
  speech       transformers Wav2Vec2 (base's shape) trained with its CTC head
               (32 symbols), bf16 autocast, AdamW: batch 2-16 of 1-10 s of 16 kHz
               audio, a quarter as many labels as frames; the feature encoder's
               convolutions over the raw samples dominate

Prints one line 'RESULT {json}' per process (rank 0 under DDP): per-step times,
peak reserved and allocated bytes, driver allocations, the final loss.
"""
import argparse
import dataclasses
import json
import os
import pathlib
import random
import statistics
import sys
import time

from own_memory import OwnMemory  # the modules beside this script
from turns import PeerGone, Turns

VARIANTS = ("native", "expandable", "emm-pool", "emm-pool-prev", "emm-pool-pluggable", "emm-pool-novmm",
            "emm-pool-nocache",
            "emm-hostonly", "pluggable-floor")
WORKLOADS = ("gpt2", "llama", "llama-1b", "resnet50", "gpt2-infer", "llama-generate", "bert",
             "vit-infer", "moe", "t5", "detect-infer", "segment", "gpt2-beam", "detect-train",
             "speech")
# Workloads that train nothing: no optimizer, eval mode, no_grad.
SERVING = ("gpt2-infer", "vit-infer", "llama-generate", "detect-infer", "gpt2-beam")


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=VARIANTS, required=True)
    p.add_argument("--workload", choices=WORKLOADS, required=True)
    p.add_argument("--steps", type=int, default=40, help="timed steps")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shapes", choices=("fresh", "bucketed"), default="fresh",
                   help="fresh: a new shape every step (cuDNN/cuBLAS plan each one on the host); "
                        "bucketed: 8 shapes, each seen in warmup, then drawn again (later epochs "
                        "of bucketed training)")
    p.add_argument("--ddp", action="store_true", help="DistributedDataParallel under torchrun")
    p.add_argument("--fsdp", action="store_true",
                   help="with --ddp: FSDP2 (fully_shard on each transformer block and the model, "
                        "bf16 parameters, fp32 gradient reduction) instead of DistributedDataParallel")
    p.add_argument("--profile", metavar="DIR",
                   help="profile 6 steps after the timed ones (every rank under DDP); tables and the "
                        "streams' idle time (profile_gaps.py) to DIR")
    p.add_argument("--sdpa", choices=("auto", "flash"), default="auto",
                   help="attention backend: PyTorch's choice (cuDNN on Hopper), or flash (cuDNN's off)")
    p.add_argument("--snapshot", metavar="FILE", help="record PyTorch's memory history and dump it here")
    p.add_argument("--turn-fds", metavar="IN,OUT",
                   help="take turns with other processes on the same GPU (train_rounds.py --lockstep, "
                        "turns.py): read a byte from descriptor IN before each step (the last step's turn "
                        "holds the calibration too) and write it to OUT after, then wait one turn more so "
                        "that no process ends while another still times steps; the device-used peak is "
                        "then this process's own (NVML)")
    args = p.parse_args()
    if args.turn_fds and (args.ddp or args.profile or args.snapshot):
        p.error("--turn-fds is for one process a variant on one GPU: not with --ddp, --profile or --snapshot")
    return args


def setup_allocator(variant):
    """Chooses the allocator; must run before PyTorch initialises CUDA."""
    if variant == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if variant.startswith("emm-"):
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
        os.environ["EMM_MEMORY_MANAGER"] = "hostonly" if variant == "emm-hostonly" else "pool"
        if variant == "emm-pool-novmm":
            os.environ["EMM_POOL_EXPANDABLE"] = "0"
        if variant == "emm-pool-nocache":
            os.environ["EMM_POOL_THREAD_CACHE"] = "0"
        if variant == "emm-pool-pluggable":
            os.environ["EMM_TORCH_NATIVE"] = "0"
        if variant == "emm-pool-prev":
            os.environ["EMM_LIBRARY"] = os.environ["EMM_PREV_LIBRARY"]
        import emm.torch

        emm.torch.install()
        print(f"emm.torch: allocator object {emm.torch.installed()}", file=sys.stderr)
    if variant == "pluggable-floor":
        import torch

        alloc = torch.cuda.memory.CUDAPluggableAllocator(str(floor_library()), "floor_alloc", "floor_free")
        torch.cuda.memory.change_current_allocator(alloc)


def torch_allocator():
    """Which allocator object emm.torch installed ("native", "pluggable"), or None."""
    mod = sys.modules.get("emm.torch")
    return mod.installed() if mod is not None else None


def floor_library():
    """floor_alloc.cpp built into a shared library (again when the source is newer)."""
    import subprocess

    src = pathlib.Path(__file__).resolve().parent / "floor_alloc.cpp"
    lib = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / "emm_floor_alloc.so"
    if not lib.exists() or lib.stat().st_mtime < src.stat().st_mtime:
        cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", str(src), "-o", str(lib),
                        f"-I{cuda}/include", f"-L{cuda}/lib64", "-lcudart", f"-Wl,-rpath,{cuda}/lib64"],
                       check=True)
    return lib


def build(workload, dev):
    import torch

    if workload in ("gpt2", "gpt2-infer", "gpt2-beam"):
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=8, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
        model = GPT2LMHeadModel(cfg)
    elif workload == "llama-1b":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                          num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                          max_position_embeddings=1024)
        with torch.device(dev):  # initialised on the GPU: seconds, not a minute on the host
            model = LlamaForCausalLM(cfg)
    elif workload in ("llama", "llama-generate"):
        from transformers import LlamaConfig, LlamaForCausalLM

        kv_heads = 4 if workload == "llama-generate" else 16
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                          num_attention_heads=16, num_key_value_heads=kv_heads, vocab_size=32000,
                          max_position_embeddings=1024)
        model = LlamaForCausalLM(cfg)
    elif workload == "bert":
        from transformers import BertConfig, BertForMaskedLM

        model = BertForMaskedLM(BertConfig())  # BERT-base's shape
    elif workload == "vit-infer":
        import torchvision

        model = torchvision.models.vit_b_16(weights=None)
    elif workload == "moe":
        from transformers import MixtralConfig, MixtralForCausalLM

        cfg = MixtralConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=8,
                            num_attention_heads=12, num_key_value_heads=4, num_local_experts=8,
                            num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=1024)
        model = MixtralForCausalLM(cfg)
    elif workload == "t5":
        from transformers import T5Config, T5ForConditionalGeneration

        model = T5ForConditionalGeneration(T5Config(d_model=512, d_ff=2048, num_layers=6,
                                                    num_decoder_layers=6, num_heads=8,
                                                    vocab_size=32128, decoder_start_token_id=0))
    elif workload == "detect-infer":
        import torchvision

        # Faster R-CNN with a ResNet-50 FPN backbone, random weights (nothing
        # downloaded): images of many sizes, proposals and detections whose
        # number changes with every image.
        model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None)
    elif workload == "detect-train":
        import torchvision

        model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                                   num_classes=91)
    elif workload == "speech":
        from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

        model = Wav2Vec2ForCTC(Wav2Vec2Config(vocab_size=32, ctc_loss_reduction="mean",
                                              ctc_zero_infinity=True))
    elif workload == "segment":
        import torchvision

        model = torchvision.models.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None,
                                                                   num_classes=21)
        model = model.to(memory_format=torch.channels_last)
    elif workload == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).to(memory_format=torch.channels_last)
    else:
        raise SystemExit(f"train_bench.py builds no model for workload {workload!r}")
    return model.to(dev)


def shard(model, workload):
    """FSDP2: each transformer block sharded on its own, then the rest; bf16
    parameters in compute and fp32 gradient reduction. Its all-gather and
    reduce-scatter buffers are allocated on FSDP's own streams and freed across
    them, through whatever allocator the variant installed."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if workload.startswith("gpt2"):
        blocks = model.transformer.h
    elif workload.startswith("llama"):
        blocks = model.model.layers
    else:
        raise SystemExit(f"--fsdp shards transformer blocks: not {workload}")
    for block in blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model


BUCKETS = 8
# New tokens per generation (llama-generate, gpt2-beam).
GENERATED = 48
# Beams of gpt2-beam's search.
BEAMS = 4


# Each workload's shapes: the batch's range, then the range of its second
# dimension (sequence length, image size or width, audio samples), or one fixed
# value (drawn from no generator: the recorded traces depend on the draws' order).
DRAWS = {
    "gpt2": ((2, 12), (32, 1024)),
    "llama": ((2, 12), (32, 1024)),
    "llama-1b": ((2, 12), (32, 1024)),
    "moe": ((2, 12), (32, 1024)),
    "resnet50": ((8, 96), (128, 256)),
    "gpt2-infer": ((1, 32), (16, 1024)),
    "llama-generate": ((1, 23), (16, 768)),
    "bert": ((8, 39), (32, 512)),
    "t5": ((8, 48), (32, 512)),
    "vit-infer": ((1, 127), 224),
    "detect-infer": ((1, 8), (320, 1024)),  # images, each 480 high and this wide
    "segment": ((2, 16), (256, 512)),
    "gpt2-beam": ((1, 8), (16, 512)),
    "detect-train": ((1, 4), (320, 1024)),  # images, each this wide
    "speech": ((2, 16), (16000, 160000)),  # clips, samples each
}


def shapes(workload, n, seed, mode="fresh"):
    """The per-step shapes, the same for every variant. "fresh": drawn anew each
    step. "bucketed": BUCKETS shapes, in order for the first BUCKETS steps (all in
    warmup), then drawn from them."""
    r = random.Random(seed)
    batch, second = DRAWS[workload]

    def draw():
        b = r.randint(*batch)
        return (b, second if isinstance(second, int) else r.randint(*second))

    if mode == "fresh":
        return [draw() for _ in range(n)]
    buckets = [draw() for _ in range(BUCKETS)]
    return (buckets + [r.choice(buckets) for _ in range(n)])[:n]


@dataclasses.dataclass
class Run:
    """What a workload's step needs besides its shape: the workload's name, the
    model, the CUDA generator its data is drawn from, the device and the seed."""

    workload: str
    model: object
    gen: object
    dev: object
    seed: int


# A step's forward pass for batch `b` and second dimension `s` (see DRAWS) at step
# `i`: a training workload's returns its loss (main's step then runs the backward
# pass and the optimizer), a serving workload's (SERVING) a number every variant
# must agree on. Each draws its data on the device from `run.gen`, in an order the
# recorded traces depend on.


def resnet50_step(run, i, b, s):
    import torch

    x = torch.randn(b, 3, s, s, generator=run.gen, device=run.dev)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (b,), generator=run.gen, device=run.dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return torch.nn.functional.cross_entropy(run.model(x), y)


def vit_infer_step(run, i, b, s):
    import torch

    x = torch.randn(b, 3, s, s, generator=run.gen, device=run.dev)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        return run.model(x).float().mean()


def detect_infer_step(run, i, b, s):
    import torch

    images = [torch.rand(3, 480, s, generator=run.gen, device=run.dev) for _ in range(b)]
    with torch.no_grad():
        found = run.model(images)
    # The boxes kept, as a number every variant must agree on.
    return torch.tensor(float(sum(len(d["boxes"]) for d in found)), device=run.dev)


def detect_train_step(run, i, b, s):
    import torch

    dev, gen = run.dev, run.gen
    h = 320 + (s * 7919) % 449  # a height per step, 320-768, from the width
    rr = random.Random(run.seed * 100003 + i)
    ys = torch.arange(h, device=dev).view(1, h, 1)
    xs = torch.arange(s, device=dev).view(1, 1, s)
    scale = torch.tensor([s, h], dtype=torch.float32, device=dev)
    images, targets = [], []
    for _ in range(b):
        images.append(torch.rand(3, h, s, generator=gen, device=dev))
        n = rr.randint(1, 20)
        corner = torch.rand(n, 2, generator=gen, device=dev) * scale * 0.7
        extent = 16 + torch.rand(n, 2, generator=gen, device=dev) * scale * 0.3
        boxes = torch.cat([corner, corner + extent], dim=1)
        x0, y0, x1, y1 = (boxes[:, k].view(n, 1, 1) for k in range(4))
        masks = ((xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)).to(torch.uint8)
        labels = torch.randint(1, 91, (n,), generator=gen, device=dev)
        targets.append({"boxes": boxes, "labels": labels, "masks": masks})
    losses = run.model(images, targets)
    return sum(losses.values())


def speech_step(run, i, b, s):
    import torch

    x = torch.randn(b, s, generator=run.gen, device=run.dev)
    labels = torch.randint(1, 32, (b, max(2, s // 320 // 4)), generator=run.gen, device=run.dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return run.model(input_values=x, labels=labels).loss


def segment_step(run, i, b, s):
    import torch

    x = torch.randn(b, 3, s, s, generator=run.gen, device=run.dev)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 21, (b, s, s), generator=run.gen, device=run.dev)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return torch.nn.functional.cross_entropy(run.model(x)["out"], y)


# The token models' vocabularies (the Llama-style ones and the mixture of
# experts: 32000).
VOCAB = {"gpt2": 50257, "gpt2-infer": 50257, "gpt2-beam": 50257, "bert": 30522, "t5": 32128}


def token_ids(run, b, s):
    import torch

    return torch.randint(0, VOCAB.get(run.workload, 32000), (b, s), generator=run.gen, device=run.dev)


def generate_step(run, i, b, s):
    """llama-generate and gpt2-beam: one `generate` of GENERATED new tokens."""
    import torch

    ids = token_ids(run, b, s)
    beams = BEAMS if run.workload == "gpt2-beam" else 1
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = run.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=GENERATED, min_new_tokens=GENERATED,
                                 do_sample=False, num_beams=beams, pad_token_id=0)
    # The generated tokens, as a number every variant must agree on.
    return out[:, s:].float().mean()


def lm_infer_step(run, i, b, s):
    import torch

    ids = token_ids(run, b, s)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = run.model(input_ids=ids).logits
        return logits.float().mean()


def lm_train_step(run, i, b, s):
    """The decoders, BERT's masked-LM head (every token its own label) and T5,
    whose target is half the source's length."""
    import torch

    ids = token_ids(run, b, s)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        if run.workload == "t5":
            return run.model(input_ids=ids, labels=ids[:, : s // 2].contiguous()).loss
        return run.model(input_ids=ids, labels=ids).loss


STEPS = {
    "gpt2": lm_train_step,
    "llama": lm_train_step,
    "llama-1b": lm_train_step,
    "moe": lm_train_step,
    "bert": lm_train_step,
    "t5": lm_train_step,
    "resnet50": resnet50_step,
    "gpt2-infer": lm_infer_step,
    "llama-generate": generate_step,
    "gpt2-beam": generate_step,
    "vit-infer": vit_infer_step,
    "detect-infer": detect_infer_step,
    "segment": segment_step,
    "detect-train": detect_train_step,
    "speech": speech_step,
}


def run_step(run, opt, i, b, s):
    """Step `i` of `run`'s workload: its forward pass (STEPS), then, for a
    training workload, the backward pass and `opt`'s step. Returns the loss, or
    a serving workload's number."""
    out = STEPS[run.workload](run, i, b, s)
    if run.workload in SERVING:
        return out
    opt.zero_grad(set_to_none=True)
    out.backward()
    opt.step()
    return out


def main():
    args = parse()
    if args.shapes == "bucketed":
        args.warmup = max(args.warmup, BUCKETS)  # every shape is planned before timing
    setup_allocator(args.variant)
    import torch

    rank, world = 0, 1
    if args.ddp:
        import torch.distributed as dist

        rank = int(os.environ["LOCAL_RANK"])
        world = int(os.environ["WORLD_SIZE"])
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    dev = torch.device("cuda", rank)
    turns = Turns.parse(args.turn_fds)
    if args.sdpa == "flash":
        torch.backends.cuda.enable_cudnn_sdp(False)
    if args.snapshot:  # from the start, so the model's own blocks are in the trace
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, context=None, stacks="python")
    # The device's own view (cuMemGetInfo), beside the allocator's counters: bytes
    # in use before the model, and the most in use after any step.
    free, total_mem = torch.cuda.mem_get_info(dev)
    # Taking turns, other processes share the device: this process's own bytes
    # (NVML) instead, None where NVML cannot tell.
    own = OwnMemory(torch.cuda.get_device_properties(dev).uuid) if turns else None

    def device_used():
        if own is not None:
            return own.read()
        free, _ = torch.cuda.mem_get_info(dev)
        return total_mem - free

    device_base = device_used()
    device_peak = device_base
    torch.manual_seed(args.seed)
    model = build(args.workload, dev)
    infer = args.workload in SERVING
    if args.ddp and args.fsdp:
        model = shard(model, args.workload)
    elif args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    if infer:
        model.eval()
        opt = None
    elif args.workload == "resnet50":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    total = args.warmup + args.steps + (6 if args.profile else 0)
    plan = shapes(args.workload, total, args.seed, args.shapes)
    # Each step's batch is drawn on the device from a seeded CUDA generator, so the
    # timed step holds the model's work and the allocator's, not the host drawing
    # random images (PyTorch's profiler found aten::normal_ on the CPU taking over
    # half of a ResNet-50 step, at a speed that varied 20 % between processes).
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + 1 + rank)

    run = Run(workload=args.workload, model=model, gen=gen, dev=dev, seed=args.seed)

    def step(i):
        b, s = plan[i]
        return run_step(run, opt, i, b, s)

    times = []
    # The current stream's time from the step's first call to its last (CUDA
    # events): the step as the device saw it, without the host's wait at the end.
    device_times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probes = []  # host speed just before each timed step (host_probe)
    loss = None
    counters = step_counters(args.variant, dev)
    before = counters()
    changes = []
    window = [0.0, 0.0]  # wall-clock seconds of the first and last timed step
    for i in range(args.warmup + args.steps):
        if turns:
            turns.take()
        if i == args.warmup:
            window[0] = time.time()
        torch.cuda.synchronize(dev)
        if i >= args.warmup:
            probes.append(host_probe())
        t0 = time.perf_counter()
        start.record()
        loss = step(i)
        end.record()
        torch.cuda.synchronize(dev)
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            device_times.append(start.elapsed_time(end))
        used = device_used()
        device_peak = None if used is None or device_peak is None else max(device_peak, used)
        after = counters()
        changes.append({k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)})
        before = after
        if turns and i + 1 < args.warmup + args.steps:
            turns.give()
    window[1] = time.time()
    final_loss = float(loss.detach().float().item())
    calib = calibrate(dev)
    if turns:
        # The calibration in the same turn as the last step: no other process's
        # work beside it. Then one turn more, which comes once every process
        # has timed its last step, so that none tears down (tens of GiB freed)
        # beside another's timed steps; then the ring goes on without this one.
        turns.give()
        try:
            turns.take()
        except PeerGone:
            pass  # the one before ended after its last step: nothing waits
        turns.give()
        turns.close()
    if args.snapshot:
        # Each rank its own file under DDP (one file written by two ranks at once
        # is no pickle): FILE for rank 0, FILE.rank<N> for the others.
        path = args.snapshot if rank == 0 else f"{args.snapshot}.rank{rank}"
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)

    if args.profile:
        # Under DDP every rank runs the profiled steps (one rank alone would wait
        # forever for the others' gradient all-reduce); each writes its own files.
        profile(args, step, dev, rank if args.ddp else None)

    mem = memory(args.variant, dev)
    result = {
        "variant": args.variant, "workload": args.workload, "world": world, "shapes": args.shapes,
        "steps": args.steps, "step_ms": times, "device_ms": device_times,
        "median_ms": statistics.median(times), "final_loss": final_loss, **mem,
        "step_changes": changes, "timed_window": window, "calib": calib, "probe_ms": probes,
        "torch_allocator": torch_allocator(),
        "device_used_peak": None if device_peak is None else device_peak - device_base,
        "device_used_by": "nvml-process" if turns else "cuMemGetInfo",
        "lockstep": bool(turns),
        "peak_slack": peak_slack(args.variant, dev),
    }
    if args.ddp:
        import torch.distributed as dist

        everyone = [None] * world
        dist.all_gather_object(everyone, result)
        if rank == 0:
            result["ranks"] = [{k: r[k] for k in ("median_ms", "peak_reserved", "peak_allocated", "calib", "peak_slack")}
                               for r in everyone]
            result["calib"] = {k: max(r["calib"][k] for r in everyone) for k in result["calib"]}
            # A DDP step waits for the slowest rank, so it ran on a steady host only
            # when every rank's did: the probe of a step is the slowest rank's.
            result["probe_ms_ranks"] = [r["probe_ms"] for r in everyone]
            result["probe_ms"] = [max(ps) for ps in zip(*result["probe_ms_ranks"])]
            # Every rank's counter changes a step: a step waits for the slowest
            # rank, so a growth on any rank shows in rank 0's time
            # (train_rounds.busy_steps).
            result["step_changes_ranks"] = [r["step_changes"] for r in everyone]
            result["peak_reserved"] = max(r["peak_reserved"] for r in everyone)
            result["peak_allocated"] = max(r["peak_allocated"] for r in everyone)
        dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


def host_probe():
    """How fast the host is right now: a fixed pure-Python loop of about 1 ms, run
    just before a timed step (outside its time). The lent machine's host speed
    changes by up to 2x for stretches of seconds to minutes; a step is comparable
    with another variant's only when both ran on an equally fast host."""
    t0 = time.perf_counter()
    sum(i * i for i in range(20_000))
    return (time.perf_counter() - t0) * 1e3


def calibrate(dev):
    """How fast this process's host is, apart from any allocator: the best of five
    rounds of a fixed pure-Python loop (ms) and of 2,000 in-place kernel launches
    (us per launch; in place, so nothing is allocated). Measured after the timed
    steps, with the allocator holding what training left it. A slow process shows
    here as well as in its steps; an allocator that slows the host's other work
    (launches) shows only in the second."""
    import torch

    t = torch.zeros(1, device=dev)
    cpu, launch = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        sum(i * i for i in range(200_000))
        cpu.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(2000):
            t.add_(1)
        torch.cuda.synchronize(dev)
        launch.append((time.perf_counter() - t0) * 1e6 / 2000)
    return {"cpu_ms": min(cpu), "launch_us": min(launch)}


COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "device_syncs", "events_recorded",
            "event_queries", "misses", "pieces_mapped", "pieces_moved", "pieces_unmapped", "pieces_replaced", "retire_waits",
            "cross_stream_reuses", "parked_taken_back", "parked_adopted", "parked_waited", "cache_reclaims", "reserved_bytes", "num_ooms",
            # Only from a library built with `--features call-timing` (emm-capi):
            # time inside PyTorch's allocator hooks.
            "torch_alloc_calls", "torch_alloc_ns", "torch_alloc_slow_calls", "torch_alloc_slow_ns",
            "torch_free_calls", "torch_free_ns", "torch_free_slow_calls", "torch_free_slow_ns") + tuple(
    # ... and the slow calls by what the pool did in them (emm_pool::call_work).
    f"torch_{hook}_slow_{kind}_{unit}" for hook in ("alloc", "free")
    for kind in ("locked", "reclaim", "events", "parked", "grew", "none") for unit in ("calls", "ns")) + tuple(
    # ... and the phases of the pool's growths, process-wide (emm_pool::growth_phases::Phase).
    f"pool_{phase}_{unit}" for phase in ("expand", "unmap_retired", "plan", "turn", "create", "map", "access",
                                         "retire", "unmap", "wait_parked") for unit in ("calls", "ns"))


def step_counters(variant, dev):
    """A function returning the allocator's counters that say what a step cost it
    (driver allocations and frees, retries, synchronizations, pages mapped and
    moved); the training loop records how each step changed them."""
    import torch

    if variant.startswith("emm-"):
        import re

        import emm

        mgr = emm.Manager(None, dev.index or 0)

        def read():
            text = mgr.report()
            found = dict((k, int(v)) for k, v in re.findall(r"(\w+): (\d+)", text))
            return {k: found[k] for k in COUNTERS if k in found}
        return read

    if variant == "pluggable-floor":
        return lambda: {}  # PyTorch's pluggable path keeps no statistics

    def read_torch():
        st = torch.cuda.memory_stats(dev)
        return {"num_device_alloc": st.get("num_device_alloc", 0), "num_device_free": st.get("num_device_free", 0),
                "num_alloc_retries": st.get("num_alloc_retries", 0), "num_ooms": st.get("num_ooms", 0),
                "reserved_bytes": st.get("reserved_bytes.all.current", 0)}
    return read_torch


def peak_slack(variant, dev):
    """emm's pool: its reserved bytes at the last growth that raised their peak, by
    what held them (``emm.peak_slack.*`` without the prefix: live bytes, threads'
    caches, free blocks of the growing stream, of other streams, settled, parked
    behind events, in small segments); empty for PyTorch's allocator."""
    if not variant.startswith("emm-"):
        return {}
    import emm

    prefix = "emm.peak_slack."
    stats = emm.Manager(None, dev.index or 0).memory_stats()
    return {k[len(prefix):]: v for k, v in stats.items() if k.startswith(prefix)}


def memory(variant, dev):
    """Peak reserved and allocated bytes and driver allocations, from the allocator
    that served the process."""
    import torch

    if variant.startswith("emm-"):
        import emm

        m = emm.Manager(device=dev.index)
        s = m.stats()
        return {"peak_reserved": s["reserved_bytes_peak"], "peak_allocated": s["allocated_bytes_peak"],
                "driver_allocs": s["upstream_allocs"], "emm_report": m.report()}
    if variant == "pluggable-floor":
        import ctypes

        lib = ctypes.CDLL(str(floor_library()))
        res, live, allocs = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        lib.floor_stats(ctypes.byref(res), ctypes.byref(live), ctypes.byref(allocs))
        return {"peak_reserved": res.value, "peak_allocated": live.value, "driver_allocs": allocs.value}
    s = torch.cuda.memory_stats(dev)
    return {"peak_reserved": s["reserved_bytes.all.peak"], "peak_allocated": s["allocated_bytes.all.peak"],
            "driver_allocs": s.get("num_device_alloc", 0)}


def profile(args, step, dev, rank=None):
    """Six steps under PyTorch's profiler: where host and device time went. Writes
    the operator tables, every device activity's time, and profile_gaps.py's
    account of each stream's idle time (waiting on the host, or on the device)."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity

    import profile_gaps

    out = pathlib.Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    first = args.warmup + args.steps
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(first, first + 6):
            step(i)
        torch.cuda.synchronize(dev)
    wall = (time.perf_counter() - t0) * 1e3
    ka = prof.key_averages()
    tag = f"{args.workload}-{args.variant}" + ("-flash" if args.sdpa == "flash" else "") + \
        (f"-rank{rank}" if rank is not None else "")
    kernel_us = sum(e.self_device_time_total for e in ka if e.device_type == torch.autograd.DeviceType.CUDA)
    with open(out / f"{tag}.txt", "w") as f:
        f.write(f"wall {wall:.1f} ms for 6 steps; device (kernel+memcpy) time {kernel_us / 1e3:.1f} ms\n\n")
        f.write(ka.table(sort_by="self_cpu_time_total", row_limit=30))
        f.write("\n\n")
        f.write(ka.table(sort_by="self_device_time_total", row_limit=25))
    # Every device activity with its count and time, to set beside another
    # allocator's run of the same steps (same kernels, so a difference is where
    # the memory made a kernel slower).
    with open(out / f"{tag}-device.csv", "w") as f:
        f.write("name,count,device_us\n")
        for e in sorted(ka, key=lambda e: -e.self_device_time_total):
            if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0:
                name = e.key.replace('"', "'")
                f.write(f'"{name}",{e.count},{e.self_device_time_total:.1f}\n')
    cpu_us = sum(e.self_cpu_time_total for e in ka if e.device_type == torch.autograd.DeviceType.CPU)
    with tempfile.TemporaryDirectory() as tmp:
        trace = pathlib.Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        gaps = profile_gaps.analyse(profile_gaps.load(trace))
    with open(out / f"{tag}-gaps.txt", "w") as f:
        f.write(f"{tag}: wall {wall:.1f} ms for 6 steps\n")
        f.write(profile_gaps.render(gaps, streams=4) + "\n")
    busiest = gaps["streams"][0] if gaps["streams"] else {}
    print(f"PROFILE {tag}: wall {wall:.1f} ms / 6 steps, device busy {kernel_us / 1e3:.1f} ms, "
          f"host op time {cpu_us / 1e3:.1f} ms; busiest stream busy {busiest.get('busy_us', 0) / 1e3:.1f} ms, "
          f"idle waiting on the host {busiest.get('host_late_us', 0) / 1e3:.1f} ms, "
          f"on the device {busiest.get('device_wait_us', 0) / 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
