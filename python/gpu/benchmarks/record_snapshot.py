"""Records the PyTorch memory snapshots `emm replay` reads, on a GPU machine.

    python python/gpu/benchmarks/record_snapshot.py train  train.pickle
    python python/gpu/benchmarks/record_snapshot.py infer  infer.pickle
    emm replay train.pickle infer.pickle --html report.html

train: a small transformer trained with a variable batch; recording starts mid-way
(so the snapshot holds allocations made before it: weights, optimizer state), and a
side stream works on tensors handed over with record_stream (cross-stream frees).
infer: variable-batch inference under torch.no_grad().
max_entries is capped so the pickles stay small (a few MB).
"""
import argparse
import random

import torch
from torch import nn

MAX_ENTRIES = 20000


def model(width=256, layers=4):
    layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width,
                                       batch_first=True)
    return nn.Sequential(nn.Embedding(1000, width), nn.TransformerEncoder(layer, layers),
                         nn.Linear(width, 1000)).cuda()


def train(path, steps=40, start_recording_at=15):
    torch.manual_seed(0)
    random.seed(0)
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    side = torch.cuda.Stream()
    for step in range(steps):
        if step == start_recording_at:
            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
        batch, seq = random.choice([8, 16, 32]), random.choice([64, 128, 256])
        x = torch.randint(0, 1000, (batch, seq), device="cuda")
        loss = nn.functional.cross_entropy(m(x).flatten(0, 1), x.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        # A side stream reads a tensor made on the default stream.
        stats = torch.empty(batch, seq, 256, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            summary = stats.float().mean(dim=-1)
        stats.record_stream(side)
        del stats, summary
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)


def infer(path, requests=60):
    torch.manual_seed(1)
    random.seed(1)
    m = model().eval()
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
    with torch.no_grad():
        for _ in range(requests):
            batch, seq = random.randint(1, 32), random.randint(16, 512)
            x = torch.randint(0, 1000, (batch, seq), device="cuda")
            m(x).argmax(-1).cpu()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", choices=["train", "infer"])
    p.add_argument("path")
    a = p.parse_args()
    (train if a.run == "train" else infer)(a.path)
    print(f"wrote {a.path}")
