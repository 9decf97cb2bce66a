"""The cluster engines side by side in one run: Steadfast's mesh (`steadfast launch`; ranks
of this host exchange frames through shared memory, and the same mesh kept on TCP with
STEADFAST_SHARED_MEMORY=0 is a column of its own), the system's MPI library (`mpirun ...
--engine mpi`) and PyTorch's gloo, each in `fast` and `reproducible` mode, 2 and 4 ranks,
one process per rank, all on this host.

1. All-reduce bus bandwidth of the training step's collective (`steadfast bench
   collective`; peer: bench/torch_collective.py), with a fingerprint of each sum, to show
   which engines agree bit for bit.
2. Data-parallel training steps/s of the MLP and the CNN on Fashion-MNIST and of the GPT on
   fortunes (`steadfast train`; static and elastic jobs), against MPI, and for the MLP
   against DDP on gloo (bench/torch_ddp.py, whose reproducible mode is a DDP communication
   hook). Each cell is the best of REPEAT runs (noise on a shared machine only slows).
3. A one-rank job (`launch --nproc 1`) against `train` alone.

Usage: bench/.venv/bin/python bench/engines.py   (bench/run.sh engines does this)
Environment: WORLDS (default 2,4), MB (default 1,4,16,64,256), STEPS (MLP steps, default
300; the CNN runs a third of them, the GPT a tenth), MODELS (default mlp,cnn,gpt), REPEAT
(default 2).
"""
import datetime, json, os, shutil, socket, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
WORLDS = [int(w) for w in os.environ.get("WORLDS", "2,4").split(",")]
MB = os.environ.get("MB", "1,4,16,64,256")
STEPS = int(os.environ.get("STEPS", "300"))
MODELS = os.environ.get("MODELS", "mlp,cnn,gpt").split(",")
REPEAT = int(os.environ.get("REPEAT", "2"))
MODES = ["fast", "reproducible"]
# All-reduce engines; training adds Steadfast's elastic job.
ENGINES = ["steadfast", "steadfast-tcp", "mpi", "gloo"]
TRAIN_ENGINES = ["steadfast", "elastic", "steadfast-tcp", "mpi", "gloo"]
# data, global batch, micro-batch, steps
SETUP = {
    "mlp": ("fashion-mnist", 128, 32, STEPS),
    "cnn": ("fashion-mnist", 128, 32, max(10, STEPS // 3)),
    "gpt": ("fortunes", 32, 8, max(10, STEPS // 10)),
}
# Open MPI refuses root without these, and would pin each rank to a core by default;
# the other engines do not pin, so neither does MPI here.
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
TCP_ENV = dict(MPI_ENV, STEADFAST_SHARED_MEMORY="0")
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
    if engine in ("steadfast", "steadfast-tcp"):
        env = TCP_ENV if engine == "steadfast-tcp" else MPI_ENV
        out = run([BIN, "launch", "--nproc", str(world), "--", *args], env=env)
    elif engine == "mpi":
        out = run([*MPIRUN, "-n", str(world), BIN, *args, "--engine", "mpi"], env=MPI_ENV)
    else:
        out = run([sys.executable, os.path.join(ROOT, "bench", "torch_collective.py"), "--world", str(world),
                   "--mb", MB, "--port", str(free_port())])
    return {(r["mb"], r["mode"]): r for r in json_rows(out)}


def train_once(engine, model, world, mode):
    """Steps/s of rank 0's training loop, and the final-weights fingerprint (or hash)."""
    data, batch, micro, steps = SETUP[model]
    threads = str(max(1, (os.cpu_count() or 2) // max(world, 1)))
    if engine == "gloo":
        out = run([sys.executable, os.path.join(ROOT, "bench", "torch_ddp.py"), "--world", str(world),
                   "--steps", str(steps), "--port", str(free_port()), "--reduce", mode])
        r = json_rows(out)[-1]
        return steps / r["seconds"], r["weights_sha256"]
    out_dir = tempfile.mkdtemp()
    try:
        args = ["train", "--model", model, "--data", data, "--steps", str(steps), "--batch", str(batch),
                "--micro-batch", str(micro), "--reduce", mode, "--eval-every", "0", "--eval-limit", "256",
                "--out", out_dir]
        env = dict(TCP_ENV if engine == "steadfast-tcp" else MPI_ENV, RAYON_NUM_THREADS=threads)
        if engine == "alone":
            out = run([BIN, *args], env=env)
        elif engine in ("steadfast", "steadfast-tcp"):
            out = run([BIN, "launch", "--nproc", str(world), "--", *args], env=env)
        elif engine == "elastic":
            out = run([BIN, "launch", "--nproc", str(world), "--max-restarts", "1", "--", *args], env=env)
        else:
            out = run([*MPIRUN, "-x", "RAYON_NUM_THREADS", "-n", str(world), BIN, *args, "--engine", "mpi"], env=env)
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            summary = json.loads(f.read().splitlines()[-1])
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    prints = [line.split("fingerprint: ")[1].split()[0] for line in out.splitlines() if "fingerprint: " in line]
    return steps / summary["train_seconds"], prints[0]


def train(engine, model, world, mode):
    """The best of REPEAT runs (the fingerprints must agree)."""
    runs = [train_once(engine, model, world, mode) for _ in range(REPEAT)]
    if len({f for _, f in runs}) != 1:
        raise RuntimeError(f"{engine} {model} x{world} {mode}: fingerprints differ between runs: {runs}")
    return max(r for r, _ in runs), runs[0][1]


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
    for model in MODELS:
        for w in WORLDS:
            for mode in MODES:
                for engine in TRAIN_ENGINES:
                    if engine == "gloo" and model != "mlp":
                        continue
                    steps[(engine, model, w, mode)] = train(engine, model, w, mode)
                    print(f"train {model} {engine} x{w} {mode}: {steps[(engine, model, w, mode)]}", flush=True)
        for mode in MODES:
            for engine in ("alone", "steadfast"):
                steps[(engine, model, 1, mode)] = train(engine, model, 1, mode)
                print(f"train {model} {engine} x1 {mode}: {steps[(engine, model, 1, mode)]}", flush=True)
    mpi_version = run(["mpirun", "--version"], env=MPI_ENV).splitlines()[0]
    # The raw figures, kept beside the table.
    os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "out", "engines.json"), "w") as f:
        json.dump({"bw": {f"{e} {w}": {f"{mb} {m}": r for (mb, m), r in v.items()} for (e, w), v in bw.items()},
                   "steps": {" ".join(map(str, k)): v for k, v in steps.items()}}, f, indent=1)
    publish("engines", report(sizes, bw, steps, mpi_version, torch.__version__))


def report(sizes, bw, steps, mpi_version, torch_version):
    lines = [
        "<!-- engines:start -->",
        "## Cluster engines: Steadfast's mesh, MPI and gloo side by side",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores;"
        f" {mpi_version}; PyTorch {torch_version} (gloo).",
        f"- Command: `STEPS={STEPS} REPEAT={REPEAT} bench/run.sh engines` (driver: `bench/engines.py`; Steadfast and MPI: `steadfast bench collective`"
        " and `steadfast train`; gloo: `bench/torch_collective.py` and `bench/torch_ddp.py`).",
        "- One process per rank on this host; `mpirun --oversubscribe --bind-to none` (no engine pins its ranks)."
        " *Steadfast* is the default mesh, whose ranks on one host exchange frames through shared memory;"
        " *Steadfast TCP* is the same mesh kept on loopback TCP (`STEADFAST_SHARED_MEMORY=0`), as it was before the"
        " rings. With more ranks than cores, the ranks share the cores, so 4 ranks measure contention as much as"
        " the transport.",
        "- `reproducible` on gloo is Steadfast's fixed-point sum written with torch operations on gloo's integer"
        " collectives (MAX on uint8, SUM on int64), as `--engine mpi` does on MPI's.",
        "",
        "### All-reduce bus bandwidth (MB/s; median of 5 after a warm-up)",
        "",
        "Bus bandwidth = 2(W-1)/W x message / time. *same bits* compares the fingerprints of the four engines' sums"
        " for that size and mode.",
        "",
        "| ranks | message | mode | Steadfast | Steadfast TCP | MPI | gloo | Steadfast / MPI | TCP / MPI |"
        " Steadfast / gloo | same bits |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in WORLDS:
        for mb in sizes:
            for mode in MODES:
                r = [bw[(e, w)][(mb, mode)]["bus_mb_per_s"] for e in ENGINES]
                same = "yes" if len({bw[(e, w)][(mb, mode)]["sum_fingerprint"] for e in ENGINES}) == 1 else "no"
                lines.append(
                    f"| {w} | {mb} MB | {mode} | {r[0]:.0f} | {r[1]:.0f} | {r[2]:.0f} | {r[3]:.0f} |"
                    f" {r[0] / r[2]:.2f}x | {r[1] / r[2]:.2f}x | {r[0] / r[3]:.2f}x | {same} |")
    lines += [
        "",
        "Time of `reproducible` over `fast` on each engine (same size):",
        "",
        "| ranks | message | Steadfast | Steadfast TCP | MPI | gloo |",
        "|---|---|---|---|---|---|",
    ]
    for w in WORLDS:
        for mb in sizes:
            ratio = [bw[(e, w)][(mb, "reproducible")]["seconds"] / bw[(e, w)][(mb, "fast")]["seconds"] for e in ENGINES]
            lines.append(f"| {w} | {mb} MB | " + " | ".join(f"{x:.2f}x" for x in ratio) + " |")
    lines += [
        "",
        f"### Data-parallel training (steps/s of rank 0, best of {REPEAT} runs)",
        "",
        "Steadfast and MPI spread the micro-batches of each global batch over the ranks (MLP and CNN: Fashion-MNIST,"
        f" batch 128 as 4 micro-batches of 32, {SETUP['mlp'][3]} and {SETUP['cnn'][3]} steps; GPT: fortunes, 32"
        f" sequences as 4 micro-batches of 8, {SETUP['gpt'][3]} steps); DDP (MLP only) runs 128/W per rank. AdamW;"
        " threads per rank = cores / W. *elastic* is the same job launched with `--max-restarts 1` (the elastic"
        " worker, its coordinator and its step protocol). *fingerprint* is that of Steadfast's three columns (one"
        " value: they agree) and whether MPI's is the same (`fast` sums in another order on 4 ranks); DDP's weights"
        " are a different function of a different computation.",
        "",
        "| model | ranks | mode | Steadfast | elastic | Steadfast TCP | MPI | DDP gloo | Steadfast / MPI |"
        " elastic / static | TCP / MPI | fingerprint |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    met, cells, worst_elastic = 0, 0, 1.0
    for model in MODELS:
        for w in WORLDS:
            for mode in MODES:
                got = {e: steps.get((e, model, w, mode)) for e in TRAIN_ENGINES}
                prints = {got[e][1] for e in ("steadfast", "elastic", "steadfast-tcp")}
                s, el, tcp, m = (got[e][0] for e in ("steadfast", "elastic", "steadfast-tcp", "mpi"))
                ddp = f"{got['gloo'][0]:.1f}" if got["gloo"] else "-"
                met, cells = met + (s >= m), cells + 1
                worst_elastic = min(worst_elastic, el / s)
                mpi_print = got["mpi"][1]
                same = "same" if prints == {mpi_print} else f"MPI `{mpi_print}`"
                lines.append(f"| {model} | {w} | {mode} | {s:.1f} | {el:.1f} | {tcp:.1f} | {m:.1f} | {ddp} |"
                             f" {s / m:.2f}x | {el / s:.2f}x | {tcp / m:.2f}x | `{'`, `'.join(sorted(prints))}` ({same}) |")
    lines += [
        "",
        f"Steadfast at least MPI's steps/s in {met} of {cells} cells; the slowest elastic job at"
        f" {worst_elastic:.2f}x its static one.",
        "",
        "### One rank: `launch --nproc 1` against `train` alone",
        "",
        "| model | mode | train | launch --nproc 1 | launch / train | same fingerprint |",
        "|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        for mode in MODES:
            (a, af), (l, lf) = steps[("alone", model, 1, mode)], steps[("steadfast", model, 1, mode)]
            lines.append(f"| {model} | {mode} | {a:.1f} | {l:.1f} | {l / a:.2f}x | {'yes' if af == lf else 'no'} |")
    lines.append("<!-- engines:end -->")
    return lines


if __name__ == "__main__":
    main()
