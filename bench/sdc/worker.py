"""One rank of a checkpoint-alteration job on PyTorch DDP or Horovod.

A job is started once per (library, model, world) the way each library's users start one
(`torchrun` for DDP, `horovodrun --gloo` for Horovod) and then runs many trials in turn, so
that a trial costs its training steps and not a process start. Two modes:

- `--golden`: train from the seed to the last step any trial reaches; rank 0 saves
  checkpoints as the library's users do (`torch.save` of the model's and the optimizer's
  state dicts and the step) at every injection step, and the reference states, losses and
  final scores every trial is compared with.
- `--trials A:B`: for each trial of the plan in [A, B): rank 0 alters a copy of the golden
  checkpoint with `steadfast inject`; the ranks resume from it with the library's own
  resume idiom, train on, record how far the altered bits spread (elements differing from
  the golden state, per tensor and per rank, at fixed steps after the resume) and score the
  final model. One JSON line per trial and rank goes to `trials-rank<R>.jsonl`.

Resume idioms, as each library documents them:
- DDP: every rank calls `torch.load` on the file and loads the state into the wrapped
  module and its optimizer (the tutorial's order: the model is wrapped once, at start).
- Horovod: rank 0 loads the file, then `broadcast_parameters` and
  `broadcast_optimizer_state` copy rank 0's state to the others.

A trial's placement says who reads the altered copy: `all` (the checkpoint every rank
resumes from is altered) or `one` (only rank `rank`'s copy is; the other ranks read the
pristine file, as after a corruption in one node's storage or memory).
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from torch_train import LeNet, Mlp, load_images  # noqa: E402

# Steps after the resume at which a trial's state is compared with golden's, element by
# element (0: right after loading). The window's last step is added per model.
OFFSETS = (0, 1, 2, 5, 10, 20)
EVAL_EXAMPLES = 2000
# An element "far" from golden's: off by more than this fraction of golden's magnitude.
LARGE = 0.01


class Library:
    """The collective layer: DDP (torch.distributed on gloo) or Horovod."""

    def __init__(self, name, model, lr):
        self.name = name
        if name == "ddp":
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            dist.init_process_group("gloo")
            self.dist = dist
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
            self.module = model
            self.model = DDP(model)
            self.opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        else:
            import horovod.torch as hvd
            hvd.init()
            self.hvd = hvd
            self.rank, self.world = hvd.rank(), hvd.size()
            self.module = self.model = model
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            self.opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def barrier(self):
        if self.name == "ddp":
            self.dist.barrier()
        else:
            self.hvd.allreduce(torch.zeros(1), name="barrier")

    def checkpoint(self, step):
        """The state users save: model, optimizer, step."""
        return {"model": self.module.state_dict(), "optimizer": self.opt.state_dict(), "step": step}

    def resume(self, path_of_rank):
        """Loads a checkpoint with the library's idiom; `path_of_rank(r)` is the file rank r
        would read."""
        if self.name == "ddp":
            state = torch.load(path_of_rank(self.rank), map_location="cpu")
            self.module.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
        else:
            if self.rank == 0:
                state = torch.load(path_of_rank(0), map_location="cpu")
                self.module.load_state_dict(state["model"])
                self.opt.load_state_dict(state["optimizer"])
            self.hvd.broadcast_parameters(self.module.state_dict(), root_rank=0)
            self.hvd.broadcast_optimizer_state(self.opt, root_rank=0)

    def finish(self):
        self.barrier()
        if self.name == "ddp":
            self.dist.destroy_process_group()
        else:
            self.hvd.shutdown()


def state_tensors(lib):
    """Every tensor a checkpoint holds, named as `steadfast inject` names them."""
    out = {f"model.{k}": v for k, v in lib.module.state_dict().items()}
    for i, s in lib.opt.state_dict()["state"].items():
        for k, v in s.items():
            if torch.is_tensor(v):
                out[f"optimizer.state.{i}.{k}"] = v
    return {k: v.detach().clone() for k, v in out.items()}


def differing(now, golden):
    """Per tensor, the elements whose bits differ from golden's and, of them, those off by
    more than LARGE relatively (or non-finite); only tensors that differ are named."""
    bits, large = {}, {}
    for name, g in golden.items():
        t = now[name]
        if t.dtype == torch.float32:
            n = int((t.view(torch.int32) != g.view(torch.int32)).sum())
        else:
            n = int((t != g).sum())
        if not n:
            continue
        bits[name] = n
        if t.is_floating_point():
            off = ~torch.isfinite(t) | ((t - g).abs() > LARGE * g.abs())
            if int(off.sum()):
                large[name] = int(off.sum())
    return {"tensors": bits, "large": large}


class Data:
    """Fashion-MNIST in a fixed order: step s uses the global batch s of a permutation drawn
    per epoch from the seed; rank r takes its contiguous share."""

    def __init__(self, data_dir, seed, batch, rank, world):
        x, y = load_images(data_dir, "train")
        self.x, self.y = x, y
        tx, ty = load_images(data_dir, "t10k")
        self.test = (tx[:EVAL_EXAMPLES], ty[:EVAL_EXAMPLES])
        self.seed, self.batch, self.rank, self.world = seed, batch, rank, world
        self.per_rank = batch // world
        self.per_epoch = len(y) // batch
        self._perms = {}

    def step(self, s):
        epoch, i = divmod(s, self.per_epoch)
        if epoch not in self._perms:
            self._perms[epoch] = torch.from_numpy(np.random.default_rng([self.seed, epoch]).permutation(len(self.y)))
        lo = i * self.batch + self.rank * self.per_rank
        idx = self._perms[epoch][lo:lo + self.per_rank]
        return self.x[idx], self.y[idx]


def train_step(lib, data, s):
    x, y = data.step(s)
    loss = F.cross_entropy(lib.model(x), y)
    lib.opt.zero_grad()  # None grads in PyTorch 2 (Horovod's optimizer takes no argument)
    loss.backward()
    lib.opt.step()
    return float(loss)


@torch.no_grad()
def evaluate(lib, data):
    x, y = data.test
    out = lib.module(x)
    return float(F.cross_entropy(out, y)), float((out.argmax(1) == y).float().mean())


def build(a):
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model = Mlp(a.width) if a.model == "mlp" else LeNet()
    lib = Library(a.library, model, a.lr)
    data = Data(a.data_dir, a.seed, a.batch, lib.rank, lib.world)
    return lib, data


def golden(a, plan):
    lib, data = build(a)
    inject_at, after = sorted(plan["inject_at"]), plan["steps_after"]
    snap_steps = {s + o for s in inject_at for o in OFFSETS + (after,)}
    end = max(inject_at) + after
    losses, snapshots, scores = {}, {}, {}
    for s in range(end + 1):
        if s in inject_at:
            if lib.rank == 0:
                torch.save(lib.checkpoint(s), os.path.join(a.out, f"ckpt-{s}.pt"))
            lib.barrier()
        if s in snap_steps:
            snapshots[s] = state_tensors(lib)
        if s - after in inject_at:
            scores[s] = evaluate(lib, data)
        if s == end:
            break
        losses[s] = train_step(lib, data, s)
    # Each rank keeps its own reference: in a healthy data-parallel job they are equal,
    # and the digest lets the study check that they were.
    torch.save(snapshots, os.path.join(a.out, f"golden-states-rank{lib.rank}.pt"))
    digest = state_digest(snapshots[end])
    record = {"rank": lib.rank, "world": lib.world, "losses": losses, "scores": scores, "digest": digest}
    with open(os.path.join(a.out, f"golden-rank{lib.rank}.json"), "w") as f:
        json.dump(record, f)
    lib.finish()


def state_digest(tensors):
    h = hashlib.sha256()
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].numpy().tobytes())
    return h.hexdigest()[:16]


def inject(a, trial, work):
    """Rank 0's part of a trial: the altered copy, and the flips its log lists (none for a
    control trial, whose copy is the pristine file's)."""
    pristine = os.path.join(a.out, f"ckpt-{trial['inject_at']}.pt")
    altered = os.path.join(work, "altered.pt")
    log = os.path.join(work, "altered.inject.json")
    for path in (altered, log):  # inject refuses to overwrite a file
        if os.path.exists(path):
            os.remove(path)
    if trial["count"] == 0:
        shutil.copyfile(pristine, altered)
        return []
    role = {"model": "model", "optimizer": "optim"}[trial["kind"]]
    cmd = [a.steadfast, "inject", pristine, "--out", altered, "--role", role, "--bits", trial["bits"],
           "--count", str(trial["count"]), "--seed", str(trial["seed"]), "--log", log]
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"steadfast inject failed: {r.stderr.strip().splitlines()[0]} (command: {' '.join(cmd)})")
    with open(log) as f:
        return [{"tensor": r["tensor"], "element": r["element"], "bits": r["bits"], "old": r["old_value"],
                 "new": r["new_value"]} for r in json.load(f)["flips"]]


