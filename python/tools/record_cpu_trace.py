"""Record the allocations of a real PyTorch program on the CPU, as emm's CSV
trace (``op,id,size,stream``), without a GPU: PyTorch's profiler reports every
allocation and free of the CPU allocator with its address and size
(``profile_memory=True``), and each address's allocation and free become one
id. The program's tensors and their lifetimes are those a GPU run makes (the
same model code, the same order); what differs is the CPU kernels' own scratch
buffers, and every event is on one stream. Events of several threads
(``--threads``) are ordered by the profiler's timestamps and event numbers; an
address freed on one thread and taken on another within the same microsecond
could be ordered wrongly, which ``--threads 1`` avoids.

    python3 python/tools/record_cpu_trace.py --out DIR [--steps N] [--seed S] WORKLOAD...
    python3 python/tools/record_cpu_trace.py --list

Each workload builds its model with random weights (nothing is downloaded),
then runs steps of variable shape (batch, sequence length, image size) drawn
from a fixed seed (``--seed``, 0 unless given: another seed draws other
shapes and weights, so another trace of the same program), as issue 33's
workloads do. Needs torch, torchvision and
transformers (CPU builds suffice). The traces replay with ``emm replay``; a set
recorded here and never looked at while a policy is tuned is a held-out set
(``docs/benchmarks.md``: the fifty-fifth session's nine; the fifty-sixth's
five more, then all fourteen with ``--seed 7``).
"""
import argparse
import json
import os
import random
import sys
import tempfile
import time

try:
    import torch
    from torch.profiler import ProfilerActivity, profile
except (ImportError, OSError):  # `to_csv` needs neither; recording does (`main` says so)
    torch = None


def to_csv(chrome_trace, out):
    """The profiler's CPU memory events of ``chrome_trace`` as emm CSV at
    ``out``; returns the allocations written."""
    with open(chrome_trace) as f:
        d = json.load(f)
    ev = [e for e in d["traceEvents"]
          if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    ev.sort(key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0)))
    live = {}
    nid = 0
    lines = ["op,id,size,stream"]
    for e in ev:
        a = e["args"]
        b, addr = a["Bytes"], a["Addr"]
        if b > 0:
            if addr in live:  # its free was not reported
                i, s = live.pop(addr)
                lines.append(f"f,{i},{s},0")
            live[addr] = (nid, b)
            lines.append(f"a,{nid},{b},0")
            nid += 1
        elif b < 0 and addr in live:
            i, s = live.pop(addr)
            lines.append(f"f,{i},{s},0")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return nid


def record(name, build, step, steps, out_dir, seed=0):
    random.seed(seed)
    torch.manual_seed(seed)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        state = build()
        for i in range(steps):
            step(state, i)
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        p.export_chrome_trace(tmp)
        return to_csv(tmp, os.path.join(out_dir, f"{name}.csv"))
    finally:
        os.unlink(tmp)


def image_training(model, optimizer, classes, batch, sizes):
    """A workload of classifier training steps on ``model()`` with
    ``optimizer(parameters)``: each step a batch of ``batch`` images (an
    inclusive range) of a side drawn from ``sizes``, labels below ``classes``."""
    def build():
        m = model()
        return m, optimizer(m.parameters())
    def step(s, i):
        m, opt = s
        b = random.randint(*batch); hw = random.choice(sizes)
        x = torch.randn(b, 3, hw, hw); y = torch.randint(0, classes, (b,))
        loss = torch.nn.functional.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    return build, step

def convnext_train():
    import torchvision
    return image_training(lambda: torchvision.models.convnext_tiny(num_classes=100),
                          lambda p: torch.optim.AdamW(p, lr=1e-4), 100, (2, 12), [96, 128, 160, 192])

