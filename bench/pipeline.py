"""Pipeline jobs: steps/s by stage count and schedule against the model without stages and
against PyTorch's torch.distributed.pipelining (gloo, the same GPT cut the same way:
bench/torch_pipeline.py), the cost of boundary logging (time and bytes), and the time to
recover a lost stage by replay (alone and with helpers), by rolling every stage back, and by
restarting the whole job from its checkpoints; and selective logging's trade-off between the
bytes logged and the time a loss costs. Every figure of a table comes from one run of this
script, on one machine, the runs of a comparison interleaved.

    bench/run.sh pipeline              # everything
    python3 bench/pipeline.py selective  # the trade-off alone"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import cpu_name, publish  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "steadfast")
MODEL = ["--model", "gpt", "--data", "synthetic", "--batch", "32", "--micro-batch", "4",
         "--reduce", "reproducible", "--eval-every", "0"]


def run(args, env=None, stderr=False):
    """Runs steadfast with `args`; returns (wall seconds, stdout, with stderr after it if
    asked). Fails loudly."""
    started = time.monotonic()
    p = subprocess.run([BIN] + args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.monotonic() - started
    if p.returncode != 0:
        sys.exit(f"steadfast {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return wall, p.stdout + (p.stderr if stderr else "")


def rate(out_dir):
    """The job's steps/s, from its metrics (written by the rank that holds the loss): steps
    over the time spent in steps."""
    for line in open(os.path.join(out_dir, "metrics.jsonl")):
        if '"kind":"summary"' in line:
            s = json.loads(line)
            return s["steps"] / s["train_seconds"]
    sys.exit(f"no summary in {out_dir}")


def logged_bytes(stdout):
    return sum(float(m) for m in re.findall(r"boundary log: ([\d.]+) MB", stdout)) * 1e6


def train(out, steps, stages, extra=()):
    args = MODEL + ["--steps", str(steps), "--out", out] + list(extra)
    if stages == 0:
        return run(["train"] + args)
    return run(["launch", "--nproc", str(stages), "--", "train"] + args + ["--pipeline-stages", str(stages)])


def torch_rate(stages, schedule, steps):
    """PyTorch's steps/s for the same shape (bench/torch_pipeline.py), or None without it."""
    python = os.path.join(ROOT, "bench", ".venv", "bin", "python")
    if not os.path.exists(python):
        return None
    args = [python, os.path.join(ROOT, "bench", "torch_pipeline.py"), "--stages", str(max(stages, 1)),
            "--schedule", schedule, "--steps", str(steps)]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{p.stdout}\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])["steps_per_s"]


def speed(tmp, steps=30, repeats=3):
    """Steps/s of the whole model in one process and of 2 and 4 stages with each schedule,
    Steadfast's and PyTorch's runs interleaved."""
    shapes = [(0, "1f1b"), (2, "gpipe"), (2, "1f1b"), (4, "gpipe"), (4, "1f1b")]
    ours = {shape: [] for shape in shapes}
    theirs = {shape: [] for shape in shapes}
    for r in range(repeats):
        for stages, schedule in shapes:
            d = os.path.join(tmp, f"speed{stages}{schedule}-{r}")
            train(d, steps, stages, ["--schedule", schedule] if stages else [])
            ours[(stages, schedule)].append(rate(d))
            theirs[(stages, schedule)].append(torch_rate(stages, schedule, steps))
    base = statistics.median(ours[shapes[0]])
    rows = [f"| shape | Steadfast steps/s | against no stages | PyTorch steps/s | Steadfast / PyTorch |",
            "|---|---|---|---|---|"]
    for stages, schedule in shapes:
        m = statistics.median(ours[(stages, schedule)])
        name = "one process, no stages" if stages == 0 else f"{stages} stages, {schedule}"
        t = [v for v in theirs[(stages, schedule)] if v is not None]
        peer = (f"{statistics.median(t):.2f} | {m / statistics.median(t):.2f}" if t
                else "not installed | -")
        rows.append(f"| {name} | {m:.2f} | {m / base:.2f} | {peer} |")
    return rows


