"""Training speed against PyTorch across model shapes, side by side in one run: the MLP at
several widths, LeNet-5, and the character GPT at several widths, depths, contexts and
micro-batch counts, each on 1 and 2 threads. A cell is the ratio of Steadfast's steps/s
to PyTorch's on the same shape, batch, fp32 and AdamW (the median of REPEATS runs per
side, the sides alternating). Writes a section of docs/benchmarks.md and a plot,
docs/img/train-sweep.png.

Usage: bench/.venv/bin/python bench/train_sweep.py   (bench/run.sh train-sweep does this)
    REPEATS=3 (runs per side and cell), CELLS=gpt (only the cells whose label contains it)
"""
import datetime, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
REPEATS = int(os.environ.get("REPEATS", "3"))
ONLY = os.environ.get("CELLS", "")

# (label, model, steps, flags shared by both sides). Steps keep a run near three seconds here.
GPT = ("--batch", "32", "--lr", "2e-3")
CELLS = [
    ("mlp W=256", "mlp", 600, ("--batch", "128", "--width", "256")),
    ("mlp W=1024", "mlp", 250, ("--batch", "128", "--width", "1024")),
    ("mlp W=4096", "mlp", 25, ("--batch", "128", "--width", "4096")),
    ("lenet-5", "cnn", 150, ("--batch", "128", "--lr", "2e-3")),
    ("gpt d=64", "gpt", 60, GPT + ("--gpt-width", "64")),
    ("gpt d=128 (default)", "gpt", 30, GPT),
    ("gpt d=256", "gpt", 10, GPT + ("--gpt-width", "256")),
    ("gpt d=512 2 blocks", "gpt", 6, GPT + ("--gpt-width", "512", "--gpt-blocks", "2")),
    ("gpt 2 blocks", "gpt", 40, GPT + ("--gpt-blocks", "2")),
    ("gpt 8 blocks", "gpt", 12, GPT + ("--gpt-blocks", "8")),
    ("gpt context 32", "gpt", 50, GPT + ("--context", "32")),
    ("gpt context 256", "gpt", 6, GPT + ("--context", "256")),
    ("gpt 4 micro-batches", "gpt", 25, GPT + ("--micro-batch", "8")),
    ("gpt 16 micro-batches", "gpt", 20, GPT + ("--micro-batch", "2")),
]


def warmup(steps):
    """Steps left out of a run's rate on both sides: the first fifth (allocations, caches)."""
    return max(1, steps // 5)


def steadfast(model, steps, flags, threads):
    """Steps/s after the warm-up, from the times `train` writes after each step."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [BIN, "train", "--model", model, "--steps", str(steps), "--eval-every", "0", "--eval-limit", "1",
               "--out", out, *flags]
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
    done = {r["step"]: r["time"] for r in records if r.get("kind") == "train"}
    summary = records[-1]
    return (steps - warmup(steps)) / (done[steps] - done[warmup(steps)]), summary["kernels"]


def pytorch(model, steps, flags, threads):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "torch_train.py"), "--model", model, "--steps", str(steps),
           "--threads", str(threads), "--warmup", str(warmup(steps)), *flags]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return (steps - warmup(steps)) / r["warm_seconds"], r["torch"]


def plot(rows):
    """A bar per cell and thread count: Steadfast's steps/s over PyTorch's."""
    try:
        import matplotlib
    except ImportError:
        return "(No plot: matplotlib is not in bench/.venv; `bench/run.sh` installs it.)"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = list(dict.fromkeys(r[0] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for k, threads in enumerate((1, 2)):
        ratios = [next((r[4] / r[5] for r in rows if r[0] == label and r[1] == threads), 0) for label in labels]
        ax.bar([i + (k - 0.5) * 0.38 for i in range(len(labels))], ratios, width=0.38, label=f"{threads} thread(s)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("Steadfast / PyTorch steps/s")
    ax.set_title("Training speed against PyTorch by shape (above 1: Steadfast is faster)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(ROOT, "docs", "img", "train-sweep.png"), dpi=110)
    return "![Steadfast against PyTorch by shape](img/train-sweep.png)"


def main():
    rows, version = [], "?"
    for label, model, steps, flags in CELLS:
        if ONLY not in label:
            continue
        for threads in (1, 2):
            ours, theirs, kernels = [], [], "?"
            for _ in range(REPEATS):
                sps, kernels = steadfast(model, steps, flags, threads)
                ours.append(sps)
                sps, version = pytorch(model, steps, flags, threads)
                theirs.append(sps)
            o, t = statistics.median(ours), statistics.median(theirs)
            rows.append((label, threads, kernels, " ".join(flags), o, t))
            print(f"{label} threads={threads}: steadfast {o:.2f} steps/s, pytorch {t:.2f}, ratio {o / t:.2f}", flush=True)
    behind = [r for r in rows if r[4] < r[5]]
    lines = [
        "<!-- train-sweep:start -->",
        "## Training speed against PyTorch by shape (CPU)",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores;"
        f" PyTorch {version}.",
        "- Command: `bench/run.sh train-sweep` (driver: `bench/train_sweep.py`, PyTorch side: `bench/torch_train.py`).",
        "- fp32, AdamW, the MLP and LeNet-5 on Fashion-MNIST (batch 128), the character GPT on the fortunes text"
        " (32 sequences a step; by default width 128, 4 blocks of 4 heads, context 64, one micro-batch). Steps/s"
        f" counts the training loop after its first fifth of steps (the warm-up, left out on both sides); a cell is"
        f" the median of {REPEATS} runs per side, the sides alternating.",
        "",
        "| shape | threads | Steadfast kernels | Steadfast steps/s | PyTorch steps/s | Steadfast / PyTorch |",
        "|---|---|---|---|---|---|",
    ]
    for label, threads, kernels, _, o, t in rows:
        lines.append(f"| {label} | {threads} | {kernels} | {o:.2f} | {t:.2f} | {o / t:.2f}x |")
    lines += ["", plot(rows), "",
              f"Cells where Steadfast is behind: {len(behind)} of {len(rows)}"
              + (": " + ", ".join(f"{r[0]} on {r[1]} thread(s) ({r[4] / r[5]:.2f}x)" for r in behind) if behind else "."),
              "<!-- train-sweep:end -->"]
    publish("train-sweep", lines)


if __name__ == "__main__":
    main()
