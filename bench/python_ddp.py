"""What the reproducible DDP hook costs: steadfast.ddp against DDP's default all-reduce,
side by side, and whether each gives the same weights on 1, 2 and 4 processes.

Each run is python/examples/reproducible_ddp.py (the study's MLP trained by AdamW on
Fashion-MNIST, global batch 256 in 8 micro-batches, gloo on this host, one thread per
process). For each width of the first hidden layer, the two hooks run REPEAT times each on
2 processes, interleaved; a cell is the median of the per-step seconds (the slowest
rank's mean over the steps after the first, which builds DDP's buckets). One more run
with --profile splits the hook's time into its phases. Then both hooks train the same
job on 1, 2 and 4 processes and the table says whether the final weights are the same
bits.

Usage: bench/run.sh python-ddp (installs python/ into bench/.venv).
Environment: REPEAT (default 3), STEPS (default 60).
"""
import datetime
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_name, publish  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "python", "examples", "reproducible_ddp.py")
REPEAT = int(os.environ.get("REPEAT", "3"))
STEPS = int(os.environ.get("STEPS", "60"))
WIDTHS = (256, 1024)


def run(world, hook, width, *extra, steps=STEPS):
    cmd = [sys.executable, EXAMPLE, "--world", str(world), "--hook", hook, "--steps", str(steps), "--width", str(width),
           *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.splitlines()[-1])


def params(width):
    return 784 * width + width + width * 128 + 128 + 128 * 10 + 10


def main():
    import torch

    rows, profiles = [], {}
    for width in WIDTHS:
        times = {"default": [], "steadfast": []}
        for r in range(REPEAT):
            for hook in (["default", "steadfast"] if r % 2 == 0 else ["steadfast", "default"]):
                times[hook].append(run(2, hook, width)["step_seconds"])
                print(width, hook, times[hook][-1], flush=True)
        rows.append((width, statistics.median(times["default"]), statistics.median(times["steadfast"])))
        profiles[width] = run(2, "steadfast", width, "--profile")["profile"]
    same = {}
    for hook in ("default", "steadfast"):
        digests = [run(world, hook, 256, steps=30)["weights_sha256"] for world in (1, 2, 4)]
        same[hook] = digests
    lines = [
        "<!-- python-ddp:start -->",
        "## Reproducible DDP: steadfast.ddp's hook against DDP's default all-reduce",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; PyTorch"
        f" {torch.__version__}, gloo on this host, one thread per process.",
        f"- Command: `REPEAT={REPEAT} STEPS={STEPS} bench/run.sh python-ddp` (driver: `bench/python_ddp.py`, workload:"
        " `python/examples/reproducible_ddp.py`).",
        "- The study's MLP (784-W-128-10) trained by AdamW on Fashion-MNIST, global batch 256 in 8 micro-batches, 2"
        f" processes. A cell is the median over {REPEAT} runs (hooks interleaved) of the seconds per step (the"
        " slowest rank's mean over the steps after the first). *default*: DDP's own hook, each rank's 4"
        " micro-batches accumulated in float under `no_sync`; *steadfast*: `steadfast.ddp.ReproducibleGradients`.",
        "",
        "| W | parameters | default (ms/step) | steadfast (ms/step) | steadfast / default |",
        "|---|---|---|---|---|",
    ]
    for width, d, s in rows:
        lines.append(f"| {width} | {params(width):,} | {d * 1e3:.2f} | {s * 1e3:.2f} | {s / d:.2f}x |")
    lines += ["", f"The hook's phases (seconds summed over the {STEPS} steps of rank 0, with `--profile`, which waits"
              " for the integer all-reduce inside the hook to time it):", "",
              "| phase | " + " | ".join(f"W={w}" for w in WIDTHS) + " |", "|---|" + "---|" * len(WIDTHS)]
    phases = list(profiles[WIDTHS[0]])
    for p in phases:
        lines.append(f"| {p} | " + " | ".join(f"{profiles[w].get(p, 0.0):.3f}" for w in WIDTHS) + " |")
    lines += ["", "Final weights of 30 steps (W=256) on 1, 2 and 4 processes (first 12 hex digits of their SHA-256):",
              "", "| hook | 1 process | 2 processes | 4 processes | all equal |", "|---|---|---|---|---|"]
    for hook, digests in same.items():
        lines.append(f"| {hook} | " + " | ".join(f"`{d[:12]}`" for d in digests)
                     + f" | {'yes' if len(set(digests)) == 1 else 'no'} |")
    lines.append("<!-- python-ddp:end -->")
    publish("python-ddp", lines)


if __name__ == "__main__":
    main()