def swin_infer():
    import torchvision
    def build():
        m = torchvision.models.swin_t(num_classes=1000).eval()
        return m
    def step(m, i):
        b = random.randint(1, 24)
        with torch.no_grad():
            out = m(torch.randn(b, 3, 224, 224))
        return out.argmax(-1)
    return build, step

def mobilenet_infer():
    import torchvision
    def build():
        return torchvision.models.mobilenet_v3_large().eval()
    def step(m, i):
        b = random.randint(1, 64); hw = random.choice([160, 192, 224, 256])
        with torch.no_grad():
            m(torch.randn(b, 3, hw, hw)).softmax(-1)
    return build, step

def roberta_train():
    from transformers import RobertaConfig, RobertaForTokenClassification
    def build():
        cfg = RobertaConfig(vocab_size=8000, hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1536, max_position_embeddings=520, num_labels=9)
        m = RobertaForTokenClassification(cfg)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-4)
    def step(s, i):
        m, opt = s
        b = random.randint(2, 16); L = random.randint(16, 384)
        ids = torch.randint(5, 8000, (b, L)); lab = torch.randint(0, 9, (b, L))
        out = m(input_ids=ids, labels=lab)
        opt.zero_grad(set_to_none=True); out.loss.backward(); opt.step()
    return build, step

def generation(model, vocab, batch, prompt, **generate):
    """A workload of ``generate`` calls on ``model()`` (built in eval mode):
    each step a batch of ``batch`` prompts of ``prompt`` tokens (inclusive
    ranges), random ids below ``vocab``, ``generate``'s own arguments beside."""
    def build():
        return model().eval()
    def step(m, i):
        b = random.randint(*batch); L = random.randint(*prompt)
        ids = torch.randint(5, vocab, (b, L))
        with torch.no_grad():
            m.generate(ids, attention_mask=torch.ones_like(ids), **generate)
    return build, step

def opt_generate():
    from transformers import OPTConfig, OPTForCausalLM
    cfg = OPTConfig(vocab_size=8000, hidden_size=512, num_hidden_layers=6, ffn_dim=2048, num_attention_heads=8, max_position_embeddings=1024, word_embed_proj_dim=512)
    return generation(lambda: OPTForCausalLM(cfg), 8000, (1, 8), (8, 256),
                      max_new_tokens=24, do_sample=False, pad_token_id=1)

def whisper_train():
    from transformers import WhisperConfig, WhisperForConditionalGeneration
    def build():
        cfg = WhisperConfig(vocab_size=4000, d_model=256, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, num_mel_bins=80, max_source_positions=750, max_target_positions=256, pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2, suppress_tokens=None, begin_suppress_tokens=None)
        m = WhisperForConditionalGeneration(cfg)
        return m, torch.optim.AdamW(m.parameters(), lr=1e-4)
    def step(s, i):
        m, opt = s
        b = random.randint(1, 8); T = random.choice([1500])
        feats = torch.randn(b, 80, T); L = random.randint(8, 128)
        lab = torch.randint(5, 4000, (b, L))
        out = m(input_features=feats, labels=lab)
        opt.zero_grad(set_to_none=True); out.loss.backward(); opt.step()
    return build, step

def lstm_train():
    def build():
        emb = torch.nn.Embedding(10000, 256); lstm = torch.nn.LSTM(256, 512, num_layers=2, batch_first=True); head = torch.nn.Linear(512, 10000)
        m = torch.nn.ModuleList([emb, lstm, head])
        return m, torch.optim.Adam(m.parameters(), lr=1e-3)
    def step(s, i):
        m, opt = s
        emb, lstm, head = m
        b = random.randint(4, 32); L = random.randint(10, 120)
        x = torch.randint(0, 10000, (b, L))
        h, _ = lstm(emb(x)); logits = head(h)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 10000), x.reshape(-1))
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    return build, step

def llama_generate():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=12, num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)
    return generation(lambda: LlamaForCausalLM(cfg), 32000, (1, 6), (16, 512),
                      max_new_tokens=32, do_sample=False, pad_token_id=0)

