"""PyTorch side of the training benchmark: the same MLP / LeNet-5 as Steadfast, the
same Fashion-MNIST preprocessing, batch, fp32, AdamW and thread count.

Prints one JSON line: steps, seconds of the training loop, optimizer seconds, and a
SHA-256 of the final weights (to compare across thread counts).
"""
import argparse, gzip, hashlib, json, os, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def load_images(dir_, prefix):
    with gzip.open(os.path.join(dir_, f"{prefix}-images-idx3-ubyte.gz")) as f:
        raw = f.read()
    n = int.from_bytes(raw[4:8], "big")
    x = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 784).astype(np.float32)
    with gzip.open(os.path.join(dir_, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy((x / 255.0 - MEAN) / STD), torch.from_numpy(y)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 6, 5, padding=2), nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn"], required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x, y = load_images(a.data_dir, "train")
    model = Mlp() if a.model == "mlp" else LeNet()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    perm = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))
    per_epoch = len(y) // a.batch
    optim_s = 0.0
    start = time.perf_counter()
    for step in range(a.steps):
        i = step % per_epoch
        idx = perm[i * a.batch:(i + 1) * a.batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t = time.perf_counter()
        opt.step()
        optim_s += time.perf_counter() - t
    seconds = time.perf_counter() - start
    h = hashlib.sha256()
    for p in model.state_dict().values():
        h.update(p.detach().numpy().tobytes())
    print(json.dumps({"steps": a.steps, "seconds": seconds, "optimizer_seconds": optim_s,
                      "loss": float(loss.detach()), "weights_sha256": h.hexdigest()[:16],
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
