"""Throughput cost of checkpointing during training: steps/s with a checkpoint every N
steps against the same run without checkpoints, side by side (rounds alternate the
configurations), and the smallest N that keeps the overhead under 3.5% (CheckFreq's
figure). The asynchronous writer persists on a background thread, which competes with
training for the machine's cores; that cost is included, and so is the time the loop
waits for a snapshot (the summary's `checkpoint_stall_seconds`, which `train_seconds`
leaves out).

Two policies for a checkpoint that falls due while the previous one is still being
persisted: `wait` (the default: a checkpoint after exactly every N steps, at the disk's
pace if need be) and `defer` (`--checkpoint-when-busy defer`: put it off until the writer
is free, so that training waits only for the copy). The table gives the snapshots each
run took, from which the interval that `defer` reached follows.

Precision: each round runs every configuration as a pair (without, then with
checkpoints, the order of the pair alternating between rounds so that a drift of the
machine within a pair cancels over rounds). The overhead is the geometric mean of the
pairs' ratios, with a 95% confidence interval from Student's t over the log ratios; an
interval is under 3.5% only if its upper end is.

Usage: bench/.venv/bin/python bench/ckpt_training_overhead.py   (bench/run.sh overhead)
       PRECISE=1 bench/run.sh overhead   # the MLP at N = 20, 50, 100, 200 only, 32 pairs each:
                                         # the intervals near 3.5%, resolved (its own section)
       EVERY=10,20 ... overrides the intervals that wait for a busy writer (either kind of run).
"""
import datetime, json, math, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
PRECISE = os.environ.get("PRECISE") == "1"
ROUNDS = int(os.environ.get("ROUNDS", "32" if PRECISE else "8"))
if "EVERY" in os.environ:
    EVERY = [int(e) for e in os.environ["EVERY"].split(",")]
else:
    EVERY = [20, 50, 100, 200] if PRECISE else [1, 2, 5, 10, 20, 50]
ENV_EVERY = f"EVERY={os.environ['EVERY']} " if "EVERY" in os.environ else ""
# (policy, N): every interval waiting for a busy writer, the short ones deferring too.
CONFIGS = [("wait", e) for e in EVERY] + ([] if PRECISE else [("defer", e) for e in (1, 2, 5)])
MODELS = {"mlp": 1000} if PRECISE else {"mlp": 1000, "cnn": 200}
SECTION = "ckpt-overhead-precise" if PRECISE else "ckpt-overhead"
TARGET = 0.035


def run(model, steps, every, policy="wait"):
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, "bench", "out")) as tmp:
        cmd = [BIN, "train", "--model", model, "--data", "fashion-mnist", "--steps", str(steps),
               "--eval-every", "0", "--out", tmp]
        if every:
            cmd += ["--checkpoint-every", str(every), "--checkpoint-dir", os.path.join(tmp, "ckpt"), "--keep-last", "2",
                    "--checkpoint-when-busy", policy]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(tmp, "metrics.jsonl")) as f:
            s = json.loads(f.read().splitlines()[-1])
    stall = s.get("checkpoint_stall_seconds", 0.0)
    return s["train_seconds"] + stall, stall, s.get("checkpoint_snapshots", 0)


# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042]


def overhead_ci(ratios):
    """Geometric-mean overhead of paired ratios and its 95% interval (t over log ratios)."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean) - 1, float("nan"), float("nan")
    half = T975[min(len(logs) - 1, len(T975)) - 1] * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean) - 1, math.exp(mean - half) - 1, math.exp(mean + half) - 1


def main():
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    lines = [
        f"<!-- {SECTION}:start -->",
        "### The MLP near the bound, with more pairs" if PRECISE else "## Training throughput with periodic checkpoints",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        f"- Command: `{'PRECISE=1 ' if PRECISE else ''}{ENV_EVERY}bench/run.sh overhead` (driver: `bench/ckpt_training_overhead.py`).",
        f"- Fashion-MNIST, default batch and optimizer (AdamW: parameters plus two slots are saved). Each measurement is"
        " a pair: a run without checkpoints and one with them, back to back, the pair's order alternating between"
        f" rounds; {ROUNDS} rounds. Training time counts the loop and its waits for snapshots. Overhead = geometric"
        " mean of the pairs' (time with / time without) - 1, with its 95% confidence interval (Student's t over the"
        " log ratios); stall = median time the loop waited per snapshot; snapshots = median number taken per run."
        " The writer persists at its default priority (nice raised by 10).",
        "",
        "| model | state | when the writer is busy | checkpoint every N steps | snapshots per run | overhead |"
        " 95% interval | stall per snapshot |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for model, steps in MODELS.items():
        ratios = {c: [] for c in CONFIGS}
        stalls = {c: [] for c in CONFIGS}
        taken = {c: [] for c in CONFIGS}
        bases = []
        for round_ in range(ROUNDS):
            for c in CONFIGS:
                policy, e = c
                # A pair, its order alternating between rounds.
                if round_ % 2 == 0:
                    base, _, _ = run(model, steps, 0)
                    t, stall, n = run(model, steps, e, policy)
                else:
                    t, stall, n = run(model, steps, e, policy)
                    base, _, _ = run(model, steps, 0)
                bases.append(base)
                ratios[c].append(t / base)
                stalls[c].append(stall / max(n, 1))
                taken[c].append(n)
        best = {}
        state_mb = {"mlp": 235146 * 3 * 4 / 1e6, "cnn": 61706 * 3 * 4 / 1e6}[model]
        for c in CONFIGS:
            policy, e = c
            over, lo, hi = overhead_ci(ratios[c])
            if hi < TARGET and policy not in best:
                best[policy] = e
            lines.append(f"| {model} | {state_mb:.2f} MB | {policy} | {e} | {statistics.median(taken[c]):.0f} |"
                         f" {100 * over:+.1f}% | {100 * lo:+.1f}% .. {100 * hi:+.1f}% |"
                         f" {1e3 * statistics.median(stalls[c]):.2f} ms |")
            print(model, policy, e, f"{100 * over:+.1f}% [{100 * lo:+.1f}%, {100 * hi:+.1f}%]", flush=True)
        for policy in ("wait", "defer"):
            tried = [e for p, e in CONFIGS if p == policy]
            if not tried:
                continue
            found = f"**{best[policy]}**" if policy in best else f"none up to {tried[-1]}"
            summary.append(f"- {model}, {policy}: smallest N whose whole 95% interval is under 3.5%: {found}.")
        summary.append(f"- {model}: step time without checkpoints {1e3 * statistics.median(bases) / steps:.2f} ms"
                       f" ({steps} steps per run).")
    lines += [""] + summary + [f"<!-- {SECTION}:end -->"]
    publish(SECTION, lines)


if __name__ == "__main__":
    main()
