"""The cluster engines side by side in one run: Steadfast's TCP mesh (`steadfast launch`),
the system's MPI library (`mpirun ... --engine mpi`) and PyTorch's gloo, each in `fast`
and `reproducible` mode, 2 and 4 ranks, one process per rank, all on this host.

1. All-reduce bus bandwidth of the training step's collective (`steadfast bench
   collective`; peer: bench/torch_collective.py), with a fingerprint of each sum, to show
   which engines agree bit for bit.
2. Data-parallel training steps/s of the MLP on Fashion-MNIST (`steadfast train`; peer:
   bench/torch_ddp.py, whose reproducible mode is a DDP communication hook).

Usage: bench/.venv/bin/python bench/engines.py   (bench/run.sh engines does this)
Environment: WORLDS (default 2,4), MB (default 1,4,16,64,256), STEPS (default 300).
"""
import datetime, json, os, shutil, socket, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
WORLDS = [int(w) for w in os.environ.get("WORLDS", "2,4").split(",")]
MB = os.environ.get("MB", "1,4,16,64,256")
STEPS = int(os.environ.get("STEPS", "300"))
MODES = ["fast", "reproducible"]
ENGINES = ["steadfast", "mpi", "gloo"]
# Open MPI refuses root without these, and would pin each rank to a core by default;
# the other engines do not pin, so neither does MPI here.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_rows(text):
    """The JSON objects among `text`'s lines (a launcher prefixes them with `[rank] `)."""
    rows = []
    for line in text.splitlines():
        line = line.split("] ", 1)[1] if line.startswith("[") else line
        if line.startswith("{"):
            rows.append(json.loads(line))
    return rows


def run(cmd, env=None):
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return res.stdout


def collective(engine, world):
    args = ["bench", "collective", "--mb", MB, "--reduce", ",".join(MODES)]
    if engine == "steadfast":
        out = run([BIN, "launch", "--nproc", str(world), "--", *args])
    elif engine == "mpi":
        out = run([*MPIRUN, "-n", str(world), BIN, *args, "--engine", "mpi"], env=MPI_ENV)
    else:
        out = run([sys.executable, os.path.join(ROOT, "bench", "torch_collective.py"), "--world", str(world),
                   "--mb", MB, "--port", str(free_port())])
    return {(r["mb"], r["mode"]): r for r in json_rows(out)}


