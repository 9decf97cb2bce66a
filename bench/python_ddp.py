"""What reproducible data parallelism costs a PyTorch loop: steadfast.ddp's hook and an
elastic job's worker (steadfast.elastic) against DDP's default all-reduce, side by side,
and whether each gives the same weights on 1, 2 and 4 processes.

Each run is python/examples/reproducible_ddp.py (the study's MLP trained by AdamW on
Fashion-MNIST, global batch 256 in 8 micro-batches, gloo on this host, one thread per
process). For each width of the first hidden layer and 2 and 4 processes, the two hooks
and the elastic job (python/examples/elastic_ddp.py under `steadfast launch`, the same
model, data, batch, micro-batches and optimizer, plus a cosine LR schedule, with its
default checks: the state hashed after every update and checked before the next step, the
replicas' fingerprints compared every step) run REPEAT times each, interleaved; a cell is the median of the per-step seconds (the slowest
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
ELASTIC = os.path.join(ROOT, "python", "examples", "elastic_ddp.py")
BIN = os.path.join(ROOT, "target", "release", "steadfast")
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


def _env():
    """The examples' directory on the path (the elastic example imports its loader from
    beside it), before what the caller set."""
    path = os.pathsep.join(filter(None, [os.path.dirname(ELASTIC), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


def run_elastic(world, width, steps=STEPS):
    """The elastic job on `world` workers: the slowest worker's seconds per step, and the
    weights' digests every worker printed."""
    cmd = [BIN, "launch", "--nproc", str(world), "--max-restarts", "0", "--", sys.executable, ELASTIC,
           "--steps", str(steps), "--width", str(width), "--batch", "256", "--micro-batches", "8", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    lines = [json.loads(line.split("] ", 1)[1]) for line in out.stdout.splitlines() if "] {" in line]
    return {"step_seconds": max(r["step_seconds"] for r in lines),
            "weights_sha256": sorted({r["weights_sha256"] for r in lines})}


def alone_elastic(width, steps):
    out = subprocess.run([sys.executable, ELASTIC, "--steps", str(steps), "--width", str(width), "--batch", "256",
                          "--micro-batches", "8", "--json"], capture_output=True, text=True, env=_env(), check=True)
    return json.loads(out.stdout.splitlines()[-1])["weights_sha256"]


def params(width):
    return 784 * width + width + width * 128 + 128 + 128 * 10 + 10


def main():
    import torch

    rows, profiles = [], {}
    kinds = ("default", "steadfast", "steadfast32", "mesh", "mesh32", "elastic")
    # hook and hook32 on gloo (the hook's transport where the mesh cannot reach the ranks).
    extra = {"steadfast": ("--transport", "gloo"), "steadfast32": ("--transport", "gloo", "--lanes", "32"),
             "mesh": ("--transport", "steadfast"), "mesh32": ("--transport", "steadfast", "--lanes", "32")}
    for width in WIDTHS:
        for world in (2, 4):
            times = {k: [] for k in kinds}
            for r in range(REPEAT):
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    if kind == "elastic":
                        seconds = run_elastic(world, width)["step_seconds"]
                    elif kind in extra:
                        seconds = run(world, "steadfast", width, *extra[kind])["step_seconds"]
                    else:
                        seconds = run(world, kind, width)["step_seconds"]
                    times[kind].append(seconds)
                    print(width, world, kind, seconds, flush=True)
            rows.append((width, world, *(statistics.median(times[k]) for k in kinds)))
        profiles[width] = run(2, "steadfast", width, "--profile", "--transport", "gloo")["profile"]
    same = {}
    same["default"] = [run(world, "default", 256, steps=30)["weights_sha256"] for world in (1, 2, 4)]
    same["steadfast"] = [run(world, "steadfast", 256, "--transport", "gloo", steps=30)["weights_sha256"]
                         for world in (1, 2, 4)]
    same["steadfast, 32-bit lanes"] = [run(world, "steadfast", 256, "--lanes", "32", "--transport", "gloo",
                                           steps=30)["weights_sha256"] for world in (1, 2, 4)]
    same["steadfast on Steadfast's mesh"] = [run(world, "steadfast", 256, "--transport", "steadfast",
                                                 steps=30)["weights_sha256"] for world in (1, 2, 4)]
    same["steadfast on Steadfast's mesh, 32-bit lanes"] = [
        run(world, "steadfast", 256, "--transport", "steadfast", "--lanes", "32", steps=30)["weights_sha256"]
        for world in (1, 2, 4)]
    elastic = [alone_elastic(256, 30)] + ["/".join(run_elastic(world, 256, steps=30)["weights_sha256"])
                                         for world in (2, 4)]
    same["elastic"] = elastic
    lines = [
        "<!-- python-ddp:start -->",
        "## Reproducible data parallelism in PyTorch: steadfast.ddp's hook and steadfast.elastic against DDP's"
        " default all-reduce",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; PyTorch"
        f" {torch.__version__}, gloo on this host, one thread per process.",
        f"- Command: `REPEAT={REPEAT} STEPS={STEPS} bench/run.sh python-ddp` (driver: `bench/python_ddp.py`, workload:"
        " `python/examples/reproducible_ddp.py`).",
        "- The study's MLP (784-W-128-10) trained by AdamW on Fashion-MNIST, global batch 256 in 8 micro-batches."
        f" A cell is the median over {REPEAT} runs (interleaved) of the seconds per step (the slowest rank's mean"
        " over the steps after the first). *default*: DDP's own hook, each rank's micro-batches accumulated in"
        " float under `no_sync`; *hook*: `steadfast.ddp.ReproducibleGradients` (two gloo all-reduces: the"
        " blocks' scales, 1/64 of a byte per element, and the integers); *hook32*: the same with `lanes=32`"
        " (4 bytes per element, as DDP's); *mesh* and *mesh32*: the same hook with `transport=\"steadfast\"` (each"
        " bucket's whole sum in one call on Steadfast's mesh, shared-memory rings between these processes, instead"
        " of two gloo all-reduces);"
        " *elastic*: a worker of `steadfast.elastic` under `steadfast launch --max-restarts 0` (the reproducible"
        " sum on Steadfast's mesh, the vote, the state hashed after every update and checked at rest, the"
        " replicas compared every step; a cosine LR schedule besides).",
        "",
        "| W | parameters | processes | default (ms/step) | hook (ms/step) | hook32 (ms/step) | mesh (ms/step)"
        " | mesh32 (ms/step) | elastic (ms/step) | hook / default | hook32 / default | mesh / default"
        " | mesh32 / default | elastic / default |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for width, world, d, *others in rows:
        lines.append(f"| {width} | {params(width):,} | {world} | {d * 1e3:.2f} | "
                     + " | ".join(f"{x * 1e3:.2f}" for x in others) + " | "
                     + " | ".join(f"{x / d:.2f}x" for x in others) + " |")
    lines += ["", f"The hook's phases (seconds summed over the {STEPS} steps of rank 0, with `--profile`, which waits"
              " for the integer all-reduce inside the hook to time it):", "",
              "| phase | " + " | ".join(f"W={w}" for w in WIDTHS) + " |", "|---|" + "---|" * len(WIDTHS)]
    phases = list(profiles[WIDTHS[0]])
    for p in phases:
        lines.append(f"| {p} | " + " | ".join(f"{profiles[w].get(p, 0.0):.3f}" for w in WIDTHS) + " |")
    lines += ["", "Final weights of 30 steps (W=256) on 1, 2 and 4 processes (first 12 hex digits of their SHA-256):",
              "", "| hook | 1 process | 2 processes | 4 processes | all equal |", "|---|---|---|---|---|"]
    for hook, digests in same.items():
        # (An elastic job's cell holds every worker's digest, joined by `/`.)
        parts = {p for d in digests for p in d.split("/")}
        lines.append(f"| {hook} | " + " | ".join(f"`{d[:12]}`" for d in digests)
                     + f" | {'yes' if len(parts) == 1 else 'no'} |")
    lines.append("<!-- python-ddp:end -->")
    publish("python-ddp", lines)


if __name__ == "__main__":
    main()
