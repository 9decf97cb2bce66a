"""Writes the PyTorch fixtures that the injection tests read (PyTorch's wheel is too large
for CI, so its files are made once, here, with real PyTorch, and committed):

  crates/cli/tests/fixtures/state.pt       torch.save of {'model': state_dict, 'optimizer': state_dict}
  crates/cli/tests/fixtures/state.pt.json  every tensor as torch sees it: name (the key path
                                           joined with '.'), dtype, shape and sha256 of its bytes

Usage: bench/.venv/bin/python scripts/make-pt-fixtures.py
"""
import hashlib, json, os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "cli", "tests", "fixtures")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def main():
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    net(torch.randn(16, 12)).sum().backward()
    opt.step()
    model = net.state_dict()
    # Other dtypes a checkpoint may hold.
    model["half"] = torch.randn(5, 3).half()
    model["bf16"] = torch.randn(7).bfloat16()
    model["f64"] = torch.randn(2, 2).double()
    state = {"model": model, "optimizer": opt.state_dict()}
    path = os.path.join(OUT, "state.pt")
    torch.save(state, path)

    expected = []

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(f"{prefix}.{i}", x)
        elif isinstance(v, torch.Tensor):
            t = v.detach().contiguous()
            raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
            expected.append({
                "name": prefix,
                "dtype": str(t.dtype).replace("torch.", ""),
                "shape": list(t.shape),
                "sha256": hashlib.sha256(raw.numpy().tobytes()).hexdigest(),
            })

    walk("", state)
    with open(path + ".json", "w") as f:
        json.dump(expected, f, indent=1)
    print(f"wrote {path} with {len(expected)} tensors")


if __name__ == "__main__":
    main()