def logging_cost(tmp, steps=30, repeats=5):
    """2- and 4-stage jobs with every boundary logged or none, interleaved."""
    rows = ["| stages | steps/s, no log | steps/s, every boundary logged | overhead | bytes logged a step |",
            "|---|---|---|---|---|"]
    for stages in (2, 4):
        plain, logged, sizes = [], [], []
        for r in range(repeats):
            d = os.path.join(tmp, f"nolog{stages}-{r}")
            train(d, steps, stages)
            plain.append(rate(d))
            d = os.path.join(tmp, f"log{stages}-{r}")
            _, out = train(d, steps, stages, ["--log-boundaries", "all"])
            logged.append(rate(d))
            sizes.append(logged_bytes(out) / steps)
        p, l = statistics.median(plain), statistics.median(logged)
        rows.append(f"| {stages} | {p:.2f} | {l:.2f} | {100 * (p - l) / p:+.1f}% | "
                    f"{statistics.median(sizes) / 1e6:.2f} MB |")
    return rows


def recovery_seconds(out_dir):
    """From the job's record: the first loss to the first epoch that steps after it
    (detection, the replacement's start, the quorum, the replay or fetch)."""
    path = os.path.join(out_dir, "events.jsonl")
    if not os.path.exists(path):
        return None
    events = [json.loads(l) for l in open(path)]
    lost = next((e["time"] for e in events if e.get("kind") == "lost"), None)
    if lost is None:
        return None
    return next((e["time"] - lost for e in events if e.get("kind") == "epoch_started" and e["time"] > lost), None)


def around_loss(out_dir):
    """From the collector's metrics and the job's record: the stall a loss caused (from
    the last step finished before it to the first new step after it: detection, rejoin,
    replay and any steps computed again) and the steps/s after it."""
    lines = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl"))]
    events = [json.loads(l) for l in open(os.path.join(out_dir, "events.jsonl"))]
    lost = next(e["time"] for e in events if e.get("kind") == "lost")
    before = [l for l in lines if l.get("kind") == "train" and l["time"] <= lost]
    last = before[-1]
    after = [l for l in lines if l.get("kind") == "train" and l["time"] > lost and l["step"] > last["step"]]
    rate = (len(after) - 1) / (after[-1]["time"] - after[0]["time"]) if len(after) > 1 else float("nan")
    return after[0]["time"] - last["time"], rate


def recovery(tmp, steps=40, every=20, crash=33):
    """A 3-stage job whose middle stage crashes at step `crash` (checkpoints every
    `every`), recovered each way; the failure-free job for comparison."""
    fault = ["--fault", f"crash:rank=1,step={crash},phase=backward"]
    common = ["--nproc", "3", "--max-restarts", "1", "--save-every", str(every)]
    base_args = MODEL + ["--steps", str(steps), "--pipeline-stages", "3"]
    cases = [
        ("replay, 1 helper", ["--recovery", "replay", "--replay-helpers", "1"], []),
        ("replay, 2 helpers", ["--recovery", "replay", "--replay-helpers", "2"], []),
        ("replay, 3 helpers", ["--recovery", "replay", "--replay-helpers", "3"], []),
        ("no logs: every stage rolls back", ["--recovery", "replay"], ["--log-boundaries", "none"]),
        ("global checkpoint-restart", ["--recovery", "checkpoint"], []),
    ]
    free = []
    for r in range(3):
        out = os.path.join(tmp, f"free{r}")
        wall, _ = run(["launch", "--nproc", "3", "--", "train"] + base_args + ["--out", out])
        free.append(wall)
    free = statistics.median(free)
    rows = [f"Failure-free job: {free:.2f} s. The middle stage of 3 crashes at step {crash}; the newest "
            f"checkpoint is at step {crash - crash % every}. After a rollback the steps since the "
            "checkpoint are computed again once the job goes on: the wall time counts them.", "",
            "| recovery | job's wall time | over failure-free | from the loss to the job going on (rejoin, replay) |",
            "|---|---|---|---|"]
    for name, launch, extra in cases:
        walls, repairs = [], []
        for r in range(3):
            d = os.path.join(tmp, f"rec-{len(rows)}-{r}")
            args = ["launch"] + common + launch + ["--save-dir", os.path.join(d, "ck"), "--", "train"]
            wall, _ = run(args + base_args + ["--out", os.path.join(d, "out")] + fault + extra)
            walls.append(wall)
            seconds = recovery_seconds(os.path.join(d, "out"))
            if seconds is not None:
                repairs.append(seconds)
        w = statistics.median(walls)
        repair = f"{statistics.median(repairs):.2f} s" if repairs else "(whole job restarted)"
        rows.append(f"| {name} | {w:.2f} s | {w - free:+.2f} s | {repair} |")
    return rows


