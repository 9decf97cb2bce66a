"""PyTorch gloo side of the engines benchmark: the all-reduce of `steadfast bench collective`
on `torch.distributed`'s gloo backend, one process per rank, with the same inputs.

Two modes, as Steadfast's:
- `fast`: `all_reduce(SUM)` of the f32 vector, whatever order gloo's algorithm adds in.
- `reproducible`: Steadfast's two-phase fixed-point sum written with torch operations on
  gloo's integer collectives (the maximum exponent of each block of 64 elements with MAX on
  uint8, then the 64-bit fixed-point terms with SUM on int64). Integer sums are associative, so the bits do
  not depend on the world size or on gloo's algorithm; they are those of Steadfast's sum.
  This port handles finite values only (the benchmark's inputs), not NaN or infinities.

Rank 0 prints one JSON line per size and mode, with the xxh3-64 fingerprint of the sum in
Steadfast's canonical form, so the driver can compare the bits across engines.

Usage: python torch_collective.py --world W --mb 1,16 [--repeats 5] [--port P]
"""
import argparse, json, os, sys, time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HEADROOM = 16
SHIFT = 39 - HEADROOM  # as repro::batched::scale_shift


def collective_input(rank, n):
    """The bits of `steadfast bench collective`'s input of rank `rank`."""
    stride = (2 * rank + 1) * 7919
    k = (torch.arange(n, dtype=torch.int64) * stride) % 2001
    return (k.to(torch.float32) - 1000.0) * 1.1e-3


CHUNK = 1 << 22  # elements converted at a time, to bound the temporaries' memory


BLOCK = 64  # elements that share one scale, as repro::batched::EXP_BLOCK


def reproducible_sum(x, group=None):
    """The element-wise sum over the ranks of f32 `x`, with the bits of Steadfast's
    reproducible all-reduce (finite values only)."""
    bits = x.view(torch.int32)
    n = x.numel()
    exps = torch.empty((n + BLOCK - 1) // BLOCK, dtype=torch.uint8)
    for i in range(0, n, CHUNK):
        field = (bits[i:i + CHUNK] >> 23) & 0xFF
        if bool((field == 0xFF).any()):
            raise ValueError("the reproducible port handles finite values only")
        padded = torch.nn.functional.pad(field.clamp(min=1), (0, (-field.numel()) % BLOCK), value=1)
        exps[i // BLOCK:(i + field.numel() + BLOCK - 1) // BLOCK] = padded.reshape(-1, BLOCK).amax(1)
    dist.all_reduce(exps, op=dist.ReduceOp.MAX, group=group)
    acc = torch.empty(n, dtype=torch.int64)
    for i in range(0, n, CHUNK):
        b = bits[i:i + CHUNK]
        scale = exps[i // BLOCK:(i + b.numel() + BLOCK - 1) // BLOCK].repeat_interleave(BLOCK)[:b.numel()]
        field = (b >> 23) & 0xFF
        mant = ((b & 0x7FFFFF) | ((field != 0).to(torch.int32) << 23)).to(torch.int64)
        k = field.clamp(min=1).to(torch.int64) - scale.to(torch.int64) + SHIFT
        magnitude = (mant << k.clamp(min=0)) >> (-k).clamp(0, 63)
        acc[i:i + CHUNK] = torch.where(b < 0, -magnitude, magnitude)
    dist.all_reduce(acc, op=dist.ReduceOp.SUM, group=group)
    # One rounding to f32, then an exact scaling by 2^(e - 150 - SHIFT) in f64.
    out = torch.empty_like(x)
    for i in range(0, n, CHUNK):
        m = min(CHUNK, n - i)
        scale = exps[i // BLOCK:(i + m + BLOCK - 1) // BLOCK].repeat_interleave(BLOCK)[:m]
        unit = ((scale.to(torch.int64) - 150 - SHIFT + 1023) << 52).view(torch.float64)
        out[i:i + CHUNK] = acc[i:i + CHUNK].to(torch.float32).to(torch.float64) * unit
    return out


def fingerprint(name, values):
    """Steadfast's fingerprint of one named f32 tensor (repro::fingerprint)."""
    import xxhash
    h = xxhash.xxh3_64()
    h.update(len(name).to_bytes(8, "little"))
    h.update(name.encode())
    h.update(values.numel().to_bytes(8, "little"))
    h.update(values.contiguous().numpy().tobytes())
    return h.hexdigest()


def worker(rank, world, args):
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank, world_size=world)
    for mb in args.mb:
        n = mb * 1_000_000 // 4
        data = collective_input(rank, n)
        for mode in args.reduce:
            times = []
            for i in range(args.repeats + 1):
                x = data.clone()
                dist.barrier()
                t = time.perf_counter()
                if mode == "fast":
                    dist.all_reduce(x, op=dist.ReduceOp.SUM)
                    out = x
                else:
                    out = reproducible_sum(x)
                if i > 0:
                    times.append(time.perf_counter() - t)
            seconds = sorted(times)[len(times) // 2]
            if rank == 0:
                bus = 2 * (world - 1) / world * mb / seconds
                print(json.dumps({"engine": "gloo", "world": world, "mb": mb, "mode": mode, "seconds": seconds,
                                  "bus_mb_per_s": bus, "sum_fingerprint": fingerprint("sum", out)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--mb", type=lambda s: [int(v) for v in s.split(",")], default=[1, 4, 16, 64, 256])
    ap.add_argument("--reduce", type=lambda s: s.split(","), default=["fast", "reproducible"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--port", type=int, default=29612)
    args = ap.parse_args()
    mp.spawn(worker, args=(args.world, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    sys.exit(main())
