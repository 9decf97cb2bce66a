"""Throughput cost of checkpointing during training: steps/s with a checkpoint every N
steps against the same run without checkpoints, side by side (rounds alternate the
configurations), and the smallest N that keeps the overhead under 3.5% (CheckFreq's
figure). The asynchronous writer persists on a background thread, which competes with
training for the machine's cores; that cost is included.

Usage: bench/.venv/bin/python bench/ckpt_training_overhead.py   (bench/run.sh overhead)
"""
import datetime, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
ROUNDS = int(os.environ.get("ROUNDS", "5"))
EVERY = [1, 2, 5, 10, 20, 50, 100]
MODELS = {"mlp": 1000, "cnn": 200}
TARGET = 0.035


def run(model, steps, every):
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "bench", "out")) as tmp:
        cmd = [BIN, "train", "--model", model, "--data", "fashion-mnist", "--steps", str(steps),
               "--eval-every", "0", "--out", tmp]
        if every:
            cmd += ["--checkpoint-every", str(every), "--checkpoint-dir", os.path.join(tmp, "ckpt"), "--keep-last", "2"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(tmp, "metrics.jsonl")) as f:
            s = json.loads(f.read().splitlines()[-1])
    return s["train_seconds"], s.get("checkpoint_stall_seconds", 0.0)


def main():
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    lines = [
        "<!-- ckpt-overhead:start -->",
        "## Training throughput with periodic checkpoints",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        "- Command: `bench/run.sh overhead` (driver: `bench/ckpt_training_overhead.py`).",
        f"- Fashion-MNIST, default batch and optimizer (AdamW: parameters plus two slots are saved). Each measurement is"
        " paired: a run without checkpoints right before the run with them; overhead = median over"
        f" {ROUNDS} rounds of (training time with / without) - 1, with the range over rounds in brackets;"
        " stall = time the training loop waited per snapshot.",
        "",
        "| model | state | checkpoint every N steps | overhead (range) | stall per checkpoint |",
        "|---|---|---|---|---|",
    ]
    summary = []
    for model, steps in MODELS.items():
        ratios = {e: [] for e in EVERY}
        stalls = {e: [] for e in EVERY}
        bases = []
        for _ in range(ROUNDS):
            for e in EVERY:
                # Paired: the baseline runs right before each configuration, so slow drift
                # of the machine cancels in the ratio.
                base, _ = run(model, steps, 0)
                t, stall = run(model, steps, e)
                bases.append(base)
                ratios[e].append(t / base)
                stalls[e].append(stall / -(-steps // e))
        best = None
        state_mb = {"mlp": 235146 * 3 * 4 / 1e6, "cnn": 61706 * 3 * 4 / 1e6}[model]
        for e in EVERY:
            over = statistics.median(ratios[e]) - 1
            if over < TARGET and best is None:
                best = e
            spread = f"{100 * (min(ratios[e]) - 1):+.1f}% .. {100 * (max(ratios[e]) - 1):+.1f}%"
            lines.append(f"| {model} | {state_mb:.2f} MB | {e} | {100 * over:+.1f}% ({spread}) |"
                         f" {1e3 * statistics.median(stalls[e]):.2f} ms |")
            print(model, e, f"{100 * over:+.1f}%", flush=True)
        summary.append(f"- {model}: smallest N with overhead under 3.5%: **{best}** (step time without checkpoints"
                       f" {1e3 * statistics.median(bases) / steps:.2f} ms).")
    lines += [""] + summary + ["<!-- ckpt-overhead:end -->"]
    publish("ckpt-overhead", lines)


if __name__ == "__main__":
    main()