def gpt2_sample():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=16000, n_embd=768, n_layer=8, n_head=12, n_positions=1024)
    return generation(lambda: GPT2LMHeadModel(cfg), 16000, (1, 4), (8, 300),
                      max_new_tokens=40, do_sample=True, top_k=50, num_return_sequences=2, pad_token_id=0)

def mistral_generate():
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(vocab_size=24000, hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048, sliding_window=None)
    return generation(lambda: MistralForCausalLM(cfg), 24000, (1, 8), (16, 400),
                      max_new_tokens=28, do_sample=False, pad_token_id=0)

def neox_generate():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(vocab_size=20000, hidden_size=640, intermediate_size=2560, num_hidden_layers=8, num_attention_heads=10, max_position_embeddings=2048)
    return generation(lambda: GPTNeoXForCausalLM(cfg), 20000, (1, 6), (8, 320),
                      max_new_tokens=36, do_sample=True, top_p=0.9, pad_token_id=0)

def bart_generate():
    from transformers import BartConfig, BartForConditionalGeneration
    cfg = BartConfig(vocab_size=12000, d_model=512, encoder_layers=4, decoder_layers=4, encoder_attention_heads=8, decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=1024, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None)
    return generation(lambda: BartForConditionalGeneration(cfg), 12000, (1, 8), (16, 480),
                      max_new_tokens=32, min_new_tokens=32, num_beams=3, early_stopping=False)

def efficientnet_train():
    import torchvision
    return image_training(lambda: torchvision.models.efficientnet_b0(num_classes=200),
                          lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9), 200, (2, 24), [128, 160, 192, 224])

def densenet_infer():
    import torchvision
    def build():
        return torchvision.models.densenet121().eval()
    def step(m, i):
        b = random.randint(1, 32); hw = random.choice([160, 192, 224])
        with torch.no_grad():
            m(torch.randn(b, 3, hw, hw)).topk(5)
    return build, step

W = {"llama_generate": (llama_generate, 10), "gpt2_sample": (gpt2_sample, 12), "convnext_train": (convnext_train, 40), "swin_infer": (swin_infer, 40), "mobilenet_infer": (mobilenet_infer, 80),
     "roberta_train": (roberta_train, 50), "opt_generate": (opt_generate, 12), "whisper_train": (whisper_train, 30),
     "lstm_train": (lstm_train, 60), "mistral_generate": (mistral_generate, 12), "neox_generate": (neox_generate, 12),
     "bart_generate": (bart_generate, 10), "efficientnet_train": (efficientnet_train, 40), "densenet_infer": (densenet_infer, 40)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workloads", nargs="*", help="workloads to record (--list names them)")
    ap.add_argument("--out", default=".", help="folder for the traces (WORKLOAD.csv)")
    ap.add_argument("--steps", type=int, help="steps (generations, batches) instead of each workload's own")
    ap.add_argument("--seed", type=int, default=0, help="seed of the shapes and the weights (another seed, another trace)")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--list", action="store_true", help="list the workloads and their steps")
    a = ap.parse_args()
    if a.list or not a.workloads:
        for k, (_, n) in W.items():
            print(f"{k} ({n} steps)")
        return 0
    if torch is None:
        print("recording needs PyTorch (pip install torch torchvision transformers)", file=sys.stderr)
        return 2
    unknown = [w for w in a.workloads if w not in W]
    if unknown:
        print(f"unknown workload(s): {', '.join(unknown)}; --list names them", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    os.makedirs(a.out, exist_ok=True)
    for name in a.workloads:
        f, n = W[name]
        t = time.time()
        build, step = f()
        allocs = record(name, build, step, a.steps or n, a.out, seed=a.seed)
        print(f"{name}: {allocs} allocations, {time.time() - t:.0f} s -> {os.path.join(a.out, name + '.csv')}", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # a reader that stopped early (`--list | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
