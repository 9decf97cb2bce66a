"""Steadfast's elastic PyTorch job beside torchft, side by side, under the same blows.

Both train the study's MLP (784-256-128-10) by AdamW on Fashion-MNIST, global batch 256,
gloo/CPU, one thread per process, on 2 workers (torchft: 2 replica groups of one process
each, under torchrun, which restarts a killed one, with torchft's lighthouse; Steadfast:
`steadfast launch --nproc 2 --max-restarts 1000 -- python python/examples/elastic_ddp.py`,
the same model, data order and batch, micro-batches of 32, plus a cosine LR schedule).
One worker process (drawn at random, seeded) is killed with SIGKILL every T seconds, for
each T of KILLS, and never (the undisturbed run each disturbed one is compared with).

Per run: steps committed; samples skipped (torchft goes on without a lost replica group,
and its slice of each global batch is not trained on; Steadfast's steps always sum the
whole batch); wall time over the undisturbed run's; time from a kill until the job steps
again, and until the killed worker's replacement does; state moved to replacements; and
whether the final weights are the undisturbed run's, to the bit.

Usage: bench/run.sh torchft (installs torchft from PyPI beside the bench's PyTorch).
Environment: STEPS (default 2000), KILLS (default "15 8 4", seconds), SEED (default 1), LIMIT
(default 240: a run still going then is stopped, and its row says how far it got).
"""
import datetime
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_name, publish  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "steadfast")
ELASTIC = os.path.join(ROOT, "python", "examples", "elastic_ddp.py")
WORKER = os.path.join(ROOT, "bench", "torchft_worker.py")
STEPS = int(os.environ.get("STEPS", "2000"))
KILLS = [float(k) for k in os.environ.get("KILLS", "15 8 4").split()]
SEED = int(os.environ.get("SEED", "1"))
BATCH, PART = 256, 128
# The most seconds a run may take (a job that cannot make progress under its kills).
LIMIT = float(os.environ.get("LIMIT", "240"))
# The MLP's parameters and AdamW's two moments (and step counts), in bytes.
STATE_BYTES = 2821776


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env():
    path = os.pathsep.join(filter(None, [os.path.dirname(ELASTIC), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


class Killer(threading.Thread):
    """Kills one worker process every `every` seconds (the one `pids()` names at index
    drawn from `draw`), recording when and whom, until stopped."""

    def __init__(self, every, pids, draw):
        super().__init__(daemon=True)
        self.every, self.pids, self.draw = every, pids, draw
        self.kills, self.stop = [], threading.Event()

    def run(self):
        while not self.stop.wait(self.every):
            pids = self.pids()
            if not pids:
                continue
            victim = self.draw.randrange(len(pids))
            pid = pids[victim]
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                self.kills.append((time.time(), victim, pid))
            except ProcessLookupError:
                pass


def workers_running(pattern):
    """Pids of the worker processes whose command line matches `pattern` (not torchrun's,
    whose command line names the worker's script too)."""
    out = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True).stdout.splitlines()
    return [int(line.split()[0]) for line in out if "torch.distributed.run" not in line]


def run_steadfast(every, draw):
    out = tempfile.mkdtemp(prefix="sf-")
    cmd = [BIN, "launch", "--nproc", "2", "--max-restarts", "1000", "--", sys.executable, ELASTIC, "--steps",
           str(STEPS), "--batch", str(BATCH), "--micro-batches", "8"]
    log = open(os.path.join(out, "launch.log"), "w")
    started = time.time()
    job = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env(), start_new_session=True)
    text = lambda: open(os.path.join(out, "launch.log"), errors="replace").read()  # noqa: E731

    def pids():
        found = {}
        for w, pid in re.findall(r"worker (\d) started: process \d+ \(pid (\d+)\)", text()):
            found[int(w)] = int(pid)
        return [found.get(0), found.get(1)]

    while "epoch 1 steps" not in text() and job.poll() is None:
        time.sleep(0.1)
    killer = Killer(every, pids, draw) if every else None
    if killer:
        killer.start()
    try:
        job.wait(timeout=max(started + LIMIT - time.time(), 1))
        finished = True
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        finished = False
    ended = time.time()
    if killer:
        killer.stop.set()
    t = text()
    if finished and job.returncode != 0:
        raise SystemExit(f"steadfast's job failed:\n{t[-3000:]}")
    # (A job stopped at LIMIT had committed at least the step its last epoch began from.)
    steps = STEPS if finished else max((int(s) for s in re.findall(r"from step (\d+)", t)), default=0)
    shas = set(re.findall(r"weights sha256: ([0-9a-f]{64})", t))
    # When the job stepped again: the coordinator's "epoch N steps", seconds since the launch.
    resumed = [started + float(s) for s in re.findall(r"\[coordinator\]\s+([\d.]+) s\s+epoch \d+ steps", t)]
    fetched = sum(int(b) for b in re.findall(r"fetched the state of step \d+ \((\d+) bytes\)", t))
    kills = killer.kills if killer else []
    again = [min((r for r in resumed if r > k), default=ended) - k for k, _, _ in kills]
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": ended - started, "steps": steps, "skipped": 0, "kills": len(kills), "again": again,
            "replaced": again, "moved": fetched, "shas": shas, "finished": finished}


