"""Training speed of Steadfast against PyTorch on the CPU, side by side in one run.

Same architecture, batch (128; the GPT 32 sequences of 64 tokens), fp32, AdamW and thread
count; each configuration is run REPEATS times, alternating the sides, and the median
steps/s is reported. Steadfast runs with its default kernels (the fixed-order ones) and
also with the framework's kernels that they replace. Also reports, for each side,
whether the final weights are bit-identical with 1 and 2 threads. Writes a section of
docs/benchmarks.md.

Usage: bench/.venv/bin/python bench/train_vs_pytorch.py   (bench/run.sh does this)
"""
import datetime, json, os, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
REPEATS = int(os.environ.get("REPEATS", "3"))
MODELS = ["mlp", "cnn", "gpt"]
STEPS = {"mlp": 1000, "cnn": 200, "gpt": 60}
LR = {"mlp": 1e-3, "cnn": 2e-3, "gpt": 2e-3}
BATCH = {"mlp": 128, "cnn": 128, "gpt": 32}
DATA = {"mlp": "fashion-mnist", "cnn": "fashion-mnist", "gpt": "fortunes"}


def steadfast(model, threads, kernels=None):
    with tempfile.TemporaryDirectory() as out:
        cmd = [BIN, "train", "--model", model, "--data", DATA[model], "--steps", str(STEPS[model]),
               "--batch", str(BATCH[model]), "--lr", str(LR[model]), "--eval-every", "0", "--eval-limit", "1",
               "--out", out]
        if kernels:
            cmd += ["--kernels", kernels]
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            s = json.loads(f.read().splitlines()[-1])
    return STEPS[model] / s["train_seconds"], s["optimizer_seconds"] / s["train_seconds"], s["fingerprint"], s["kernels"]


def torch(model, threads):
    cmd = [sys.executable, os.path.join(ROOT, "bench", "torch_train.py"), "--model", model,
           "--steps", str(STEPS[model]), "--batch", str(BATCH[model]), "--lr", str(LR[model]),
           "--threads", str(threads)]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return STEPS[model] / r["seconds"], r["optimizer_seconds"] / r["seconds"], r["weights_sha256"], r["torch"]


def main():
    rows, hashes, version = [], {}, "?"
    for model in MODELS:
        for threads in [1, 2]:
            ours, theirs, ours_opt, theirs_opt, framework = [], [], [], [], []
            for _ in range(REPEATS):
                sps, opt, fp, kernels = steadfast(model, threads)
                ours.append(sps); ours_opt.append(opt)
                hashes.setdefault(("steadfast", model, threads), set()).add(fp)
                framework.append(steadfast(model, threads, "framework")[0])
                sps, opt, h, version = torch(model, threads)
                theirs.append(sps); theirs_opt.append(opt)
                hashes.setdefault(("pytorch", model, threads), set()).add(h)
            o, t = statistics.median(ours), statistics.median(theirs)
            f = statistics.median(framework)
            rows.append((model, threads, kernels, o, f, t, statistics.median(ours_opt), statistics.median(theirs_opt)))
            print(f"{model} threads={threads}: steadfast ({kernels}) {o:.1f} steps/s, framework kernels {f},"
                  f" pytorch {t:.1f} steps/s, ratio {o/t:.2f}", flush=True)

    def same(side, model):
        a, b = hashes[(side, model, 1)], hashes[(side, model, 2)]
        if len(a) > 1 or len(b) > 1:
            return "no (differs run to run)"
        return "yes" if a == b else "no"

    today = datetime.date.today().isoformat()
    lines = [
        "<!-- train-vs-pytorch:start -->",
        "## Training steps/s against PyTorch (CPU)",
        "",
        f"- Date: {today}; machine: {cpu_name()}, {os.cpu_count()} cores; PyTorch {version}.",
        "- Command: `bench/run.sh train` (driver: `bench/train_vs_pytorch.py`).",
        f"- Fashion-MNIST, batch 128, fp32, AdamW; MLP {STEPS['mlp']} steps, CNN (LeNet-5) {STEPS['cnn']} steps;"
        f" the character GPT (4 blocks, width 128, 4 heads, context 64, exact GELU) on the fortunes text,"
        f" 32 sequences per step, {STEPS['gpt']} steps (PyTorch's attention is `scaled_dot_product_attention`)."
        f" Median of {REPEATS} runs per cell, the sides alternating. Steps/s counts the training loop only"
        " (batch assembly, forward, backward, optimizer), not data loading or evaluation.",
        "",
        "*Kernels* are those of Steadfast's default run: `fixed/<instruction set>` (the fixed-order kernels,"
        " the same bits on every CPU kind). *Framework kernels* is the same run with `--kernels framework`"
        " (burn's), the kernels they replace.",
        "",
        "| model | threads | kernels | Steadfast steps/s | framework kernels steps/s | fixed / framework"
        " | PyTorch steps/s | ratio (Steadfast / PyTorch) | optimizer share, Steadfast | optimizer share, PyTorch |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, th, k, o, f, t, oo, to in rows:
        fw = f"{f:.1f} | {o / f:.2f}x"
        lines.append(f"| {m} | {th} | {k} | {o:.1f} | {fw} | {t:.1f} | {o / t:.2f}x | {100*oo:.1f}% | {100*to:.1f}% |")
    lines += [
        "",
        "Final weights bit-identical with 1 and 2 threads:",
        "",
        "| model | Steadfast | PyTorch |",
        "|---|---|---|",
    ]
    for m in MODELS:
        lines.append(f"| {m} | {same('steadfast', m)} | {same('pytorch', m)} |")
    lines.append("<!-- train-vs-pytorch:end -->")
    publish("train-vs-pytorch", lines)


if __name__ == "__main__":
    main()
