"""PyTorch DDP (gloo) side of the data-parallel benchmarks: the MLP on Fashion-MNIST, global
batch split evenly over the ranks, AdamW. Prints one JSON line (from rank 0): seconds of
the training loop and a SHA-256 of the final weights.

`--reduce reproducible` replaces DDP's all-reduce of each gradient bucket by Steadfast's
fixed-point sum on gloo's integer collectives (a communication hook; see
torch_collective.py), so the sum's bits do not depend on gloo's order of addition.

Usage: python torch_ddp.py --world W --steps S [--batch 128] [--reduce fast|reproducible]
"""
import argparse, hashlib, json, os, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_collective import reproducible_sum  # noqa: E402
from torch_train import Mlp, load_images  # noqa: E402


def reproducible_hook(world, bucket):
    """DDP communication hook: the bucket's mean over the ranks, summed reproducibly."""
    fut = torch.futures.Future()
    fut.set_result(reproducible_sum(bucket.buffer()).div_(world))
    return fut


def worker(rank, world, args, port):
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    x, y = load_images(args.data_dir, "train")
    model = DDP(Mlp())
    if args.reduce == "reproducible":
        model.register_comm_hook(world, reproducible_hook)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    per_rank = args.batch // world
    per_epoch = len(y) // args.batch
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    dist.barrier()
    start = time.perf_counter()
    for step in range(args.steps):
        i = step % per_epoch
        idx = perm[i * args.batch + rank * per_rank: i * args.batch + (rank + 1) * per_rank]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        h = hashlib.sha256()
        for p in model.module.state_dict().values():
            h.update(p.detach().numpy().tobytes())
        print(json.dumps({"world": world, "steps": args.steps, "seconds": seconds, "weights_sha256": h.hexdigest()[:16]}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--port", type=int, default=29611)
    ap.add_argument("--reduce", choices=["fast", "reproducible"], default="fast")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    mp.spawn(worker, args=(args.world, args, args.port), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