def run_torchft(every, draw, tfbin):
    out = tempfile.mkdtemp(prefix="tf-")
    port = free_port()
    lighthouse = subprocess.Popen([os.path.join(tfbin, "torchft_lighthouse"), "--min_replicas", "1",
                                   "--quorum_tick_ms", "100", "--join_timeout_ms", "1000", "--bind",
                                   f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    groups = []
    started = time.time()
    for r in range(2):
        e = dict(env(), TORCHFT_LIGHTHOUSE=f"http://127.0.0.1:{port}", REPLICA_GROUP_ID=str(r))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port",
               str(free_port()), "--max-restarts", "1000", "--monitor-interval", "0.5", WORKER, "--replica",
               str(r), "--replicas", "2", "--steps", str(STEPS), "--batch", str(BATCH), "--out", out]
        groups.append(subprocess.Popen(cmd, stdout=open(os.path.join(out, f"torchrun-{r}.log"), "w"),
                                       stderr=subprocess.STDOUT, env=e, start_new_session=True))

    def pids():
        return [next(iter(workers_running(f"torchft_worker.py --replica {r} ")), None) for r in range(2)]

    while not all(os.path.exists(os.path.join(out, f"r{r}.jsonl")) for r in range(2)):
        time.sleep(0.1)
    killer = Killer(every, pids, draw) if every else None
    if killer:
        killer.start()
    # A job that makes too little progress under its kills is stopped at LIMIT: the row
    # says how far it got.
    deadline = started + LIMIT
    for g in groups:
        try:
            g.wait(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            for h in groups:
                os.killpg(h.pid, signal.SIGKILL)
    ended = time.time()
    if killer:
        killer.stop.set()
    lighthouse.kill()
    records = {r: [json.loads(line) for line in open(os.path.join(out, f"r{r}.jsonl")) if line.strip()]
               for r in range(2)}
    ends = [rec for r in records.values() for rec in r if "end" in rec]
    steps = [rec for r in records.values() for rec in r if "step" in rec]
    if len(ends) != 2 and ended < deadline:
        raise SystemExit(f"torchft's job failed: {ends} in {out}")
    # Each committed step trained on its participants' slices only.
    committed = {}
    for rec in steps:
        if rec["next"] == rec["step"] + 1:
            committed[rec["step"]] = rec["participants"]
    skipped = sum((2 - p) * PART for p in committed.values())
    kills = killer.kills if killer else []
    again, replaced = [], []
    for at, victim, _ in kills:
        again.append(min((rec["t"] for rec in steps if rec["t"] > at), default=ended) - at)
        mine = [rec["t"] for rec in records[victim] if "step" in rec and rec["t"] > at]
        # The replacement's first step after it joined (its own log, after the kill).
        starts = [rec["start"] for rec in records[victim] if "start" in rec and rec["start"] > at]
        first = min((t for t in mine if starts and t > starts[0]), default=ended)
        replaced.append(first - at)
    # A restarted process whose first step ends past step 1 was healed from a live peer
    # (the quorum at the start of that step sent it the state).
    heals = 0
    for r in range(2):
        lines = records[r]
        for i, rec in enumerate(lines):
            if "start" in rec and i > 0:
                nxt = next((x for x in lines[i + 1:] if "step" in x), None)
                heals += nxt is not None and nxt["next"] > 1
    moved = heals * (ends[0]["state_bytes"] if ends else STATE_BYTES)
    shutil.rmtree(out, ignore_errors=True)
    return {"wall": ended - started, "steps": max(committed, default=-1) + 1, "skipped": skipped,
            "kills": len(kills), "again": again, "replaced": replaced, "moved": moved,
            "shas": {e["weights_sha256"] for e in ends}, "finished": len(ends) == 2}


def median(xs):
    """The median, as a table cell ("–" when there is nothing to take it of)."""
    return f"{statistics.median(xs):.2f}" if xs else "–"


def main():
    import torch

    tfbin = os.path.dirname(shutil.which("torchft_lighthouse") or sys.executable)
    draw = random.Random(SEED)
    results = {}
    for system in ("steadfast", "torchft"):
        for every in [0.0] + KILLS:
            r = run_steadfast(every, draw) if system == "steadfast" else run_torchft(every, draw, tfbin)
            results[(system, every)] = r
            print(system, every, {k: v for k, v in r.items() if k != "shas"}, flush=True)
    lines = [
        "<!-- torchft:start -->",
        "## A PyTorch job under repeated kills: steadfast.elastic beside torchft",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; PyTorch"
        f" {torch.__version__}; torchft 0.2.0 from PyPI with its lighthouse; gloo on this host, one thread per process.",
        f"- Command: `STEPS={STEPS} KILLS=\"{' '.join(f'{k:g}' for k in KILLS)}\" SEED={SEED} LIMIT={LIMIT:g}"
        " bench/run.sh torchft`"
        " (driver: `bench/side_by_side_torchft.py`; torchft's worker: `bench/torchft_worker.py`; Steadfast's:"
        " `python/examples/elastic_ddp.py`).",
        f"- The study's MLP, AdamW, Fashion-MNIST, global batch {BATCH}, {STEPS} steps on 2 workers; every T seconds"
        " one worker process, drawn at random, is killed with SIGKILL (torchrun restarts torchft's, `steadfast"
        " launch` replaces Steadfast's). *skipped*: examples of committed steps that no worker trained on; *again*:"
        " median seconds from a kill until the job committed its next step; *replaced*: until the killed worker's"
        " replacement stepped; *moved*: bytes of state sent to replacements; *same bits*: the final weights equal"
        " the same system's undisturbed run. Failure detection as each ships it: Steadfast's coordinator sees a killed"
        " worker's connection close; torchft's lighthouse waits for its heartbeat timeout (5 s by default).",
        "",
        "| system | kill every | kills | steps committed | skipped | wall (s) | wall / undisturbed | again (s)"
        " | replaced (s) | moved (MB) | same bits |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (system, every), r in results.items():
        base = results[(system, 0.0)]
        same = "yes" if r["shas"] == base["shas"] and len(r["shas"]) == 1 else "no"
        if not r["finished"]:
            same = f"did not finish in {LIMIT:.0f} s"
        lines.append(
            f"| {system} | {'never' if not every else f'{every:g} s'} | {r['kills']} | {r['steps']} | {r['skipped']:,}"
            f" | {r['wall']:.1f} | {r['wall'] / base['wall']:.2f}x | {median(r['again'])}"
            f" | {median(r['replaced'])} | {r['moved'] / 1e6:.1f} | {same} |")
    lines.append("<!-- torchft:end -->")
    publish("torchft", lines)


if __name__ == "__main__":
    main()
