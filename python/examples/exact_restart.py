"""A PyTorch loop that a kill -9 cannot make inexact.

The MLP of the checkpoint/restart study (784-256-128-10 with ReLU, plus dropout so that
the random generator matters) trained by AdamW on Fashion-MNIST, batch 128, shuffled by a
ResumableSampler and read by a ResumableLoader (with --workers worker processes),
checkpointed every --every steps by the AsyncCheckpointer. Run it, kill
it at any moment, run it again with the same flags: it resumes from the newest
checkpoint that verifies, and its final weights are the same bits as a run that never
stopped. It prints one line per step and, at the end, the SHA-256 of the final weights.

    python examples/exact_restart.py --ckpt /tmp/ckpt --steps 200
    python examples/exact_restart.py --ckpt /tmp/ckpt --steps 200 --workers 2   # the same bits
    python examples/exact_restart.py --ckpt /tmp/ckpt --steps 200 --tutorial   # model and
        # optimizer only, as PyTorch's tutorials save: the resumed run is not exact
"""
import argparse
import gzip
import hashlib
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

import steadfast.torch as st


def fashion_mnist(data):
    with gzip.open(os.path.join(data, "train-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255
    with gzip.open(os.path.join(data, "train-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--ckpt", required=True, help="checkpoint root")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=0, help="the loader's worker processes")
    ap.add_argument("--tutorial", action="store_true", help="save and restore the model and optimizer only")
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    x, y = fashion_mnist(a.data)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sampler = st.ResumableSampler(len(x), seed=a.seed)
    # The loader counts the batches it delivers, so what is saved is what the loop took even
    # while worker processes prefetch the next ones. It draws its workers' seed, as each
    # epoch starts, from a generator of its own (seeded by the sampler's seed), never from
    # torch's global one: a restart mid-epoch does not shift the stream dropout draws from.
    loader = st.ResumableLoader(torch.utils.data.TensorDataset(x, y), batch_size=128, sampler=sampler,
                                drop_last=True, num_workers=a.workers)
    step = 0
    if st.steps(a.ckpt):
        state = st.load(a.ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
        if not a.tutorial:
            st.set_rng_state(state["rng"])
            loader.load_state_dict(state["loader"])
    with st.AsyncCheckpointer(a.ckpt, keep_last=2) as saver:
        while step < a.steps:
            for xb, yb in loader:
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                step += 1
                if step % a.every == 0:
                    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
                    if not a.tutorial:
                        state.update(rng=st.rng_state(), loader=loader.state_dict())
                    saver.save(state, step)
                print(step, flush=True)
                if step == a.steps:
                    break
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    print(json.dumps({"step": step, "weights_sha256": digest}))


if __name__ == "__main__":
    main()
