"""The SDC lab's speed on a PyTorch model: 1000 single-bit trials of 50 steps of the study's
MLP with `steadfast.lab` (python/examples/sdc_campaign.py, worker processes on every core),
beside `steadfast campaign` on the same shape (bench/campaign-speed.toml: Steadfast's own
MLP, batch 128, AdamW, golden run to step 250, faults at step 200 in a parameter or an
optimizer slot, 50 steps after, the 10,000 test images scored per trial), run one after
the other in the same session."""
import datetime
import os
import shutil
import subprocess
import sys
import time

from common import cpu_name, publish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "steadfast")
OUT = os.path.join(ROOT, "bench", "out", "sdc-lab")
TRIALS = int(os.environ.get("SDC_LAB_TRIALS", "1000"))


def timed(cmd):
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def outcomes(directory):
    import csv
    with open(os.path.join(directory, "trials.csv"), newline="") as f:
        counts = {}
        for r in csv.DictReader(f):
            counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    cli_dir, torch_dir = os.path.join(OUT, "cli"), os.path.join(OUT, "torch")
    cli = timed([BIN, "campaign", os.path.join(ROOT, "bench", "campaign-speed.toml"), "--out", cli_dir,
                 "--trials", str(TRIALS)])
    py = timed([sys.executable, os.path.join(ROOT, "python", "examples", "sdc_campaign.py"), "--trials", str(TRIALS),
                "--inject-at", "200", "--steps-after", "50", "--state", "param,optim", "--bits", "any",
                "--seed", "3", "--test-examples", "10000", "--out", torch_dir])
    cores = len(os.sched_getaffinity(0))
    lines = [
        "<!-- sdc-lab:start -->",
        f"## The SDC lab on a PyTorch model: {TRIALS} single-bit trials of 50 steps of the study's MLP",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {cores} cores.",
        "- Command: `bench/run.sh sdc-lab` (driver: `bench/sdc_lab_speed.py`).",
        "- `steadfast.lab` on the study's MLP in PyTorch (784-256-128-10, AdamW, batch 128, Fashion-MNIST;"
        " `python/examples/sdc_campaign.py`): golden run to step 250, faults at step 200 in a parameter or an"
        " optimizer slot, 50 steps after, the 10,000 test images scored per trial; one worker process per core,"
        " each trial resuming from the golden state at step 200. Beside it, `steadfast campaign` on the same shape"
        " (`bench/campaign-speed.toml`, Steadfast's own MLP), run one after the other in this session.",
        "",
        "| campaign | trials | wall-clock | per trial | outcomes |",
        "|---|---:|---:|---:|---|",
        f"| `steadfast.lab` (PyTorch {torch_version()}) | {TRIALS} | {py:.0f} s | {1000 * py / TRIALS:.0f} ms"
        f" | {outcomes(torch_dir)} |",
        f"| `steadfast campaign` | {TRIALS} | {cli:.0f} s | {1000 * cli / TRIALS:.0f} ms | {outcomes(cli_dir)} |",
        "",
        f"The PyTorch campaign took {py / cli:.2f}x the CLI's time for the same shape"
        f" ({'within' if py <= 600 * TRIALS / 1000 else 'over'} the 10 minutes per 1000 trials asked of it).",
        "<!-- sdc-lab:end -->",
    ]
    publish("sdc-lab", lines)


def torch_version():
    import torch
    return torch.__version__


if __name__ == "__main__":
    main()