def trials(a, plan):
    lib, data = build(a)
    goldens = torch.load(os.path.join(a.out, f"golden-states-rank{lib.rank}.pt"))
    with open(os.path.join(a.out, f"golden-rank{lib.rank}.json")) as f:
        gold = json.load(f)
    after = plan["steps_after"]
    first, last = (int(x) for x in a.trials.split(":"))
    work = os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    out = open(os.path.join(a.out, f"trials-rank{lib.rank}.jsonl"), "a")
    for trial in plan["trials"][first:last]:
        start = time.perf_counter()
        s0 = trial["inject_at"]
        flips = inject(a, trial, work) if lib.rank == 0 else None
        lib.barrier()
        pristine = os.path.join(a.out, f"ckpt-{s0}.pt")
        altered = os.path.join(work, "altered.pt")

        def path_of_rank(r):
            return altered if trial["placement"] == "all" or r == trial["rank"] else pristine
        lib.resume(path_of_rank)
        spread, losses = {}, {}
        for s in range(s0, s0 + after + 1):
            o = s - s0
            if o in OFFSETS or o == after:
                now = state_tensors(lib)
                spread[o] = differing(now, goldens[s])
            if o == after:
                break
            losses[s] = train_step(lib, data, s)
        loss, acc = evaluate(lib, data)
        g_loss, g_acc = gold["scores"][str(s0 + after)]
        record = {"trial": trial["index"], "rank": lib.rank, "flips": flips, "spread": spread,
                  "losses": losses, "golden_losses": {s: gold["losses"][str(s)] for s in losses},
                  "test_loss": loss, "test_accuracy": acc, "golden_test_loss": g_loss,
                  "golden_test_accuracy": g_acc, "end_digest": state_digest(now), "seconds": time.perf_counter() - start}
        out.write(json.dumps(record) + "\n")
        out.flush()
        lib.barrier()
    out.close()
    lib.finish()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--library", choices=["ddp", "horovod"], required=True)
    ap.add_argument("--model", choices=["mlp", "cnn"], required=True)
    ap.add_argument("--plan", required=True, help="the trials, as the study writes them (JSON)")
    ap.add_argument("--out", required=True, help="the job's directory: checkpoints, references, records")
    ap.add_argument("--golden", action="store_true", help="run the golden run instead of trials")
    ap.add_argument("--trials", default="0:0", help="A:B, the plan's trials to run")
    ap.add_argument("--steadfast", default="steadfast", help="the steadfast binary")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--batch", type=int, default=128, help="global batch")
    ap.add_argument("--width", type=int, default=256, help="the MLP's width (784-W-W/2-10)")
    ap.add_argument("--lr", type=float, help="default: 1e-3 for the MLP, 2e-3 for the CNN (Steadfast's)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.lr is None:
        a.lr = 1e-3 if a.model == "mlp" else 2e-3
    with open(a.plan) as f:
        plan = json.load(f)
    os.makedirs(a.out, exist_ok=True)
    (golden if a.golden else trials)(a, plan)


if __name__ == "__main__":
    main()
