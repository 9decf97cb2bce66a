"""What reproducibility costs, side by side in one run: the all-reduce of the training step
(`steadfast bench collective`) in `fast`, `reproducible` (64-bit lanes) and `reproducible32`
(32-bit lanes) on every transport a job can run on, and data-parallel training steps in
the three modes.

Transports:
- *shared memory*: `steadfast launch --nproc W` on this host (the default mesh: ranks of
  one host exchange frames through shared memory);
- *loopback TCP*: the same mesh kept on TCP (`STEADFAST_SHARED_MEMORY=0`);
- *MPI*: `mpirun -n W ... --engine mpi` on this host (the system's Open MPI);
- *hosts at RATE Mbit/s* and *MPI, hosts at RATE Mbit/s*: one rank on each of W
  network-namespace hosts whose links are shaped by `tc` (bench/engines_hosts.sh; root).

Each run times every mode of a transport in one process per rank, one after another per
size (`bench collective`: a warm-up, then 5 timed repetitions, median); a cell is the
median over REPEAT runs of the time and of the ratio to `fast` within a run. Training:
`steadfast launch --nproc W -- train` of the MLP (Fashion-MNIST, batch 128 in 4
micro-batches) and the GPT (fortunes, 32 sequences in 4 micro-batches), steps/s of rank 0's
loop, median of REPEAT runs, the modes taking turns.

Usage: python3 bench/repro_cost.py   (bench/run.sh repro-cost does this)
Environment: REPEAT (default 3), WORLDS (one host, default 2,4,8), HOST_WORLDS (default
2,4), MB (default 1,4,16,64), RATE (default 1000), STEPS (MLP, default 300; the GPT a tenth).
"""
import datetime, json, os, shutil, statistics, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402
from engines import BIN, MPI_ENV, MPIRUN, TCP_ENV, json_rows, run  # noqa: E402

