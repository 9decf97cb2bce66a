"""PyTorch side of the checkpoint/restart study (bench/study/study.py runs it).

The MLP (784-W-W/2-10, ReLU) or LeNet-5 on Fashion-MNIST, batch 128, AdamW, checkpointed
the way PyTorch's users do: `torch.save` of the model's and the optimizer's state dicts
and the step (`torch.save`), or the same dict through `torch.distributed.checkpoint`
(`dcp`). The data order is what a `DataLoader(shuffle=True)` gives: a fresh permutation
of the training set each epoch, drawn from PyTorch's global generator seeded at start;
or, with `--order`, Steadfast's.

Commands (each prints one JSON object; flags in workload.py):

  cost      step times with a checkpoint every K steps (synchronous: the stall is the
            save), the time to load the last checkpoint, and its size on disk
  run       train, optionally saving at step N or resuming from D; the SHA-256 of the
            final weights; `--with-rng` also saves the generator's state from before the
            current epoch's permutation, and a resumed run redraws that permutation
  contents  save as users do and report what `torch.load` gives back
  integrity save, then flip one bit in the middle of the (largest) file, and truncate it:
            does loading notice?
  export    after 3 steps, save with each saver into D and write the weights beside them
            (for Steadfast's readers to load)
  scale     one rank of a data-parallel job (DDP over gloo; RANK, WORLD_SIZE, MASTER_ADDR
            and MASTER_PORT in the environment): train with a checkpoint every K steps,
            DCP (every rank writes its part) or `torch.save` on rank 0 while the others
            wait at a barrier, as PyTorch's DDP tutorial does
"""
import hashlib, os, shutil, time

import numpy as np
import torch
import torch.nn.functional as F

import workload
from damage import KINDS, damaged_copy
from torch_train import LeNet, Mlp  # the training benchmark's models (workload puts bench/ on the path)

BATCH = workload.BATCH


# Steadfast keeps a linear layer's weight as [in, out]; PyTorch as [out, in].
def to_torch(name, w):
    return w.T if name.endswith(".weight") and w.ndim == 2 else w


def setup(a, threads=None):
    torch.set_num_threads(threads or a.threads)
    torch.manual_seed(0)
    model = Mlp(a.width) if a.model == "mlp" else LeNet()
    if a.init:
        init = workload.read_tensors(a.init)
        model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(to_torch(k, init["model." + k])))
                               for k in model.state_dict()})
    lr = 1e-3 if a.model == "mlp" else 2e-3
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    return model, opt


def dump(model, path):
    workload.write_tensors(path, {"model." + k: to_torch(k, v.detach().numpy()) for k, v in model.state_dict().items()})


def data(a, start_step):
    x, y = workload.load_images(a.data_dir)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    order = batches(len(y), start_step) if not a.order else (
        torch.from_numpy(i) for i in workload.steadfast_batches(a.order, start_step))
    return x, y, order


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
    model, opt = setup(a)
    x, y, order = data(a, 0)
    path = os.path.join(a.dir, "ckpt.pt" if a.saver == "torch.save" else "ckpt")
    steps, saves, profiler = [], [], workload.Profiler(a.profile)
    for step in range(1, a.steps + 1):
        t = time.perf_counter()
        train_step(model, opt, x, y, next(order))
        steps.append(time.perf_counter() - t)
        if step % a.every == 0:
            if os.path.isdir(path):
                shutil.rmtree(path)
            t = time.perf_counter()
            with profiler:
                save(a.saver, model, opt, step, path)
            saves.append(time.perf_counter() - t)
    loaded = None
    if saves:
        t = time.perf_counter()
        load(a.saver, model, opt, path)
        loaded = time.perf_counter() - t
    return {"step_seconds": steps, "save_seconds": saves, "load_seconds": loaded,
            "bytes": workload.size_on_disk(path) if saves else 0,
            "state_bytes": workload.state_bytes(model.state_dict().values()), "version": torch.__version__,
            "profile": profiler.top()}


def run(a):
    model, opt = setup(a)
    start = 0
    if a.resume:
        start, rng = load(a.saver, model, opt, a.resume)
        if rng is not None:
            torch.set_rng_state(rng)
    x, y, order = data(a, start)
    for step in range(start + 1, a.steps + 1):
        train_step(model, opt, x, y, next(order))
        if step == a.save_at:
            save(a.saver, model, opt, step, a.dir, a.with_rng)
    if a.dump:
        dump(model, a.dump)
    return {"weights_sha256": weights_hash(model)}


def trained(a, steps):
    """Model and optimizer after `steps` steps on one thread."""
    os.makedirs(a.dir, exist_ok=True)
    model, opt = setup(a, 1)
    x, y, order = data(a, 0)
    for _ in range(steps):
        train_step(model, opt, x, y, next(order))
    return model, opt


def contents(a):
    model, opt = trained(a, 1)
    path = os.path.join(a.dir, "ckpt.pt")
    save("torch.save", model, opt, 1, path)
    s = torch.load(path, weights_only=False)
    slots = s["optimizer"]["state"]
    return {"weights": bool(s.get("model")), "optimizer state": bool(slots) and all("step" in v for v in slots.values()),
            "RNG": any("rng" in k for k in s), "data position": any(k in s for k in ("epoch", "sampler", "data")),
            "step": "step" in s}


def integrity(a):
    model, opt = trained(a, 3)
    clean = os.path.join(a.dir, "clean")
    save(a.saver, model, opt, 3, clean)
    want = weights_hash(model, opt)
    out = {}
    for damage in KINDS:
        bad = os.path.join(a.dir, damage.replace(" ", "-"))
        damaged_copy(clean, bad, damage)

        def reload():
            m2, o2 = trained(a, 1)  # a step gives the optimizer its slots
            load(a.saver, m2, o2, bad)
            return weights_hash(m2, o2)
        out[damage] = workload.load_outcome(reload, want)
    return out


def export(a):
    model, opt = trained(a, 3)
    weights = os.path.join(a.dir, "weights.safetensors")
    dump(model, weights)
    out = {}
    for saver, name in [("torch.save", "ckpt.pt"), ("dcp", "dcp")]:
        save(saver, model, opt, 3, os.path.join(a.dir, name))
        out[saver] = {"path": os.path.join(a.dir, name), "weights": weights}
    return out


def scale(a):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, opt = setup(a, 1)
    ddp = DDP(model)
    x, y = (torch.from_numpy(v) for v in workload.load_images(a.data_dir))
    path = os.path.join(a.dir, "ckpt.pt" if a.saver == "torch.save" else "dcp")
    saves = []
    dist.barrier()
    start = time.perf_counter()
    for step in range(1, a.steps + 1):
        train_step(ddp, opt, x, y, torch.from_numpy(workload.rank_slice(step, rank, world)))
        if step % a.every == 0:
            t = time.perf_counter()
            if a.saver == "dcp":
                save("dcp", model, opt, step, path)
            else:
                if rank == 0:
                    save("torch.save", model, opt, step, path)
                dist.barrier()
            saves.append(time.perf_counter() - t)
    dist.barrier()
    seconds = time.perf_counter() - start
    dist.destroy_process_group()
    return workload.scale_result(a, rank, seconds, saves, [path], weights_hash(model))


def main():
    a = workload.arguments(["torch.save", "dcp"]).parse_args()
    workload.emit({"cost": cost, "run": run, "contents": contents, "integrity": integrity, "export": export,
                   "scale": scale}[a.command](a))


if __name__ == "__main__":
    main()