def train(engine, world, mode):
    """Steps/s of rank 0's training loop, and the final-weights fingerprint (or hash)."""
    threads = str(max(1, (os.cpu_count() or 2) // world))
    if engine == "gloo":
        out = run([sys.executable, os.path.join(ROOT, "bench", "torch_ddp.py"), "--world", str(world),
                   "--steps", str(STEPS), "--port", str(free_port()), "--reduce", mode])
        r = json_rows(out)[-1]
        return STEPS / r["seconds"], r["weights_sha256"]
    out_dir = tempfile.mkdtemp()
    try:
        args = ["train", "--model", "mlp", "--data", "fashion-mnist", "--steps", str(STEPS), "--batch", "128",
                "--micro-batch", "32", "--reduce", mode, "--eval-every", "0", "--out", out_dir]
        env = dict(MPI_ENV, RAYON_NUM_THREADS=threads)
        if engine == "steadfast":
            out = run([BIN, "launch", "--nproc", str(world), "--", *args], env=env)
        else:
            out = run([*MPIRUN, "-x", "RAYON_NUM_THREADS", "-n", str(world), BIN, *args, "--engine", "mpi"], env=env)
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            summary = json.loads(f.read().splitlines()[-1])
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    prints = [line.split("fingerprint: ")[1].split()[0] for line in out.splitlines() if "fingerprint: " in line]
    return STEPS / summary["train_seconds"], prints[0]


def main():
    import torch
    if shutil.which("mpirun") is None:
        sys.exit("mpirun is missing: apt-get install openmpi-bin libopenmpi-dev")
    sizes = [int(m) for m in MB.split(",")]
    bw = {}
    for w in WORLDS:
        for engine in ENGINES:
            bw[(engine, w)] = collective(engine, w)
            print(f"all-reduce {engine} x{w} done", flush=True)
    steps = {}
    for w in WORLDS:
        for engine in ENGINES:
            for mode in MODES:
                steps[(engine, w, mode)] = train(engine, w, mode)
                print(f"train {engine} x{w} {mode}: {steps[(engine, w, mode)]}", flush=True)
    mpi_version = run(["mpirun", "--version"], env=MPI_ENV).splitlines()[0]
    lines = [
        "<!-- engines:start -->",
        "## Cluster engines: Steadfast's mesh, MPI and gloo side by side",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores;"
        f" {mpi_version}; PyTorch {torch.__version__} (gloo).",
        "- Command: `bench/run.sh engines` (driver: `bench/engines.py`; Steadfast and MPI: `steadfast bench collective`"
        " and `steadfast train`; gloo: `bench/torch_collective.py` and `bench/torch_ddp.py`).",
        "- One process per rank on this host, all engines over loopback; `mpirun --oversubscribe --bind-to none`"
        " (no engine pins its ranks). With more ranks than cores, the ranks share the cores, so 4 ranks measure"
        " contention as much as the transport.",
        "- `reproducible` on gloo is Steadfast's fixed-point sum written with torch operations on gloo's integer"
        " collectives (MAX on uint8, SUM on int64), as `--engine mpi` does on MPI's.",
        "",
        "### All-reduce bus bandwidth (MB/s; median of 5 after a warm-up)",
        "",
        "Bus bandwidth = 2(W-1)/W x message / time. *same bits* compares the fingerprints of the three engines' sums"
        " for that size and mode.",
        "",
        "| ranks | message | mode | Steadfast | MPI | gloo | Steadfast / MPI | Steadfast / gloo | same bits |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in WORLDS:
        for mb in sizes:
            for mode in MODES:
                r = [bw[(e, w)][(mb, mode)] for e in ENGINES]
                same = "yes" if len({x["sum_fingerprint"] for x in r}) == 1 else "no"
                lines.append(
                    f"| {w} | {mb} MB | {mode} | {r[0]['bus_mb_per_s']:.0f} | {r[1]['bus_mb_per_s']:.0f} |"
                    f" {r[2]['bus_mb_per_s']:.0f} | {r[0]['bus_mb_per_s'] / r[1]['bus_mb_per_s']:.2f}x |"
                    f" {r[0]['bus_mb_per_s'] / r[2]['bus_mb_per_s']:.2f}x | {same} |")
    lines += [
        "",
        "Time of `reproducible` over `fast` on each engine (same size):",
        "",
        "| ranks | message | Steadfast | MPI | gloo |",
        "|---|---|---|---|---|",
    ]
    for w in WORLDS:
        for mb in sizes:
            ratio = [bw[(e, w)][(mb, "reproducible")]["seconds"] / bw[(e, w)][(mb, "fast")]["seconds"] for e in ENGINES]
            lines.append(f"| {w} | {mb} MB | {ratio[0]:.2f}x | {ratio[1]:.2f}x | {ratio[2]:.2f}x |")
    lines += [
        "",
        f"### Data-parallel training (MLP on Fashion-MNIST, steps/s of rank 0, {STEPS} steps)",
        "",
        "Global batch 128: Steadfast and MPI run 4 micro-batches of 32 spread over the ranks, DDP 128/W per rank;"
        " AdamW; threads per rank = cores / W. Fingerprints are Steadfast's; DDP's column is a SHA-256 prefix of its"
        " final weights (a different function of a different computation: compare DDP's only with DDP's).",
        "",
        "| ranks | mode | Steadfast | MPI | DDP gloo | Steadfast / DDP | MPI / DDP | Steadfast fingerprint |"
        " MPI fingerprint | DDP weights hash |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in WORLDS:
        for mode in MODES:
            (s, sf), (m, mf), (g, gf) = (steps[(e, w, mode)] for e in ENGINES)
            lines.append(f"| {w} | {mode} | {s:.1f} | {m:.1f} | {g:.1f} | {s / g:.2f}x | {m / g:.2f}x | `{sf}` |"
                         f" `{mf}` | `{gf}` |")
    rep = {steps[(e, w, "reproducible")][1] for e in ("steadfast", "mpi") for w in WORLDS}
    ddp_rep = {steps[("gloo", w, "reproducible")][1] for w in WORLDS}
    lines += [
        "",
        f"Steadfast and MPI `reproducible` fingerprints identical for every engine and world size: "
        f"{'yes' if len(rep) == 1 else 'no'}. DDP's reproducible final weights identical across world sizes: "
        f"{'yes' if len(ddp_rep) == 1 else 'no'} (its all-reduce is reproducible, but each rank's gradient is a"
        " mean over its own 128/W examples, computed in an order that depends on W).",
        "<!-- engines:end -->",
    ]
    publish("engines", lines)


if __name__ == "__main__":
    main()