def selective(tmp, steps=40, every=20, crash=33):
    """4-stage jobs logging within budgets of 3, 2, 1 and 0 boundaries' bytes; each stage is
    lost in turn at step `crash`, and the time the loss costs (the job's wall time over the
    failure-free job's) is averaged over the stages: the expected cost of a loss."""
    stages = 4
    base_args = MODEL + ["--steps", str(steps), "--pipeline-stages", str(stages)]
    free = []
    for r in range(3):
        wall, _ = run(["launch", "--nproc", str(stages), "--", "train"] + base_args
                      + ["--out", os.path.join(tmp, f"sel-free{r}")])
        free.append(wall)
    free = statistics.median(free)
    # Every boundary of the GPT carries 64 places of 128 values an example, each way.
    boundary = 2 * 4 * 64 * 128 * 32
    points, rows = [], []
    for logged in (3, 2, 1, 0):
        budget = logged * boundary
        lost, note = [], ""
        for stage in range(stages):
            d = os.path.join(tmp, f"sel-{logged}-{stage}")
            args = ["launch", "--nproc", str(stages), "--max-restarts", "1", "--save-every", str(every),
                    "--recovery", "replay", "--save-dir", os.path.join(d, "ck"), "--", "train"]
            fault = ["--fault", f"crash:rank={stage},step={crash},phase=backward"]
            _, out = run(args + base_args + ["--out", os.path.join(d, "out"), "--log-budget", str(budget)]
                         + fault, stderr=True)
            lost.append(around_loss(os.path.join(d, "out"))[0])
            m = re.search(r"logs boundaries \[([\d, ]*)\] \((\d+) of \d+ bytes a step\); "
                          r"stages recover in groups ([\d, -]+)", out)
            note = m.groups() if m else ("?", "0", "?")
        chosen, nbytes, groups = note
        mean = statistics.mean(lost)
        points.append((int(nbytes) / 1e6, mean, groups))
        rows.append(f"| {budget / 1e6:.1f} MB | {chosen or 'none'} | {groups} | {int(nbytes) / 1e6:.1f} MB | "
                    + " | ".join(f"{x:.2f} s" for x in lost) + f" | **{mean:.2f} s** |")
    header = [f"Failure-free job: {free:.2f} s (median of 3), {steps / free:.1f} steps/s with start-up. The GPT "
              "in 4 stages (the embeddings with block 0, blocks 1 and 2, block 3, the head), checkpoints every "
              f"{every} steps; stage k is lost at step {crash} (one run each). The stall runs from the last "
              "step finished before the loss to the first new step after it: the loss's detection, the "
              "replacement's start, the replay and, after a rollback, the steps computed again.", "",
              "| budget a step | boundaries logged | groups | bytes logged a step | stall, stage 0 lost "
              "| stage 1 | stage 2 | stage 3 | mean (a stage lost at random) |",
              "|---|---|---|---|---|---|---|---|---|"]
    plot = plot_tradeoff(points)
    return header + rows + (["", f"![bytes logged against recovery time]({plot})"] if plot else
                            ["", "(No plot: matplotlib is not in bench/.venv; `bench/run.sh` installs it.)"])


def rerouting(tmp, steps=40, crash=25, repeats=3):
    """2 replicas of 2 stages (4 ranks): a lost stage worker replaced (its state fetched
    from its live replica) or not (its micro-batches rerouted to that replica)."""
    base_args = MODEL + ["--steps", str(steps), "--pipeline-stages", "2"]
    fault = ["--fault", f"crash:rank=1,step={crash},phase=backward"]
    free = []
    for r in range(repeats):
        d = os.path.join(tmp, f"rr-free{r}")
        run(["launch", "--nproc", "4", "--", "train"] + base_args + ["--out", d])
        # Measured as after a loss: over the same steps, from the lines' times.
        times = [l["time"] for l in map(json.loads, open(os.path.join(d, "metrics.jsonl")))
                 if l.get("kind") == "train" and l["step"] > crash]
        free.append((len(times) - 1) / (times[-1] - times[0]))
    rows = [f"| a stage worker lost | stall | steps/s after step {crash} | against failure-free |", "|---|---|---|---|"]
    base = statistics.median(free)
    rows.append(f"| none (failure-free) | - | {base:.2f} | 1.00 |")
    for name, flags in [("replaced: fetched from its live replica", ["--max-restarts", "1"]),
                        ("not replaced: rerouted to its replica", ["--on-failure", "shrink"])]:
        stalls, rates = [], []
        for r in range(repeats):
            d = os.path.join(tmp, f"rr-{len(rows)}-{r}")
            args = ["launch", "--nproc", "4", "--recovery", "replay"] + flags + [
                "--save-dir", os.path.join(d, "ck"), "--", "train"]
            log = ["--log-boundaries", "none"] if "shrink" not in flags else []
            run(args + base_args + ["--out", os.path.join(d, "out")] + fault + log)
            stall, after = around_loss(os.path.join(d, "out"))
            stalls.append(stall)
            rates.append(after)
        r = statistics.median(rates)
        rows.append(f"| {name} | {statistics.median(stalls):.2f} s | {r:.2f} | {r / base:.2f} |")
    return [f"The GPT as 2 replicas of 2 stages (4 processes on {os.cpu_count()} cores); worker 1 (stage 1 of "
            f"replica 0) crashes at step {crash} of {steps}; medians of {repeats} runs.", ""] + rows


