"""A PyTorch job that survives the loss of workers with the same bits.

The MLP of the checkpoint/restart study (784-256-128-10 with ReLU) trained by AdamW on
Fashion-MNIST, or with --model transformer a small transformer over the image's rows;
each step is a global batch of --batch examples split into --micro-batches micro-batches.
Run alone, it trains as one process; under Steadfast's launcher each process is a worker
of an elastic job, and a worker killed, stopped or lost with its node is replaced from the
live replicas of the state. Either way it prints the SHA-256 of the final weights, which
is the same for one process, any number of workers, and any losses along the way:

    python examples/elastic_ddp.py --steps 100
    steadfast launch --nproc 4 --max-restarts 3 -- python examples/elastic_ddp.py --steps 100
    # and kill -9 one of the workers while it runs: the same weights sha256
    steadfast launch --nproc 2 --max-restarts 1 -- python examples/elastic_ddp.py --steps 100 \
        --checkpoint-dir ckpt --checkpoint-every 10 --resume latest
    # kill the whole job, start it again on any number of workers: the same weights sha256
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

import steadfast
import steadfast.elastic as se
from exact_restart import fashion_mnist  # the same loader, beside this file


def mlp(width):
    return torch.nn.Sequential(torch.nn.Linear(784, width), torch.nn.ReLU(), torch.nn.Linear(width, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


class Rows(torch.nn.Module):
    """A small transformer encoder that reads an image as 28 tokens of 28 pixels."""

    def __init__(self, width=64, heads=4, blocks=2):
        super().__init__()
        self.embed = torch.nn.Linear(28, width)
        self.position = torch.nn.Parameter(torch.randn(28, width) * 0.02)
        layer = torch.nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.1, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        h = self.encoder(self.embed(x.view(-1, 28, 28)) + self.position)
        return self.head(h.mean(dim=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--model", choices=["mlp", "transformer"], default="mlp")
    ap.add_argument("--width", type=int, default=256, help="the MLP's first hidden layer")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-every", type=int, default=1, help="compare the replicas every this many steps")
    ap.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    ap.add_argument("--checkpoint-dir", help="where the job's checkpoints go")
    ap.add_argument("--checkpoint-every", type=int, default=0, help="a checkpoint every this many steps (0: none)")
    ap.add_argument("--resume", help="'latest' (the newest checkpoint under --checkpoint-dir) or a checkpoint's path")
    ap.add_argument("--json", action="store_true", help="end with a JSON line: the weights' SHA-256 and the "
                    "seconds per step after the first")
    ap.add_argument("--flip", metavar="STEP:WORKER",
                    help="flip a bit of a weight in worker WORKER's memory after step STEP (the job finds it at rest "
                         "and repairs it from the replicas)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    x, y = fashion_mnist(a.data)
    torch.manual_seed(a.seed)
    model = mlp(a.width) if a.model == "mlp" else Rows()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(a.steps, 1))
    job = se.Job(model, opt, steps=a.steps, micro_batches=a.micro_batches, scheduler=schedule,
                 data=(len(x), a.batch), seed=a.seed, check_every=a.check_every,
                 checkpoint_dir=a.checkpoint_dir, checkpoint_every=a.checkpoint_every, resume=a.resume)
    if a.flip:
        at, worker = (int(v) for v in a.flip.split(":"))

        @job.at_rest
        def flip(done):
            # One bit of one weight's exponent, in the first process of that worker only.
            if done == at and job.worker in (worker, None) and job.incarnation == 0:
                log = steadfast.inject(model, target="*.weight", bits="exponent", count=1, seed=at)
                f = log["flips"][0]
                print(f"flipped a bit of {f['tensor']}[{f['element']}] after step {done}: "
                      f"{f['old_value']} -> {f['new_value']}", file=sys.stderr)

    started, loss, second = time.perf_counter(), None, None
    for step in job:
        if step.index == 1 and second is None:
            second = time.perf_counter()      # the first step builds the epoch's mesh
        for i in step.micro_batches:
            with step.micro_batch(i):
                part = step.examples(i)
                loss = F.cross_entropy(model(x[part]), y[part])
                loss.backward()
        if step.index % 50 == 0 and loss is not None:
            print(f"step {step.index:5d}  loss {loss.item():.4f}", file=sys.stderr)
    ended = time.perf_counter()
    print(f"{a.steps} steps in {ended - started:.1f} s", file=sys.stderr)
    print(f"weights sha256: {job.weights_sha256()}")
    if a.json:
        per_step = (ended - second) / (a.steps - 1) if second is not None and a.steps > 1 else None
        print(json.dumps({"worker": job.worker, "weights_sha256": job.weights_sha256(), "step_seconds": per_step}))


if __name__ == "__main__":
    main()
