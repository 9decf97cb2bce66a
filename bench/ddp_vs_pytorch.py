"""Data-parallel training steps/s for 1, 2 and 4 workers: Steadfast (`launch`, fast and
reproducible all-reduce) against PyTorch DDP with gloo, on the same model, global batch
and world size, side by side in one run; plus each side's final-weights hash per world
size, to show whether the result depends on the number of workers. At one worker, Steadfast's
job is also compared with single-process `steadfast train` on the same micro-batches and
threads: the cost of being a job (coordinator, heartbeats, the per-step vote).

Each cell is the median of REPEATS runs (default 3), the runs of one repetition alternating
between the sides.

Usage: bench/.venv/bin/python bench/ddp_vs_pytorch.py   (bench/run.sh ddp does this)
"""
import datetime, json, os, socket, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
STEPS = int(os.environ.get("STEPS", "1000"))
REPEATS = int(os.environ.get("REPEATS", "3"))
WORLDS = [1, 2, 4]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steadfast(world, reduce, job=True):
    """Steps/s and fingerprint of a `launch` job of `world` workers (or, with job=False, of
    one `train` process)."""
    with tempfile.TemporaryDirectory() as out:
        run = ["train", "--model", "mlp", "--data", "fashion-mnist", "--steps", str(STEPS), "--batch", "128",
               "--micro-batch", "32", "--reduce", reduce, "--eval-every", "0", "--out", out]
        cmd = [BIN] + (["launch", "--nproc", str(world), "--"] if job else []) + run
        env = dict(os.environ, RAYON_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // world)))
        res = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            s = json.loads(f.read().splitlines()[-1])
    fp = [l.split("fingerprint: ")[1].split()[0] for l in res.stdout.splitlines() if "fingerprint: " in l][0]
    return STEPS / s["train_seconds"], fp


def torch_ddp(world):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "torch_ddp.py"), "--world", str(world), "--steps", str(STEPS),
           "--port", str(free_port())]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    return STEPS / r["seconds"], r["weights_sha256"]


def main():
    import torch
    rows = []
    single = []
    for w in WORLDS:
        fast, rep, ddp = [], [], []
        for _ in range(REPEATS):
            if w == 1:
                single.append(steadfast(1, "reproducible", job=False)[0])
            f, fast_fp = steadfast(w, "fast")
            r, rep_fp = steadfast(w, "reproducible")
            d, ddp_hash = torch_ddp(w)
            fast.append(f)
            rep.append(r)
            ddp.append(d)
        rows.append((w, statistics.median(fast), statistics.median(rep), statistics.median(ddp), fast_fp, rep_fp,
                     ddp_hash))
        print(rows[-1], flush=True)
    lines = [
        "<!-- ddp:start -->",
        "## Data-parallel training against PyTorch DDP (gloo)",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; PyTorch {torch.__version__}.",
        "- Command: `bench/run.sh ddp` (driver: `bench/ddp_vs_pytorch.py`, peer: `bench/torch_ddp.py`).",
        f"- MLP on Fashion-MNIST, global batch 128 (Steadfast: 4 micro-batches of 32 spread over the workers;"
        f" DDP: 128/W per rank), AdamW, {STEPS} steps, all workers on this host, threads per worker = cores / W."
        f" Steps/s of rank 0's training loop, median of {REPEATS} runs, the sides alternating.",
        "",
        "| workers | Steadfast fast steps/s | Steadfast reproducible steps/s | DDP gloo steps/s | reproducible / DDP |"
        " Steadfast reproducible fingerprint | DDP final weights hash |",
        "|---|---|---|---|---|---|---|",
    ]
    for w, fast, rep, ddp, fast_fp, rep_fp, ddp_hash in rows:
        lines.append(f"| {w} | {fast:.1f} | {rep:.1f} | {ddp:.1f} | {rep / ddp:.2f}x | `{rep_fp}` | `{ddp_hash}` |")
    same = len({r[5] for r in rows}) == 1
    ddp_same = len({r[6] for r in rows}) == 1
    one = statistics.median(single)
    lines += ["", f"One worker against one `steadfast train` process on the same 4 micro-batches of 32 (reproducible,"
              f" {os.cpu_count()} threads): {rows[0][2]:.1f} against {one:.1f} steps/s, {rows[0][2] / one:.2f}x.",
              "", f"Steadfast reproducible fingerprint identical for 1, 2 and 4 workers: {'yes' if same else 'no'}."
              f" PyTorch DDP final weights identical across world sizes: {'yes' if ddp_same else 'no'}.",
              "<!-- ddp:end -->"]
    publish("ddp", lines)


if __name__ == "__main__":
    main()
