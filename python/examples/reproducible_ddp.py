"""Data-parallel training with PyTorch's DDP whose final weights do not depend on the
number of processes.

The MLP of the checkpoint/restart study (784-256-128-10 with ReLU) trained by AdamW on
Fashion-MNIST: each step is a global batch of --batch examples, in the order of a
ResumableSampler, split into --micro-batches micro-batches that the --world processes
(gloo, on this host) share out. With --hook steadfast the gradients are summed by
steadfast.ddp's reproducible hook, and the SHA-256 of the final weights printed at the end
is the same for every --world that divides the micro-batches; with --hook default
(DDP's own all-reduce, micro-batches accumulated in float under no_sync) it need not be.

    python examples/reproducible_ddp.py --world 1 --steps 50
    python examples/reproducible_ddp.py --world 4 --steps 50      # the same SHA-256
    python examples/reproducible_ddp.py --world 4 --steps 50 --hook default
"""
import argparse
import contextlib
import hashlib
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import steadfast.torch as st
from exact_restart import fashion_mnist  # the same loader, beside this file
from steadfast.ddp import ReproducibleGradients


def mlp(width):
    return torch.nn.Sequential(torch.nn.Linear(784, width), torch.nn.ReLU(), torch.nn.Linear(width, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def worker(rank, a, rendezvous, results):
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=a.world)
    x, y = fashion_mnist(a.data)
    torch.manual_seed(a.seed)
    model = DDP(mlp(a.width))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grads = (ReproducibleGradients(model, a.micro_batches, lanes=a.lanes, profile=a.profile, transport=a.transport)
             if a.hook == "steadfast" else None)
    mine = list(range(rank, a.micro_batches, a.world))
    batches = st.ResumableSampler(len(x), seed=a.seed).batches(a.batch)
    seconds = 0.0
    for step in range(a.steps):
        batch = next(batches)
        start = time.perf_counter()
        if grads is not None:
            for i, part in grads.split(batch):
                with grads.micro_batch(i):
                    F.cross_entropy(model(x[part]), y[part]).backward()
        else:
            # DDP's default: this rank's micro-batches accumulated in float (under no_sync,
            # which takes effect from the forward pass), then one all-reduce averaged over
            # the ranks.
            size = a.batch // a.micro_batches
            for k, i in enumerate(mine):
                part = batch[i * size:(i + 1) * size]
                with model.no_sync() if k < len(mine) - 1 else contextlib.nullcontext():
                    (F.cross_entropy(model(x[part]), y[part]) / len(mine)).backward()
        opt.step()
        opt.zero_grad()
        if step > 0:          # the first step builds DDP's buckets
            seconds += time.perf_counter() - start
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.module.parameters())).hexdigest()
    results.put({"rank": rank, "weights_sha256": digest, "step_seconds": seconds / max(a.steps - 1, 1),
                 "profile": dict(grads.profile) if grads is not None and a.profile else None})
    dist.barrier()            # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--world", type=int, default=2, help="processes")
    ap.add_argument("--hook", choices=["steadfast", "default"], default="steadfast")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=256, help="global batch")
    ap.add_argument("--micro-batches", type=int, default=8, help="micro-batches per step over the whole job")
    ap.add_argument("--width", type=int, default=256, help="width of the first hidden layer")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lanes", type=int, choices=[32, 64], default=64,
                    help="the width of the hook's integer sum (32: DDP's bytes, for up to 128 micro-batches)")
    ap.add_argument("--transport", choices=["auto", "gloo", "steadfast"], default="auto",
                    help="where the reproducible hook's sums run: Steadfast's mesh, the process group's all-reduces, "
                         "or (auto) the mesh where the ranks can reach each other")
    ap.add_argument("--profile", action="store_true", help="report the seconds of each phase of the hook")
    a = ap.parse_args()
    if a.micro_batches % a.world:
        ap.error(f"--world {a.world} does not divide --micro-batches {a.micro_batches}")
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, args=(a, os.path.join(tmp, "rendezvous"), results), nprocs=a.world,
                           start_method="spawn")
    ranks = sorted((results.get() for _ in range(a.world)), key=lambda r: r["rank"])
    digests = {r["weights_sha256"] for r in ranks}
    if len(digests) != 1:
        raise SystemExit(f"the replicas diverged: {ranks}")
    print(json.dumps({"world": a.world, "hook": a.hook, "steps": a.steps, "weights_sha256": digests.pop(),
                      "step_seconds": max(r["step_seconds"] for r in ranks), "profile": ranks[0]["profile"]}))


if __name__ == "__main__":
    main()