def plot_tradeoff(points):
    """Plots the time lost against the bytes logged with bench/.venv's matplotlib; returns
    the image's path from docs/, or None without it."""
    python = os.path.join(ROOT, "bench", ".venv", "bin", "python")
    if not os.path.exists(python):
        return None
    name = "pipeline-selective-logging.png"
    script = f"""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
points = {points!r}
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
for x, y, groups in points:
    ax.annotate("groups " + groups, (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
ax.set(xlabel="bytes logged a step (MB)", ylabel="mean stall when a stage is lost (s)",
       title="Selective logging: the GPT in 4 stages")
ax.grid(True, alpha=0.3)
fig.tight_layout()
fig.savefig({os.path.join(ROOT, "docs", "img", name)!r}, dpi=110)
"""
    p = subprocess.run([python, "-c", script], capture_output=True, text=True)
    if p.returncode != 0:
        print(p.stderr, file=sys.stderr)
        return None
    return f"img/{name}"


def main():
    if sys.argv[1:] == ["selective"]:
        with tempfile.TemporaryDirectory() as tmp:
            publish_selective(tmp)
        return
    with tempfile.TemporaryDirectory() as tmp:
        lines = ["<!-- pipeline:start -->", "## Pipeline jobs: speed, boundary logging, recovery", "",
                 f"Machine: {cpu_name()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}; "
                 "`bench/run.sh pipeline` (`bench/pipeline.py`). The character-level GPT (4 blocks, "
                 "width 128) on synthetic text, global batch 32 in micro-batches of 4, 1F1B, "
                 "`--reduce reproducible`. Every stage is a process; with 2 cores, 4 stages share them. "
                 "PyTorch 2.15 (CPU, gloo) runs the same model cut the same way with its own "
                 "`ScheduleGPipe` and `Schedule1F1B` (`bench/torch_pipeline.py`), its default threads "
                 "per process as Steadfast's; medians of 3 interleaved runs.",
                 "", "### Steps/s by stage count and schedule, against PyTorch", ""]
        lines += speed(tmp)
        lines += ["", "### Boundary logging", "",
                  "Each stage logs what it sends across every boundary (activations forward, gradients "
                  "back), through a background thread; the bytes are the job's, all stages together.", ""]
        lines += logging_cost(tmp)
        lines += ["", "### Recovering a lost stage", ""]
        lines += recovery(tmp)
        lines += ["<!-- pipeline:end -->"]
        publish("pipeline", lines)
        publish_selective(tmp)


def publish_selective(tmp):
    lines = ["<!-- pipeline-selective:start -->", "### Selective logging and rerouting", "",
             f"Machine: {cpu_name()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}; "
             "`python3 bench/pipeline.py selective` (part of `bench/run.sh pipeline`). `--log-budget` "
             "picks the boundaries (SWIFT's greedy merge, `docs/pipeline.md`); the stages of a group "
             "recover together.", "", "#### Bytes logged against the stall of a loss", ""]
    lines += selective(tmp)
    lines += ["", "#### Rerouting a lost stage worker's micro-batches", ""]
    lines += rerouting(tmp)
    lines += ["<!-- pipeline-selective:end -->"]
    publish("pipeline-selective", lines)


if __name__ == "__main__":
    main()
