"""PyTorch's pipeline parallelism (torch.distributed.pipelining, on gloo) training the same
character-level GPT as `steadfast train --model gpt`, cut the same way: the embeddings, each
block, and the final norm with the head are the units, and S stages take consecutive units,
the earlier ones one more when they cannot be equal. Prints one JSON line: the steps/s of
the job (its slowest rank).

    python bench/torch_pipeline.py --stages 2 --schedule 1f1b --steps 30"""
import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from torch_train import Block

WIDTH, LAYERS, HEADS, CONTEXT, VOCAB = 128, 4, 4, 64, 96


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)

    def forward(self, tokens):
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))


class Final(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_f, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, x):
        return self.head(self.ln_f(x))


def units():
    return [Embed()] + [Block(WIDTH, HEADS) for _ in range(LAYERS)] + [Final()]


def stage_units(count, index):
    n = LAYERS + 2
    base, extra = n // count, n % count
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def loss_fn(logits, target):
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def worker(rank, args, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.manual_seed(0)
    all_units = units()
    start, end = stage_units(args.stages, rank)
    module = nn.Sequential(*all_units[start:end])
    opt = torch.optim.AdamW(module.parameters(), lr=2e-3)
    batch, micro = args.batch, args.micro_batch
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, VOCAB, (batch * (args.steps + 1), CONTEXT + 1), generator=gen)
    if args.stages == 1:
        step = lambda x, y: loss_fn(module(x), y).backward()  # noqa: E731
        schedule = None
    else:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        dist.init_process_group("gloo", rank=rank, world_size=args.stages)
        stage = PipelineStage(module, rank, args.stages, torch.device("cpu"))
        kind = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
        schedule = kind(stage, batch // micro, loss_fn=loss_fn)
    started = None
    for s in range(args.steps + 1):
        if s == 1:
            started = time.perf_counter()  # the first step warms up
        rows = data[s * batch:(s + 1) * batch]
        x, y = rows[:, :-1], rows[:, 1:]
        opt.zero_grad()
        if schedule is None:
            for m in range(batch // micro):
                step(x[m * micro:(m + 1) * micro], y[m * micro:(m + 1) * micro])
        elif rank == 0:
            schedule.step(x)
        elif rank == args.stages - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        opt.step()
    rate = args.steps / (time.perf_counter() - started)
    out.put((rank, rate))
    if schedule is not None:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=4)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, port, out)) for r in range(args.stages)]
    for proc in procs:
        proc.start()
    rates = [out.get() for _ in procs]
    for proc in procs:
        proc.join()
    print(json.dumps({"stages": args.stages, "schedule": args.schedule, "steps_per_s": min(r for _, r in rates)}))


if __name__ == "__main__":
    main()
