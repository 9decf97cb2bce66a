"""PyTorch side of the checkpoint/restart study (bench/study/study.py runs it).

The MLP (784-W-W/2-10, ReLU) on Fashion-MNIST, batch 128, AdamW, checkpointed the way
PyTorch's users do: `torch.save` of the model's and the optimizer's state dicts and the
step (`torch.save`), or the same dict through `torch.distributed.checkpoint` (`dcp`).
The data order is what a `DataLoader(shuffle=True)` gives: a fresh permutation of the
training set each epoch, drawn from PyTorch's global generator seeded at start.

Commands (each prints one JSON object):

  cost      --width W --steps S --every K --saver torch.save|dcp --threads T --dir D
            step times with a checkpoint every K steps (synchronous: the stall is the
            save), the time to load the last checkpoint, and its size on disk
  run       --width W --steps S --threads T [--save-at N --dir D] [--resume D]
            train, optionally saving at step N or resuming from D; the SHA-256 of the
            final weights; `--with-rng` also saves the generator's state from before the
            current epoch's permutation, and a resumed run redraws that permutation
  contents  --dir D
            save as users do and report what `torch.load` gives back
  integrity --width W --saver torch.save|dcp --dir D
            save, then flip one bit in the middle of the (largest) file, and truncate it:
            does loading notice?
"""
import argparse, hashlib, json, os, shutil, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_train import load_images  # noqa: E402

from damage import KINDS, damaged_copy  # noqa: E402

BATCH = 128


class Mlp(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(784, width), nn.Linear(width, width // 2), nn.Linear(width // 2, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def setup(width, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Mlp(width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    return model, opt


# The generator's state before the current epoch's permutation was drawn: what a resumed
# run needs to redraw it (`--with-rng`).
EPOCH_RNG = [None]


def batches(n, start_step):
    """The DataLoader's order from `start_step` on: a permutation per epoch from the global
    generator, as it stands when this is called."""
    per_epoch = n // BATCH
    step = start_step
    while True:
        EPOCH_RNG[0] = torch.get_rng_state()
        perm = torch.randperm(n)
        for i in range(step % per_epoch, per_epoch):
            yield perm[i * BATCH:(i + 1) * BATCH]
        step = 0


def train_step(model, opt, x, y, idx):
    loss = F.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def state(model, opt, step, with_rng=False):
    s = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
    if with_rng:
        s["rng"] = EPOCH_RNG[0]
    return s


def save(saver, model, opt, step, path, with_rng=False):
    if saver == "torch.save":
        torch.save(state(model, opt, step, with_rng), path)
    else:
        # DCP's own helpers, which also give the optimizer's slots a shape to load into.
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        m, o = get_state_dict(model, opt)
        dcp.save({"model": m, "optimizer": o, "step": torch.tensor(step)}, checkpoint_id=path)


def load(saver, model, opt, path):
    """Loads into `model` and `opt`; returns the step and the saved generator state."""
    if saver == "torch.save":
        s = torch.load(path, weights_only=False)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["optimizer"])
        return s["step"], s.get("rng")
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    m, o = get_state_dict(model, opt)
    s = {"model": m, "optimizer": o, "step": torch.tensor(0)}
    dcp.load(s, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=s["model"], optim_state_dict=s["optimizer"])
    return int(s["step"]), None


def size(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def weights_hash(model, opt=None):
    """SHA-256 of the weights (and of the optimizer's slots when `opt` is given)."""
    h = hashlib.sha256()
    for p in model.state_dict().values():
        h.update(p.detach().numpy().tobytes())
    for slots in (opt.state.values() if opt else []):
        for k in sorted(slots):
            h.update(torch.as_tensor(slots[k]).detach().numpy().tobytes())
    return h.hexdigest()[:16]


def cost(a):
    model, opt = setup(a.width, a.threads)
    x, y = load_images(a.data_dir, "train")
    order = batches(len(y), 0)
    path = os.path.join(a.dir, "ckpt.pt" if a.saver == "torch.save" else "ckpt")
    steps, saves = [], []
    for step in range(1, a.steps + 1):
        t = time.perf_counter()
        train_step(model, opt, x, y, next(order))
        steps.append(time.perf_counter() - t)
        if step % a.every == 0:
            t = time.perf_counter()
            if os.path.isdir(path):
                shutil.rmtree(path)
            save(a.saver, model, opt, step, path)
            saves.append(time.perf_counter() - t)
    loaded = None
    if saves:
        t = time.perf_counter()
        load(a.saver, model, opt, path)
        loaded = time.perf_counter() - t
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    # The state: the weights and AdamW's two slots per weight.
    return {"step_seconds": steps, "save_seconds": saves, "load_seconds": loaded, "bytes": size(path) if saves else 0,
            "state_bytes": 3 * weights, "torch": torch.__version__}


def run(a):
    model, opt = setup(a.width, a.threads)
    x, y = load_images(a.data_dir, "train")
    start = 0
    if a.resume:
        start, rng = load(a.saver, model, opt, a.resume)
        if rng is not None:
            torch.set_rng_state(rng)
    order = batches(len(y), start)
    for step in range(start + 1, a.steps + 1):
        train_step(model, opt, x, y, next(order))
        if step == a.save_at:
            save(a.saver, model, opt, step, a.dir, a.with_rng)
    return {"weights_sha256": weights_hash(model)}


def contents(a):
    os.makedirs(a.dir, exist_ok=True)
    model, opt = setup(a.width, 1)
    x, y = load_images(a.data_dir, "train")
    train_step(model, opt, x, y, next(batches(len(y), 0)))
    path = os.path.join(a.dir, "ckpt.pt")
    save("torch.save", model, opt, 1, path)
    s = torch.load(path, weights_only=False)
    slots = s["optimizer"]["state"]
    return {"weights": bool(s.get("model")), "optimizer state": bool(slots) and all("step" in v for v in slots.values()),
            "RNG": any("rng" in k for k in s), "data position": any(k in s for k in ("epoch", "sampler", "data")),
            "step": "step" in s}


def integrity(a):
    os.makedirs(a.dir, exist_ok=True)
    model, opt = setup(a.width, 1)
    x, y = load_images(a.data_dir, "train")
    order = batches(len(y), 0)
    for _ in range(3):
        train_step(model, opt, x, y, next(order))
    clean = os.path.join(a.dir, "clean")
    save(a.saver, model, opt, 3, clean)
    want = weights_hash(model, opt)
    out = {}
    for damage in KINDS:
        bad = os.path.join(a.dir, damage.replace(" ", "-"))
        damaged_copy(clean, bad, damage)
        m2, o2 = setup(a.width, 1)
        train_step(m2, o2, x, y, next(batches(len(y), 0)))  # gives the optimizer its slots
        try:
            load(a.saver, m2, o2, bad)
            out[damage] = "loaded, state intact" if weights_hash(m2, o2) == want else "loaded silently, state changed"
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - DCP raises a BaseException; the study records it
            first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
            out[damage] = f"refused: {type(e).__name__}: {first}"
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["cost", "run", "contents", "integrity"])
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--saver", choices=["torch.save", "dcp"], default="torch.save")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir")
    ap.add_argument("--save-at", type=int, default=-1)
    ap.add_argument("--resume")
    ap.add_argument("--with-rng", action="store_true")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    print(json.dumps({"cost": cost, "run": run, "contents": contents, "integrity": integrity}[a.command](a)))


if __name__ == "__main__":
    main()
