"""One replica group of the torchft side of `bench/side_by_side_torchft.py`: the study's MLP trained by
AdamW on Fashion-MNIST with torchft's Manager, its DDP wrapper and its optimizer wrapper,
gloo on the CPU, one process per replica group (under torchrun, which restarts it when it
is killed; torchft heals it from a live peer).

The same model, data order, global batch and optimizer as `python/examples/elastic_ddp.py`
(without its LR schedule, which torchft's wrapper would step once per attempt): step `s`
takes the global batch of `--batch` examples that Steadfast's job takes at step `s`, and
replica group `r` of `R` trains on slice `r` of it. A step that a replica group misses (it
is dead, or healing) skips its slice: that is how torchft goes on.

Each step appends one JSON line to `--out/r<R>.jsonl` (the step, the time, the
participants); the end appends the final weights' SHA-256 and torchft's counts.
"""
import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python", "examples"))
from elastic_ddp import mlp  # noqa: E402  (the same model)
from exact_restart import fashion_mnist  # noqa: E402

from steadfast import _steadfast  # noqa: E402  (the same data order)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replica", type=int, required=True)
    ap.add_argument("--replicas", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo

    torch.set_num_threads(1)
    x, y = fashion_mnist(a.data)
    torch.manual_seed(a.seed)
    model = mlp(a.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inner = model

    def load_state_dict(sd):
        inner.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    def state_dict():
        return {"model": inner.state_dict(), "optim": opt.state_dict()}

    # The first processes of the replica groups start together (as Steadfast's first quorum
    # waits for its workers); a restarted one joins the job where it is.
    ready = os.path.join(a.out, f"ready-{a.replica}")
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        open(ready, "w").close()
        while not all(os.path.exists(os.path.join(a.out, f"ready-{r}")) for r in range(a.replicas)):
            time.sleep(0.05)
    manager = Manager(pg=ProcessGroupGloo(), min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"r{a.replica}", timeout=timedelta(seconds=30))
    model = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, opt)
    log = open(os.path.join(a.out, f"r{a.replica}.jsonl"), "a", buffering=1)
    log.write(json.dumps({"start": time.time(), "pid": os.getpid()}) + "\n")
    per_epoch = len(x) // a.batch
    part = a.batch // a.replicas
    orders = {}
    while manager.current_step() < a.steps:
        step = manager.current_step()
        epoch, at = divmod(step, per_epoch)
        if epoch not in orders:
            orders = {epoch: torch.frombuffer(_steadfast.data_order(a.seed, len(x), epoch), dtype=torch.int32).long()}
        start = at * a.batch + a.replica * part
        idx = orders[epoch][start:start + part]
        optimizer.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
        log.write(json.dumps({"step": step, "t": time.time(), "participants": manager.num_participants(),
                              "next": manager.current_step()}) + "\n")
    digest = hashlib.sha256()
    for name, t in inner.state_dict().items():
        digest.update(name.encode() + b"\0")
        digest.update(t.detach().contiguous().numpy().tobytes())
    state_bytes = sum(t.numel() * t.element_size() for t in inner.state_dict().values())
    state_bytes += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                       if torch.is_tensor(v))
    log.write(json.dumps({"end": time.time(), "weights_sha256": digest.hexdigest(), "steps": manager.current_step(),
                          "batches_committed": manager.batches_committed(), "state_bytes": state_bytes}) + "\n")
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
