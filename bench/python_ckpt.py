"""What a checkpoint costs a PyTorch loop: steadfast.torch's savers against torch.save and
torch.distributed.checkpoint (DCP), side by side in one process.

For each model (the checkpoint study's MLP, and a 33M-parameter stack of linear layers)
with AdamW's state, each saver saves {"model", "optimizer", "step"} REPEAT times, one
training step apart, into a directory of its own on the same disk; the savers take turns
within each round, so that the machine's drift spreads over all of them:

- stall: how long the loop waits per save (a synchronous saver: the whole save; an
  asynchronous one: until it hands the snapshot over);
- durable: from the call until the checkpoint is on disk (an asynchronous saver: until it
  reports the write done). torch.save does not fsync: its row is given as it returns and
  with an fsync of the file added; DCP's savers and Steadfast's fsync their files.

Usage: bench/run.sh python-ckpt (needs the package: it installs python/ into bench/.venv).
Environment: REPEAT (default 5).
"""
import datetime, os, shutil, statistics, sys, tempfile, time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_name, fsync_path, publish  # noqa: E402

import steadfast.torch as st  # noqa: E402

REPEAT = int(os.environ.get("REPEAT", "5"))


def models():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 10))
    big = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)])
    return {"mlp": (mlp, 784), "linear-33M": (big, 2048)}


def train_step(model, opt, width):
    loss = model(torch.randn(16, width)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


class Saver:
    """One saver with its own directory (and, for Steadfast's asynchronous one, its
    checkpointer)."""

    def __init__(self, kind):
        self.kind = kind
        self.root = tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR", "/var/tmp"))
        self.async_ = st.AsyncCheckpointer(os.path.join(self.root, "async")) if kind == "AsyncCheckpointer" else None
        self.stalls, self.durables = [], []

    def save(self, state, step, record):
        """One save; returns (stall, durable) in seconds."""
        began = time.perf_counter()
        kind, root = self.kind, self.root
        if kind.startswith("torch.save"):
            path = os.path.join(root, f"{step}.pt")
            torch.save(state, path)
            if kind.endswith("fsync"):
                fsync_path(path)
            stall = durable = time.perf_counter() - began
        elif kind == "dcp.save":
            dcp.save(state, checkpoint_id=os.path.join(root, str(step)))
            stall = durable = time.perf_counter() - began
        elif kind == "dcp.async_save":
            future = dcp.async_save(state, checkpoint_id=os.path.join(root, str(step)))
            stall = time.perf_counter() - began
            future.result()
            durable = time.perf_counter() - began
        elif kind == "steadfast.torch.save":
            st.save(state, root, step=step, keep_last=2)
            stall = durable = time.perf_counter() - began
        else:
            self.async_.save(state, step)
            stall = time.perf_counter() - began
            self.async_.wait()
            durable = time.perf_counter() - began
        if record:
            self.stalls.append(stall)
            self.durables.append(durable)

    def close(self):
        if self.async_ is not None:
            self.async_.close()
        shutil.rmtree(self.root, ignore_errors=True)


def measure(model, opt, width):
    """Every saver, interleaved: round r trains one step and then has each saver save it
    (round 0 is a warm-up), so that the machine's drift spreads over all of them."""
    savers = [Saver(kind) for kind in SAVERS]
    try:
        for r in range(REPEAT + 1):
            train_step(model, opt, width)
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": r}
            # Each round starts with another saver, so that none is always first after
            # the training step (or after another's writes).
            for s in savers[r % len(savers):] + savers[:r % len(savers)]:
                s.save(state, r, record=r > 0)
                # Old files go before the next save, so the disk holds about one of each.
                for name in os.listdir(s.root):
                    if name.startswith(str(r - 1)) and name != "async":
                        p = os.path.join(s.root, name)
                        shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.remove(p)
        return {s.kind: (statistics.median(s.stalls), statistics.median(s.durables)) for s in savers}
    finally:
        for s in savers:
            s.close()


SAVERS = ["torch.save", "torch.save + fsync", "dcp.save", "dcp.async_save", "steadfast.torch.save", "AsyncCheckpointer"]


def main():
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("gloo", rank=0, world_size=1)
    rows = []
    for name, (model, width) in models().items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        train_step(model, opt, width)
        size = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3
        for saver, (stall, durable) in measure(model, opt, width).items():
            rows.append((name, size, saver, stall, durable))
            print(rows[-1], flush=True)
    dist.destroy_process_group()
    lines = [
        "<!-- python-ckpt:start -->",
        "## PyTorch checkpoints: steadfast.torch against torch.save and DCP",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; PyTorch"
        f" {torch.__version__}, one thread; the disk under {os.environ.get('BENCH_DIR', '/var/tmp')}.",
        f"- Command: `REPEAT={REPEAT} bench/run.sh python-ckpt` (driver: `bench/python_ckpt.py`).",
        "- Each saver saves the model's and AdamW's state dicts and the step, one training step apart, the savers"
        f" interleaved (each round trains a step, then every saver saves it, starting with a different one each round); medians of {REPEAT} rounds after a"
        " warm-up. *stall*: how long the loop waits per save; *durable*: until the checkpoint is on disk"
        " (asynchronous savers: until they report the write done). `torch.save` does not fsync; its second row adds"
        " an fsync of the file. DCP runs in a one-process gloo group.",
        "- On this machine `torch.save` of the 400 MB state alone measured slower than with the fsync added, in every run; why was not"
        " examined.",
        "",
        "| model | state | saver | stall (ms) | durable (ms) | stall / torch.save |",
        "|---|---|---|---|---|---|",
    ]
    base = {r[0]: r[3] for r in rows if r[2] == "torch.save"}
    for name, size, saver, stall, durable in rows:
        lines.append(f"| {name} | {size / 1e6:.1f} MB | {saver} | {stall * 1e3:.2f} | {durable * 1e3:.2f} |"
                     f" {stall / base[name]:.2f}x |")
    lines.append("<!-- python-ckpt:end -->")
    publish("python-ckpt", lines)


if __name__ == "__main__":
    main()