REPEAT = int(os.environ.get("REPEAT", "3"))
WORLDS = [int(w) for w in os.environ.get("WORLDS", "2,4,8").split(",")]
HOST_WORLDS = os.environ.get("HOST_WORLDS", "2,4")
MB = os.environ.get("MB", "1,4,16,64")
RATE = os.environ.get("RATE", "1000")
STEPS = int(os.environ.get("STEPS", "300"))
MODES = ["fast", "reproducible", "reproducible32"]
ONE_HOST = ["shared memory", "loopback TCP", "MPI"]
HOSTS = [f"hosts at {RATE} Mbit/s", f"MPI, hosts at {RATE} Mbit/s"]
# data, global batch, micro-batch, steps
SETUP = {"mlp": ("fashion-mnist", 128, 32, STEPS), "gpt": ("fortunes", 32, 8, max(10, STEPS // 10))}


def threads(world):
    return str(max(1, (os.cpu_count() or 2) // world))


def one_host(transport, world):
    """{(mb, mode): seconds} of one run of `bench collective` on this host."""
    args = ["bench", "collective", "--mb", MB, "--reduce", ",".join(MODES)]
    if transport == "MPI":
        env = dict(MPI_ENV, RAYON_NUM_THREADS=threads(world))
        out = run([*MPIRUN, "-x", "RAYON_NUM_THREADS", "-n", str(world), BIN, *args, "--engine", "mpi"], env=env)
    else:
        env = dict(TCP_ENV if transport == "loopback TCP" else MPI_ENV, RAYON_NUM_THREADS=threads(world))
        out = run([BIN, "launch", "--nproc", str(world), "--", *args], env=env)
    return {(r["mb"], r["mode"]): r["seconds"] for r in json_rows(out)}


def hosts():
    """{(transport, world): {(mb, mode): seconds}} of one run across namespace hosts."""
    out = tempfile.mkdtemp(prefix="repro-cost-")
    env = dict(os.environ, WORLDS=HOST_WORLDS, MB=MB, MODES=",".join(MODES), REPEATS="5")
    res = subprocess.run(["bash", os.path.join(ROOT, "bench", "engines_hosts.sh"), BIN, out, RATE], env=env,
                         capture_output=True, text=True)
    if res.returncode == 77:
        return None
    if res.returncode != 0:
        sys.exit(f"bench/engines_hosts.sh failed ({res.returncode}): {res.stderr[-2000:]}; its files are in {out}")
    got = {}
    for w in map(int, HOST_WORLDS.split(",")):
        for transport, name in zip(HOSTS, ("steadfast", "mpi")):
            with open(os.path.join(out, f"{w}-{name}.jsonl")) as f:
                got[(transport, w)] = {(r["mb"], r["mode"]): r["seconds"] for r in map(json.loads, f)}
    shutil.rmtree(out, ignore_errors=True)
    return got


def train_once(model, world, mode):
    data, batch, micro, steps = SETUP[model]
    out_dir = tempfile.mkdtemp()
    try:
        run([BIN, "launch", "--nproc", str(world), "--", "train", "--model", model, "--data", data,
             "--steps", str(steps), "--batch", str(batch), "--micro-batch", str(micro), "--reduce", mode,
             "--eval-every", "0", "--eval-limit", "256", "--out", out_dir],
            env=dict(MPI_ENV, RAYON_NUM_THREADS=threads(world)))
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            summary = json.loads(f.read().splitlines()[-1])
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return steps / summary["train_seconds"]


def main():
    times = {}   # (transport, world, mb, mode) -> [seconds]
    ratios = {}  # (transport, world, mb, mode) -> [mode / fast within a run]
    steps = {}   # (model, world, mode) -> [steps/s]

    def keep(transport, world, cells):
        for (mb, mode), secs in cells.items():
            times.setdefault((transport, world, mb, mode), []).append(secs)
            ratios.setdefault((transport, world, mb, mode), []).append(secs / cells[(mb, "fast")])

    shaped = True
    for k in range(REPEAT):
        for world in WORLDS:
            for transport in ONE_HOST:
                keep(transport, world, one_host(transport, world))
        if shaped:
            got = hosts()
            if got is None:
                print("network namespaces are not available here: the hosts' columns are left out", flush=True)
                shaped = False
            else:
                for (transport, world), cells in got.items():
                    keep(transport, world, cells)
        for model in SETUP:
            for world in (2, 4):
                for mode in MODES:
                    steps.setdefault((model, world, mode), []).append(train_once(model, world, mode))
        print(f"run {k + 1} of {REPEAT} done", flush=True)
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", "repro-cost.json"), "w") as f:
        json.dump({"times": {" ".join(map(str, k)): v for k, v in times.items()},
                   "steps": {" ".join(map(str, k)): v for k, v in steps.items()}}, f, indent=1)
    publish("repro-cost", report(times, ratios, steps, shaped))


def report(times, ratios, steps, shaped):
    med = statistics.median
    transports = ONE_HOST + (HOSTS if shaped else [])
    lines = [
        "<!-- repro-cost:start -->",
        "## What reproducibility costs: the all-reduce and the training step in each mode, on every transport",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        f"- Command: `REPEAT={REPEAT} bench/run.sh repro-cost` (driver: `bench/repro_cost.py`; across hosts:"
        " `bench/engines_hosts.sh`).",
        "- *shared memory*: `steadfast launch --nproc W` on this host (the default mesh); *loopback TCP*: the same"
        " mesh with `STEADFAST_SHARED_MEMORY=0`; *MPI*: `mpirun -n W ... --engine mpi` (Open MPI) on this host;"
        f" *hosts at {RATE} Mbit/s*: one rank on each of W network-namespace hosts whose links `tc` shapes to"
        f" {RATE} Mbit/s each way, on Steadfast's mesh and on MPI's TCP transport (whose ranks yield the shared"
        " cores while they wait: `--mca mpi_yield_when_idle 1`). Threads per rank = cores / W"
        " (at least one); with more ranks than cores the ranks share them.",
        "- A cell is the median over the runs of the ratio of the mode's time to `fast`'s, measured within one run"
        " (each mode timed by `steadfast bench collective`: a warm-up, then the median of 5, the modes taking turns"
        " repetition by repetition), with `fast`'s time"
        " beside it.",
        "",
        "### All-reduce: time over `fast`'s (reproducible / reproducible32)",
        "",
        "| transport | ranks | " + " | ".join(f"{mb} MB" for mb in MB.split(",")) + " |",
        "|---|---|" + "---|" * len(MB.split(",")),
    ]
    worst = {m: (0.0, "") for m in MODES[1:]}
    for transport in transports:
        worlds = sorted({k[1] for k in times if k[0] == transport})
        for w in worlds:
            cells = []
            for mb in map(int, MB.split(",")):
                fast = med(times[(transport, w, mb, "fast")])
                r = [med(ratios[(transport, w, mb, m)]) for m in MODES[1:]]
                for m, x in zip(MODES[1:], r):
                    if x > worst[m][0]:
                        worst[m] = (x, f"{transport}, {w} ranks, {mb} MB")
                cells.append(f"{r[0]:.2f}x / {r[1]:.2f}x ({1e3 * fast:.1f} ms)")
            lines.append(f"| {transport} | {w} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Largest ratio: `reproducible` {worst['reproducible'][0]:.2f}x ({worst['reproducible'][1]}),"
        f" `reproducible32` {worst['reproducible32'][0]:.2f}x ({worst['reproducible32'][1]}).",
        "",
        "### Training steps (shared memory; steps/s of rank 0, median of the runs)",
        "",
        "| model | ranks | fast | reproducible | reproducible32 | fast / reproducible | fast / reproducible32 |",
        "|---|---|---|---|---|---|---|",
    ]
    for (model, w) in sorted({(k[0], k[1]) for k in steps}):
        s = {m: med(steps[(model, w, m)]) for m in MODES}
        lines.append(f"| {model} | {w} | {s['fast']:.1f} | {s['reproducible']:.1f} | {s['reproducible32']:.1f} |"
                     f" {s['fast'] / s['reproducible']:.2f}x | {s['fast'] / s['reproducible32']:.2f}x |")
    lines.append("<!-- repro-cost:end -->")
    return lines


if __name__ == "__main__":
    main()
