"""PyTorch side of the training benchmark: the same MLP / LeNet-5 as Steadfast, the
same Fashion-MNIST preprocessing, batch, fp32, AdamW and thread count; and the same
character-level GPT (4 pre-norm blocks, width 128, 4 heads, context 64, exact GELU) on
the same fortunes text, batch 32.

Prints one JSON line: steps, seconds of the training loop, optimizer seconds, and a
SHA-256 of the final weights (to compare across thread counts).
"""
import argparse, hashlib, json, os, time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from common import fashion_mnist

def load_images(dir_, prefix):
    x, y = fashion_mnist(dir_, prefix)
    return torch.from_numpy(x), torch.from_numpy(y)


class Mlp(nn.Module):
    """784-W-W/2-10 with ReLU (Steadfast's `--width W`)."""

    def __init__(self, width=256):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, width), nn.Linear(width, width // 2), nn.Linear(width // 2, 10)

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


def load_fortunes(dir_="/usr/share/games/fortunes"):
    """The corpus as Steadfast reads it: every file but the .dat indexes, quotations
    split on % lines, one in ten held out; here only the training bytes matter."""
    quotes = []
    for name in sorted(os.listdir(dir_)):
        path = os.path.join(dir_, name)
        if not os.path.isfile(path) or name.endswith(".dat"):
            continue
        with open(path, "rb") as f:
            quote = []
            for line in f.read().split(b"\n"):
                if line.strip() == b"%":
                    if quote:
                        quotes.append(b"\n".join(quote))
                    quote = []
                else:
                    quote.append(line)
            if quote:
                quotes.append(b"\n".join(quote))
    train = b"".join(q + b"\n" for i, q in enumerate(quotes) if i % 10 != 0)
    vocab = sorted(set(train))
    index = {b: i for i, b in enumerate(vocab)}
    return torch.tensor([index[b] for b in train], dtype=torch.int64), len(vocab)


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self, vocab, context=64, width=128, layers=4, heads=4):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)).flatten(0, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn", "gpt"], required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, help="default: 128, gpt 32")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--width", type=int, default=256, help="the MLP's first hidden width")
    ap.add_argument("--micro-batch", type=int, help="examples per forward/backward pass (default: the batch)")
    ap.add_argument("--context", type=int, default=64, help="the GPT's tokens per sequence")
    ap.add_argument("--gpt-width", type=int, default=128)
    ap.add_argument("--gpt-blocks", type=int, default=4)
    ap.add_argument("--gpt-heads", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=0, help="steps left out of warm_seconds")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if a.model == "gpt":
        batch, context = a.batch or 32, a.context
        text, vocab = load_fortunes()
        model = Gpt(vocab, context, a.gpt_width, a.gpt_blocks, a.gpt_heads)
        starts = torch.from_numpy(rng.integers(0, len(text) - context - 1, size=(a.steps, batch)))
        offsets = torch.arange(context)

        def example(step):
            at = starts[step][:, None] + offsets
            return text[at], text[at + 1].flatten()
    else:
        batch = a.batch or 128
        x, y = load_images(a.data_dir, "train")
        model = Mlp(a.width) if a.model == "mlp" else LeNet()
        perm = torch.from_numpy(rng.permutation(len(y)))
        per_epoch = len(y) // batch

        def example(step):
            i = step % per_epoch
            idx = perm[i * batch:(i + 1) * batch]
            return x[idx], y[idx]
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    optim_s = 0.0
    start = time.perf_counter()
    warm = None
    for step in range(a.steps):
        if step == a.warmup:
            warm = time.perf_counter()
        inputs, targets = example(step)
        opt.zero_grad(set_to_none=True)
        # Micro-batches accumulate their share of the batch's mean loss into the gradients.
        micro = a.micro_batch or len(inputs)
        for at in range(0, len(inputs), micro):
            part = slice(at, at + micro)
            if a.model == "gpt":
                logits, wanted = model(inputs[part]), targets.view(len(inputs), -1)[part].flatten()
            else:
                logits, wanted = model(inputs[part]), targets[part]
            loss = F.cross_entropy(logits, wanted) * (micro / len(inputs))
            loss.backward()
        t = time.perf_counter()
        opt.step()
        optim_s += time.perf_counter() - t
    seconds = time.perf_counter() - start
    h = hashlib.sha256()
    for p in model.state_dict().values():
        h.update(p.detach().numpy().tobytes())
    warm_seconds = time.perf_counter() - warm if warm is not None else None
    print(json.dumps({"steps": a.steps, "seconds": seconds, "warm_seconds": warm_seconds, "optimizer_seconds": optim_s,
                      "loss": float(loss.detach()), "weights_sha256": h.hexdigest()[:16],
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
