"""Campaign speed: 1000 single-bit trials of 50 steps on the MLP (bench/campaign-speed.toml),
against the file-based method of checkpoint alteration (alter a checkpoint on disk with
`steadfast inject`, resume it in a new `steadfast train` process), timed side by side
on a sample of the same kind of trials."""
import datetime
import os
import shutil
import subprocess
import sys
import time

from common import cpu_name, publish

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "steadfast")
OUT = os.path.join(ROOT, "bench", "out", "campaign-speed")
SAMPLE = 10
TRAIN = ["train", "--model", "mlp", "--data", "fashion-mnist", "--batch", "128", "--micro-batch", "32",
         "--eval-every", "0", "--steps", "250"]


def run(args):
    subprocess.run([BIN] + args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def file_based():
    """Seconds per trial of alter-and-restart, after one run that writes the checkpoint."""
    work = os.path.join(OUT, "files")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    ckpt = os.path.join(work, "ckpt")
    run(TRAIN + ["--checkpoint-every", "200", "--checkpoint-dir", ckpt, "--out", os.path.join(work, "golden")])
    start = time.perf_counter()
    for i in range(SAMPLE):
        altered = os.path.join(work, f"altered-{i}")
        run(["inject", os.path.join(ckpt, "step-00000200"), "--out", altered, "--role", "any", "--bits", "any",
             "--count", "1", "--seed", str(i)])
        run(TRAIN + ["--resume", altered, "--out", os.path.join(work, f"trial-{i}")])
        shutil.rmtree(altered)
    return (time.perf_counter() - start) / SAMPLE


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    start = time.perf_counter()
    run(["campaign", os.path.join(ROOT, "bench", "campaign-speed.toml"), "--out", os.path.join(OUT, "campaign")])
    campaign = time.perf_counter() - start
    per_trial = campaign / 1000
    files = file_based()
    lines = [
        "<!-- campaign:start -->",
        "## Campaign speed: 1000 single-bit trials of 50 steps on the MLP",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        "- Command: `bench/run.sh campaign` (driver: `bench/campaign_speed.py`, spec: `bench/campaign-speed.toml`).",
        "- MLP on Fashion-MNIST, batch 128 in 4 micro-batches, AdamW; golden run to step 250, 1000 trials"
        " injected at step 200 (one random bit of a parameter or optimizer slot) and trained 50 steps, each scored"
        " on the 10,000 test images. The peer is the file-based method of checkpoint alteration on the same"
        f" training: `steadfast inject` on the step-200 checkpoint, then `steadfast train --resume` for 50 steps"
        f" and the same evaluation in a new process, timed on {SAMPLE} trials.",
        "",
        "| method | wall-clock for 1000 trials | seconds per trial | trials per minute |",
        "|---|---|---|---|",
        f"| `steadfast campaign` (in-memory snapshots, trials in parallel) | {campaign:.0f} s | {per_trial:.3f} | {60 / per_trial:.0f} |",
        f"| checkpoint file altered, training restarted (extrapolated from {SAMPLE}) | {files * 1000:.0f} s | {files:.3f} | {60 / files:.0f} |",
        "",
        f"The campaign is {files / per_trial:.1f}x faster per trial than altering and restarting, and finishes the 1000"
        f" trials in {campaign / 60:.1f} minutes (the goal is 10). Its golden run, parallel trials and early stop of"
        " trials whose state is golden's again are included in the wall-clock.",
        "<!-- campaign:end -->",
    ]
    publish("campaign", lines)


if __name__ == "__main__":
    sys.exit(main())
