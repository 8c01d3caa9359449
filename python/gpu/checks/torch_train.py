"""A small training loop, run with PyTorch's own allocator or with emm's
(`--emm`); prints the loss after every 50 steps and the final loss. Deterministic,
so both runs must print the same losses."""
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # python/, for emm
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

if "--emm" in sys.argv:
    import emm.torch
    emm.torch.install()

import torch  # noqa: E402

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
dev = "cuda"
model = torch.nn.Sequential(
    torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 10)
).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator(device="cpu").manual_seed(1)
x_all = torch.randn(4096, 256, generator=g)
w_true = torch.randn(256, 10, generator=g)
y_all = (x_all @ w_true).argmax(dim=1)
for step in range(300):
    idx = torch.randint(0, 4096, (128 + (step % 7) * 16,), generator=g)
    x, y = x_all[idx].to(dev), y_all[idx].to(dev)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % 50 == 0:
        print(f"step {step} loss {loss.item():.6f}")
print(f"final loss {loss.item():.6f}")
if "--emm" in sys.argv:
    import emm
    print("emm stats:", emm.Manager(device=0).stats())
