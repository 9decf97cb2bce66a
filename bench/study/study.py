"""The checkpoint/restart study: the same training in Steadfast, PyTorch, TensorFlow/Keras
and Chainer, each checkpointing the way its users do, compared on cost, formats and sizes,
cross-loading, determinism of a restart, and integrity.

    bench/run.sh study            # the whole study; rewrites docs/checkpoint-study.md
    bench/run.sh study --quick    # a small form (under 10 minutes once installed)
    python3 bench/study/study.py --quick --only steadfast --json OUT   # one system's side

The workload is the MLP (784-W-W/2-10, ReLU) and LeNet-5 on Fashion-MNIST, batch 128,
AdamW (lr 1e-3 and 2e-3), with W scaling the MLP's state. Every system can start from
Steadfast's initial weights and train on Steadfast's data order (`steadfast bench init`,
`steadfast bench order`); the "same training" table measures how close the systems stay.
Each framework's side runs in its own virtual environment, installed here from PyPI at
pinned versions (`VENVS`); a framework that cannot be installed is recorded, not faked.

Per system and saver it measures:
- cost: steps/s without and with a checkpoint every 10 steps, the stall per checkpoint
  (the time training waits), the time to load, bytes on disk per byte of state; and the
  training overhead against the checkpoint interval;
- contents: what a checkpoint holds (read back from the files);
- cross-loading: a Steadfast shard loaded by the framework through safetensors, and each
  framework's files read by `steadfast ckpt export`;
- determinism: N steps, checkpoint, a new process resumes and trains to N+M; are the
  final weights those of an uninterrupted N+M run? N crosses the first epoch boundary
  (468 steps) and N+M the second;
- integrity: one bit flipped in the middle of the largest file, and the file truncated to
  half: does loading notice?
- scale: 1, 2 and 4 data-parallel ranks, each system's own distributed checkpoint: the
  stall per checkpoint, the files and bytes written, and whether the ranks end equal.
"""
import argparse, datetime, functools, json, math, os, shutil, statistics, subprocess, sys, tempfile, time

import workload
from damage import KINDS, damaged_copy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from common import cpu_name, last_words, write_section  # noqa: E402

BIN = os.environ.get("STEADFAST_BIN", os.path.join(ROOT, "target", "release", "steadfast"))
PER_EPOCH = 60000 // 128
N_RESTART, M_RESTART = PER_EPOCH + 20, PER_EPOCH

# Savers measured for cost only: what a saver's cost would be without a part it saves.
COST_ONLY = {"TensorFlow": ["tf.train.Checkpoint-no-iterator"]}

# Each framework's side: its virtual environment, the pinned packages installed there (in
# order; a list is one `pip install`), its script and its savers.
VENVS = {
    "PyTorch": (os.path.join(ROOT, "bench", ".venv"), [], "torch_side.py", ["torch.save", "dcp"]),
    "TensorFlow": (os.path.join(ROOT, "bench", ".venv-tf"),
                   [["tensorflow-cpu==2.21.0", "keras==3.15.1", "h5py==3.14.0", "safetensors==0.7.0"]],
                   "tf_side.py", ["tf.train.Checkpoint", "keras", "h5"]),
    "Chainer": (os.path.join(ROOT, "bench", ".venv-chainer"),
                # Chainer 7.8.1's setup.py needs pkg_resources, and its code NumPy < 1.24.
                # mpi4py (built against the system's Open MPI) is ChainerMN's transport.
                [["setuptools<70", "wheel", "numpy==1.23.5", "h5py==3.9.0", "safetensors==0.7.0"],
                 ["--no-build-isolation", "chainer==7.8.1", "mpi4py==4.1.2"]],
                "chainer_side.py", ["npz", "hdf5"]),
}


def sh(cmd, env=None, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, env=dict(os.environ, **(env or {})))


class SideError(Exception):
    """A framework's command failed; the study records its last words."""


# ---------------------------------------------------------------- Steadfast


def sf_train(out, steps, threads, extra=(), model="mlp", width=256):
    """Runs `steadfast train` and returns (summary, checkpoint lines) of its metrics."""
    cmd = [BIN, "train", "--model", model, "--steps", str(steps), "--eval-every", "0", "--eval-limit", "1",
           "--out", out, *extra]
    if model == "mlp":
        cmd += ["--width", str(width)]
    sh(cmd, {"RAYON_NUM_THREADS": str(threads)})
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return [l for l in lines if l["kind"] == "summary"][-1], [l for l in lines if l["kind"] == "checkpoint"]


def wall_seconds(summary):
    """A run's training time including its checkpoint stalls: `train_seconds` counts the
    steps alone, and the frameworks' figures include their saves."""
    return summary["train_seconds"] + summary.get("checkpoint_stall_seconds", 0.0)


def newest(root):
    return os.path.join(root, sorted(d for d in os.listdir(root) if d.startswith("step-"))[-1])


def steadfast_checkpoint(tmp, name, steps, model="mlp", width=256, threads=1):
    """Trains `steps` steps with a checkpoint at the end; returns the checkpoint's directory."""
    root = os.path.join(tmp, name)
    shutil.rmtree(root, ignore_errors=True)
    sf_train(os.path.join(tmp, name + "-out"), steps, threads,
             ["--checkpoint-every", str(steps), "--checkpoint-dir", root], model, width)
    return newest(root)


# A run without checkpoints is measured once per configuration, and every saver and
# interval of that configuration is compared with it.
@functools.cache
def steadfast_plain(tmp, model, width, steps, threads):
    return sf_train(os.path.join(tmp, "plain"), steps, threads, (), model, width)[0]["train_seconds"]


def steadfast_cost(tmp, model, width, steps, every, threads):
    seconds = steadfast_plain(tmp, model, width, steps, threads)
    root = os.path.join(tmp, "ckpt")
    shutil.rmtree(root, ignore_errors=True)
    summary, ckpts = sf_train(os.path.join(tmp, "with"), steps, threads,
                              ["--checkpoint-every", str(every), "--checkpoint-dir", root, "--keep-last", "1"],
                              model, width)
    last = newest(root)
    t = time.perf_counter()
    sh([BIN, "ckpt", "verify", last])
    load = time.perf_counter() - t
    inspect = json.loads(sh([BIN, "ckpt", "inspect", "--json", last]).stdout)
    state = sum(4 * math.prod(t["shape"]) for t in inspect["manifest"]["tensors"])
    return {
        "saver": "own", "model": model, "width": width if model == "mlp" else "",
        "seconds": seconds, "seconds_with": wall_seconds(summary), "steps": steps,
        "steps_per_s": steps / seconds,
        "steps_per_s_with": steps / wall_seconds(summary),
        "stall_seconds": statistics.median(c["stall_seconds"] for c in ckpts),
        "load_seconds": load,
        "bytes": workload.size_on_disk(last),
        "state_bytes": state,
    }


def steadfast_contents(tmp):
    ckpt = steadfast_checkpoint(tmp, "contents", 3)
    m = json.loads(sh([BIN, "ckpt", "inspect", "--json", ckpt]).stdout)["manifest"]
    roles = sorted({t["role"] for t in m["tensors"]})
    meta = m["meta"]
    return {"own": {
        "weights": "model" in roles,
        "optimizer state": any(r.startswith("optim") for r in roles) and "optimizer.updates" in meta.get("scalars", {}),
        "RNG": "rng" in meta,
        "data position": "data_cursor" in meta,
        "step": "step" in meta,
    }}


def steadfast_restart(tmp, n, m, threads, model="mlp"):
    whole, _ = sf_train(os.path.join(tmp, "whole"), n + m, threads, (), model)
    root = os.path.join(tmp, "restart")
    shutil.rmtree(root, ignore_errors=True)
    sf_train(os.path.join(tmp, "first"), n, threads, ["--checkpoint-every", str(n), "--checkpoint-dir", root], model)
    resumed, _ = sf_train(os.path.join(tmp, "second"), n + m, threads,
                          ["--checkpoint-dir", root, "--resume", "latest"], model)
    return {"saver": "own", "model": model, "threads": threads,
            "identical": whole["fingerprint"] == resumed["fingerprint"]}


def steadfast_integrity(tmp):
    clean = steadfast_checkpoint(tmp, "integrity", 3)
    out = {}
    for damage in KINDS:
        bad = os.path.join(tmp, damage.replace(" ", "-"))
        damaged_copy(clean, bad, damage)
        r = sh([BIN, "ckpt", "verify", bad], check=False)
        said = (r.stdout + r.stderr).strip().splitlines()
        said = [l for l in said if "corrupt" in l.lower() or "error" in l.lower()] or said
        out[damage] = (f"refused: {said[0][:200]}" if r.returncode != 0 else "loaded silently") if said else "?"
    return {"own": out}


def steadfast_interval(tmp, a):
    """Training overhead of a checkpoint every k steps, against none (Steadfast)."""
    width, steps = interval_setting(a)
    rows = []
    for every in INTERVALS:
        c = steadfast_cost(tmp, "mlp", width, steps, every, 2)
        rows.append({"saver": "own", "every": every, "overhead": c["seconds_with"] / c["seconds"] - 1})
    return rows


def steadfast_scale(tmp, a, world, every):
    """A data-parallel job of `world` workers (`steadfast launch`), 1 thread each, global
    batch 128 split evenly; every rank writes its part of each checkpoint."""
    width, steps, _ = scale_setting(a)
    out, root = os.path.join(tmp, "scale-out"), os.path.join(tmp, "scale-ckpt")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    cmd = [BIN, "launch", "--nproc", str(world), "--", "train", "--model", "mlp", "--width", str(width),
           "--steps", str(steps), "--batch", "128", "--micro-batch", str(128 // world), "--eval-every", "0",
           "--eval-limit", "1", "--out", out]
    if every <= steps:
        cmd += ["--checkpoint-every", str(every), "--checkpoint-dir", root, "--keep-last", "1"]
    said = sh(cmd, {"RAYON_NUM_THREADS": "1"}).stdout
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    summary = [l for l in lines if l["kind"] == "summary"][-1]
    stalls = [l["stall_seconds"] for l in lines if l["kind"] == "checkpoint"]
    # Each worker prints `[rank] fingerprint: <hash> ...` of its final weights.
    prints = [l.split("fingerprint: ")[1].split()[0] for l in said.splitlines() if "] fingerprint: " in l]
    row = {"seconds": wall_seconds(summary), "stall_seconds": statistics.median(stalls) if stalls else None,
           "replicas agree": len(prints) == world and len(set(prints)) == 1}
    if stalls:
        last = newest(root)
        row.update(bytes=workload.size_on_disk(last), files=len(workload.files_of(last)))
    return row


def steadfast_side(a, tmp):
    out = {"system": "Steadfast", "version": sh([BIN, "--version"]).stdout.split()[-1], "status": "ran",
           "cost": [], "restart": []}
    for w in widths(a):
        out["cost"].append(steadfast_cost(tmp, "mlp", w, cost_steps(a, w), 10, 2))
    if not a.quick:
        out["cost"].append(steadfast_cost(tmp, "cnn", 0, 200, 10, 2))
    out["interval"] = steadfast_interval(tmp, a)
    out["contents"] = steadfast_contents(tmp)
    for threads in [1, 2]:
        out["restart"].append(steadfast_restart(tmp, N_RESTART, M_RESTART, threads))
    if not a.quick:
        out["restart"].append(steadfast_restart(tmp, N_RESTART, M_RESTART, 2, "cnn"))
    out["integrity"] = steadfast_integrity(tmp)
    out["scale"] = scale_rows("parted checkpoint", lambda world, every: steadfast_scale(tmp, a, world, every), a)
    return out


# ---------------------------------------------------------------- the frameworks


def widths(a):
    return [256, 2048] if a.quick else [256, 1024, 4096, 12000]


def cost_steps(a, width):
    """Steps per cost cell: enough checkpoints to take a median, fewer for the widest."""
    if a.quick:
        return 60
    return {4096: 60, 12000: 30}.get(width, 300)


INTERVALS = [1, 10, 50]


def interval_setting(a):
    """The MLP width and steps of the interval sweep: at least one checkpoint at the widest
    interval."""
    return (1024, max(INTERVALS)) if a.quick else (1024, 200)


def ensure_venv(system):
    """Creates the system's virtual environment with its pinned packages if it lacks
    them; returns its Python, or raises SideError with why it cannot be installed."""
    venv, installs, _, _ = VENVS[system]
    py = os.path.join(venv, "bin", "python")
    probe = {"PyTorch": "import torch, safetensors", "TensorFlow": "import tensorflow, keras, safetensors",
             "Chainer": "import chainer, chainermn, mpi4py, h5py, safetensors"}[system]
    if os.path.exists(py) and sh([py, "-c", probe], check=False).returncode == 0:
        return py
    if not installs:
        raise SideError(f"{venv} lacks it: bench/run.sh installs it")
    sh([sys.executable, "-m", "venv", venv])
    for packages in installs:
        r = sh([py, "-m", "pip", "install", "-q", *packages], check=False)
        if r.returncode != 0:
            raise SideError("pip install " + " ".join(packages) + " failed: " + last_words(r.stderr))
    r = sh([py, "-c", probe], check=False)
    if r.returncode != 0:
        raise SideError("installed but does not import: " + last_words(r.stderr))
    return py


def side(system, py, *args):
    """Runs one command of a framework's side; returns its JSON answer."""
    script = os.path.join(HERE, VENVS[system][2])
    r = sh([py, script, *map(str, args)], {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": HERE}, check=False)
    if r.returncode != 0:
        raise SideError(last_words(r.stderr))
    return json.loads(r.stdout.strip().splitlines()[-1])


def file_name(system, saver, stem):
    """Where a saver writes in a directory: Keras picks its format by the extension."""
    return stem + {"keras": ".keras", "h5": ".h5", "npz": ".npz", "hdf5": ".h5"}.get(saver, "")


@functools.cache
def framework_plain(system, py, tmp, model, width, steps):
    """Training seconds without checkpoints (shared as `steadfast_plain` is)."""
    r = side(system, py, "cost", "--model", model, "--width", width, "--steps", steps, "--every", steps + 1,
             "--threads", 2, "--dir", tempfile.mkdtemp(dir=tmp))
    return sum(r["step_seconds"])


def framework_cost(system, py, tmp, saver, model, width, steps, every):
    d = tempfile.mkdtemp(dir=tmp)
    seconds = framework_plain(system, py, tmp, model, width, steps)
    r = side(system, py, "cost", "--model", model, "--width", width, "--steps", steps, "--every", every,
             "--saver", saver, "--threads", 2, "--dir", d)
    seconds_with = sum(r["step_seconds"]) + sum(r["save_seconds"])
    shutil.rmtree(d, ignore_errors=True)
    return {"saver": saver, "model": model, "width": width if model == "mlp" else "", "version": r["version"],
            "seconds": seconds, "seconds_with": seconds_with, "steps": steps,
            "steps_per_s": steps / seconds, "steps_per_s_with": steps / seconds_with,
            "stall_seconds": statistics.median(r["save_seconds"]), "load_seconds": r["load_seconds"],
            "bytes": r["bytes"], "state_bytes": r["state_bytes"]}


def framework_restart(system, py, tmp, saver, threads, whole, extra=()):
    d = tempfile.mkdtemp(dir=tmp)
    ck = os.path.join(d, file_name(system, saver, "restart"))
    try:
        side(system, py, "run", "--steps", N_RESTART, "--save-at", N_RESTART, "--dir", ck, "--threads", threads,
             "--saver", saver, *extra)
        resumed = side(system, py, "run", "--steps", N_RESTART + M_RESTART, "--resume", ck, "--threads", threads,
                       "--saver", saver, *extra)
        return {"identical": whole == resumed["weights_sha256"]}
    except SideError as e:
        return {"identical": False, "failed": str(e)}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def relative_distance(a, b, start):
    """||a - b|| / ||a - start|| over the model's tensors: how far two trainings from the
    same start drifted apart, against how far the first moved."""
    import numpy as np
    num = sum(float(((a[k].astype(np.float64) - b[k]) ** 2).sum()) for k in a)
    den = sum(float(((a[k].astype(np.float64) - start[k]) ** 2).sum()) for k in a)
    return math.sqrt(num / den)


def same_training(system, py, tmp, model, refs):
    """Trains from Steadfast's initial weights on Steadfast's order; the distance from
    Steadfast's weights after each number of steps in `refs`."""
    out = {}
    for steps, (init, order, ours) in refs.items():
        dump = os.path.join(tmp, f"{system}-{model}-{steps}.safetensors")
        try:
            side(system, py, "run", "--model", model, "--steps", steps, "--init", init, "--order", order,
                 "--dump", dump, "--threads", 2)
        except SideError as e:
            out[steps] = f"failed: {e}"
            continue
        theirs, mine = workload.read_tensors(dump), workload.read_tensors(ours)
        out[steps] = relative_distance({k: v for k, v in mine.items() if k in theirs}, theirs, workload.read_tensors(init))
    return out


def cross_load(system, py, tmp, shard, ours):
    """A Steadfast shard loaded through safetensors by the framework, and the framework's
    files read by `steadfast ckpt export`."""
    import numpy as np
    out = {}
    dump = os.path.join(tmp, f"{system}-from-steadfast.safetensors")
    try:
        side(system, py, "run", "--steps", 0, "--init", shard, "--dump", dump)
        want = workload.read_tensors(ours)
        got = workload.read_tensors(dump)
        same = all(np.array_equal(got[k], want[k]) for k in got)
        out["a Steadfast shard"] = "loads, bit-identical" if same else "loads, values differ"
    except SideError as e:
        out["a Steadfast shard"] = f"fails: {e}"
    d = tempfile.mkdtemp(dir=tmp)
    for saver, files in side(system, py, "export", "--dir", d).items():
        exported = os.path.join(d, saver + ".safetensors")
        r = sh([BIN, "ckpt", "export", files["path"], "--to", exported, "--json"], check=False)
        if r.returncode != 0:
            why = last_words(r.stderr).removeprefix("error: ").replace(os.path.dirname(files["path"]) + "/", "")
            out[f"{saver} in Steadfast"] = "not read: " + why
            continue
        # Layouts differ between systems, so tensors are matched by their sorted values.
        found = sorted(np.sort(v, axis=None).tobytes() for v in workload.read_tensors(exported).values())
        weights = workload.read_tensors(files["weights"])
        hits = sum(np.sort(v, axis=None).tobytes() in found for v in weights.values())
        skipped = len(json.loads(r.stdout).get("skipped", []))
        out[f"{saver} in Steadfast"] = (f"read: {hits} of {len(weights)} weight tensors bit-identical"
                                        + (f", {skipped} arrays skipped (compressed or chunked)" if skipped else ""))
    return out


# ---------------------------------------------------------------- scale

SCALE_RANKS = [1, 2, 4]
# The saver each framework's scale runs use: its own distributed checkpoint.
SCALE_SAVERS = {"PyTorch": ["dcp", "torch.save"], "TensorFlow": ["tf.train.Checkpoint"], "Chainer": ["npz"]}
SCALE_LABELS = {("PyTorch", "torch.save"): "torch.save on rank 0", ("PyTorch", "dcp"): "DCP",
                ("TensorFlow", "tf.train.Checkpoint"): "tf.train.Checkpoint (MultiWorkerMirroredStrategy)",
                ("Chainer", "npz"): "ChainerMN multi-node checkpointer"}


def scale_setting(a):
    """The MLP width, steps and checkpoint interval of the scale runs."""
    return (1024, 20, 10) if a.quick else (2048, 60, 10)


def scale_rows(label, job, a):
    """Runs `job(world, every)` with checkpoints for each world size, and (not in the
    quick form) without, for the overhead."""
    _, steps, every = scale_setting(a)
    rows = []
    for world in SCALE_RANKS:
        with_ = job(world, every)
        plain = job(world, steps + 1) if not a.quick else None
        rows.append({"saver": label, "ranks": world, "steps": steps,
                     "steps_per_s": steps / plain["seconds"] if plain else None,
                     "steps_per_s_with": steps / with_["seconds"], **{k: v for k, v in with_.items() if k != "seconds"},
                     "replicas agree": with_["replicas agree"] and (plain is None or plain["replicas agree"])})
    return rows


def scale_savers(system, a):
    """The savers of a framework's scale runs (the quick form: its first alone)."""
    return SCALE_SAVERS[system][:1] if a.quick else SCALE_SAVERS[system]


def free_ports(n):
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def framework_scale(system, py, tmp, a, saver, world, every):
    """One data-parallel job of the framework: `world` processes of its side's `scale`
    command, 1 thread each; the slowest rank's loop time, the stall per checkpoint (the
    median over checkpoints of the slowest rank's save), and rank 0's account of the files."""
    width, steps, _ = scale_setting(a)
    d = tempfile.mkdtemp(dir=tmp)
    args = [py, os.path.join(HERE, VENVS[system][2]), "scale", "--width", str(width), "--steps", str(steps),
            "--every", str(every), "--saver", saver, "--threads", "1", "--dir", d]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=HERE, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if system == "Chainer":
        jobs = [(["mpiexec", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-n", str(world),
                  "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS", *args], env)]
    elif system == "PyTorch":
        port = free_ports(1)[0]
        jobs = [(args, dict(env, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
                for r in range(world)]
    else:
        workers = [f"127.0.0.1:{p}" for p in free_ports(world)]
        jobs = [(args, dict(env, TF_CONFIG=json.dumps({"cluster": {"worker": workers},
                                                       "task": {"type": "worker", "index": r}})))
                for r in range(world)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e) for cmd, e in jobs]
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise SideError(f"{world} ranks: " + last_words(err))
    try:
        ranks = [json.load(open(os.path.join(d, f"rank-{r}.json"))) for r in range(world)]
    except OSError as e:
        raise SideError(f"{world} ranks: a rank did not report ({e})") from e
    finally:
        shutil.rmtree(d, ignore_errors=True)
    saves = list(zip(*(r["save_seconds"] for r in ranks)))
    return {"seconds": max(r["seconds"] for r in ranks),
            "stall_seconds": statistics.median(max(s) for s in saves) if saves else None,
            "bytes": ranks[0].get("bytes"), "files": ranks[0].get("files"),
            "replicas agree": len({r["weights_sha256"] for r in ranks}) == 1}


def framework_side(system, a, tmp, refs, shard, ours):
    out = {"system": system, "cost": [], "restart": [], "integrity": {}, "interval": []}
    try:
        py = ensure_venv(system)
    except SideError as e:
        out["status"] = f"not run: {e}"
        return out
    savers = VENVS[system][3]
    try:
        for saver in savers + COST_ONLY.get(system, []):
            for w in widths(a):
                out["cost"].append(framework_cost(system, py, tmp, saver, "mlp", w, cost_steps(a, w), 10))
            if not a.quick:
                out["cost"].append(framework_cost(system, py, tmp, saver, "cnn", 0, 200, 10))
        for saver in savers:
            out["integrity"][saver] = side(system, py, "integrity", "--saver", saver, "--dir",
                                           tempfile.mkdtemp(dir=tmp))
        out["version"] = out["cost"][0]["version"]
        # Where each saver's time goes: one profiled cell at the widest quick width.
        out["profile"] = {saver: side(system, py, "cost", "--width", 2048, "--steps", 10, "--every", 5,
                                      "--saver", saver, "--threads", 2, "--dir", tempfile.mkdtemp(dir=tmp),
                                      "--profile")["profile"] for saver in savers + COST_ONLY.get(system, [])}
        width, steps = interval_setting(a)
        for every in INTERVALS:
            c = framework_cost(system, py, tmp, savers[0], "mlp", width, steps, every)
            out["interval"].append({"saver": savers[0], "every": every, "overhead": c["seconds_with"] / c["seconds"] - 1})
        out["contents"] = side(system, py, "contents", "--dir", tempfile.mkdtemp(dir=tmp))
        if "weights" in out["contents"]:  # a side with one saver's contents
            out["contents"] = {savers[0]: out["contents"]}
        variants = [(s, ()) for s in savers] + ([("torch.save", ("--with-rng",))] if system == "PyTorch" else [])
        for threads in [2] if a.quick else [1, 2]:
            whole = side(system, py, "run", "--steps", N_RESTART + M_RESTART, "--threads", threads)["weights_sha256"]
            for saver, extra in variants:
                r = framework_restart(system, py, tmp, saver, threads, whole, extra)
                out["restart"].append({"saver": saver + (" with the epoch RNG" if extra else ""), "model": "mlp",
                                       "threads": threads, **r})
        out["same training"] = {m: same_training(system, py, tmp, m, refs[m]) for m in refs}
        out["cross-loading"] = cross_load(system, py, tmp, shard, ours)
        out["scale"], out["scale failed"] = [], {}
        for saver in scale_savers(system, a):
            try:
                out["scale"] += scale_rows(SCALE_LABELS[system, saver],
                                           lambda world, every: framework_scale(system, py, tmp, a, saver, world, every), a)
            except SideError as e:
                out["scale failed"][SCALE_LABELS[system, saver]] = str(e)
        out["status"] = "ran"
    except SideError as e:
        out["status"] = f"stopped: {e}"
    return out


def references(tmp, a):
    """Steadfast's initial weights, data order, and weights after 1 and 100 steps, per model."""
    order = os.path.join(tmp, "order.safetensors")
    sh([BIN, "bench", "order", "--epochs", "2", "--to", order])
    refs = {}
    for model in (["mlp"] if a.quick else ["mlp", "cnn"]):
        init = os.path.join(tmp, f"init-{model}.safetensors")
        sh([BIN, "bench", "init", "--model", model, "--to", init])
        refs[model] = {}
        for steps in [1, 100]:
            ours = os.path.join(tmp, f"steadfast-{model}-{steps}.safetensors")
            sh([BIN, "ckpt", "export", steadfast_checkpoint(tmp, f"ref-{model}-{steps}", steps, model), "--to", ours])
            refs[model][steps] = (init, order, ours)
    ckpt = steadfast_checkpoint(tmp, "shard", 3)
    ours = os.path.join(tmp, "shard-weights.safetensors")
    sh([BIN, "ckpt", "export", ckpt, "--to", ours])
    return refs, os.path.join(ckpt, "shard-0000.safetensors"), ours


# ---------------------------------------------------------------- report


def plots(results, a, img_dir):
    """Stall against state size, and overhead against interval; returns the files written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(img_dir, exist_ok=True)

    def line_plot(name, series, bound=None, **axes):
        fig, ax = plt.subplots(figsize=(10, 4.5))
        for label, pts in series:
            ax.plot(*zip(*pts), marker="o", label=label)
        if bound is not None:
            ax.axhline(bound, color="grey", linestyle="--", linewidth=0.8)
        ax.set(**axes)
        # Beside the axes, where no line runs under it.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        path = os.path.join(img_dir, name)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    stalls = [(f"{r['system']} {saver}",
               sorted((c["state_bytes"] / 1e6, c["stall_seconds"] * 1e3) for c in r["cost"]
                      if c["saver"] == saver and c["model"] == "mlp"))
              for r in results for saver in sorted({c["saver"] for c in r["cost"]})]
    overheads = [(f"{r['system']} {r['interval'][0]['saver']}",
                  sorted((row["every"], 100 * row["overhead"]) for row in r["interval"]))
                 for r in results if r.get("interval")]
    scales = [(f"{r['system']} {saver}", [(row["ranks"], row["stall_seconds"] * 1e3) for row in r["scale"]
                                           if row["saver"] == saver and row.get("stall_seconds")])
              for r in results for saver in dict.fromkeys(row["saver"] for row in r.get("scale", []))]
    width, _ = interval_setting(a)
    return [
        line_plot("checkpoint-study-stall.png", [s for s in stalls if s[1]], xscale="log", yscale="log",
                  xlabel="state (MB)", ylabel="stall per checkpoint (ms)", title="Training stall per checkpoint (MLP)"),
        line_plot("checkpoint-study-interval.png", overheads, bound=3.5, xscale="log",
                  xlabel="checkpoint every k steps", ylabel="training time overhead (%)",
                  title=f"Overhead against the checkpoint interval (MLP, W={width})"),
        line_plot("checkpoint-study-scale.png", [s for s in scales if s[1]], yscale="log", xticks=SCALE_RANKS,
                  xlabel="data-parallel ranks", ylabel="stall per checkpoint (ms)",
                  title=f"Stall per checkpoint against ranks (MLP, W={scale_setting(a)[0]})"),
    ]


def report(results, a, images):
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    today = datetime.date.today().isoformat()
    cmd = "bench/run.sh study" + (" --quick" if a.quick else "")
    width, isteps = interval_setting(a)
    lines = [f"- Date: {today}; machine: {cpu_name()}, {os.cpu_count()} cores; command: `{cmd}`"
             " (driver: `bench/study/study.py`).",
             "- Versions: " + "; ".join(f"{r['system']} {r.get('version', '?')}" for r in results) + ".",
             "- Workload: the MLP (784-W-W/2-10) and LeNet-5 on Fashion-MNIST, batch 128, AdamW, 2 threads for"
             " the costs; W scales the MLP's state (weights and AdamW's two slots).",
             *[f"- {r['system']}: {r['status']}." for r in results if r["status"] != "ran"],
             *(["- Quick form: short cost cells, so steps/s and overheads are indicative only (a with-checkpoint"
                " figure can exceed the one without); the scale runs skip the runs without checkpoints and"
                " PyTorch's `torch.save` on rank 0."] if a.quick else []),
             "", "### Cost of a checkpoint every 10 steps", "",
             "| system | saver | model | W | state MB | steps/s without | steps/s with | stall per checkpoint (ms)"
             " | load (ms) | bytes on disk per byte of state |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for c in r["cost"]:
            lines.append(f"| {r['system']} | {c['saver']} | {c['model']} | {c['width']} | {c['state_bytes'] / 1e6:.1f}"
                         f" | {c['steps_per_s']:.1f} | {c['steps_per_s_with']:.1f} | {1e3 * c['stall_seconds']:.1f}"
                         f" | {1e3 * c['load_seconds']:.1f} | {c['bytes'] / c['state_bytes']:.3f} |")
    lines += ["", "Steadfast's stall is the in-memory snapshot (the files are written in the background); the"
              " frameworks' savers are synchronous, so their stall is the whole save. \"Steps/s with\" counts"
              " every system's stalls in its training time. Steadfast's load is"
              " `steadfast ckpt verify`, which reads every byte and checks every checksum; the frameworks' is a"
              " load into a fresh model and optimizer.", ""]
    if images:
        lines += [f"![stall against state size]({os.path.relpath(images[0], os.path.join(ROOT, 'docs'))})", ""]
    lines += [f"### Overhead against the checkpoint interval (MLP, W={width}, {isteps} steps)", "",
              "Training time with a checkpoint every k steps over the time without, minus one (one run per"
              " cell, against one run without checkpoints shared by the row).", "",
              "| system | saver | " + " | ".join(f"every {k}" for k in INTERVALS) + " |",
              "|---|---|" + "---|" * len(INTERVALS)]
    for r in results:
        if r.get("interval"):
            lines.append(f"| {r['system']} | {r['interval'][0]['saver']} | "
                         + " | ".join(f"{100 * row['overhead']:+.1f}%" for row in r["interval"]) + " |")
    if len(images) > 1:
        lines += ["", f"![overhead against interval]({os.path.relpath(images[1], os.path.join(ROOT, 'docs'))})"]
    sw, ssteps, severy = scale_setting(a)
    lines += ["", f"### Scale: 1, 2 and 4 data-parallel ranks (MLP, W={sw}, {ssteps} steps, a checkpoint every"
              f" {severy})", "",
              f"Each rank runs one thread and trains on an equal share of the global batch of 128. This machine has"
              f" {os.cpu_count()} cores, so ranks beyond {os.cpu_count()} share them: the table shows how each"
              " mechanism's cost moves as ranks are added, not a cluster's speed-up. The stall is the median over"
              " the checkpoints of the slowest rank's save (Steadfast: rank 0's snapshot); files and bytes are one"
              " checkpoint's; \"replicas agree\" checks that every rank ended with the same weights.", "",
              "| system | checkpoint | ranks | steps/s without | steps/s with | overhead | stall per checkpoint (ms)"
              " | files | MB on disk | replicas agree |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for row in r.get("scale", []):
            stall = f"{1e3 * row['stall_seconds']:.1f}" if row.get("stall_seconds") else "?"
            plain = row["steps_per_s"]
            without, overhead = (f"{plain:.1f}", f"{100 * (plain / row['steps_per_s_with'] - 1):+.0f}%") if plain else ("?", "?")
            lines.append(f"| {r['system']} | {row['saver']} | {row['ranks']} | {without}"
                         f" | {row['steps_per_s_with']:.1f} | {overhead}"
                         f" | {stall} | {row.get('files') or '?'} | {(row.get('bytes') or 0) / 1e6:.1f}"
                         f" | {yes(row['replicas agree'])} |")
    for r in results:
        for label, why in r.get("scale failed", {}).items():
            lines.append(f"| {r['system']} | {label} | failed: {why.replace('|', '/')} | | | | | | | |")
    if len(images) > 2:
        lines += ["", f"![stall against ranks]({os.path.relpath(images[2], os.path.join(ROOT, 'docs'))})"]
    lines += ["", "### Where a save's time goes (MLP, W=2048, cProfile)", "",
              "The functions with the most time of their own during the saves, as a share of the save time.", "",
              "| system | saver | top functions (own time) |", "|---|---|---|"]
    for r in results:
        for saver, top in r.get("profile", {}).items():
            cells = "; ".join(f"`{p['function']}` {100 * p['share']:.0f}%" for p in top[:4])
            lines.append(f"| {r['system']} | {saver} | {cells.replace('|', '/')} |")
    fields = ["weights", "optimizer state", "RNG", "data position", "step"]
    lines += ["", "### What a checkpoint holds (read back from the files)", "",
              "| system | saver | " + " | ".join(fields) + " |", "|---|---|" + "---|" * len(fields)]
    for r in results:
        for saver, held in r.get("contents", {}).items():
            lines.append(f"| {r['system']} | {saver} | " + " | ".join(yes(held[f]) for f in fields) + " |")
    lines += ["", "PyTorch's row is what `torch.save({model, optimizer, step})` holds, the form its tutorials use;"
              " TensorFlow's `tf.train.Checkpoint` row holds the step, model, optimizer and data iterator, as its"
              " checkpoint guide builds it; Chainer's is a trainer snapshot (`extensions.snapshot`).", "",
              "### Same training", "",
              "Each framework trained from Steadfast's initial weights on Steadfast's data order"
              " (`steadfast bench init`, `steadfast bench order`) with the same AdamW settings. The table gives"
              " ||w_framework - w_steadfast|| / ||w_steadfast - w_initial|| after 1 and 100 steps.", "",
              "| system | model | after 1 step | after 100 steps |", "|---|---|---|---|"]
    for r in results:
        for model, by_steps in r.get("same training", {}).items():
            cells = [f"{v:.2e}" if isinstance(v, float) else v for v in by_steps.values()]
            lines.append(f"| {r['system']} | {model} | " + " | ".join(cells) + " |")
    lines += ["", "### Cross-loading", "",
              "A Steadfast checkpoint's shard (a safetensors file) loaded into each framework's model; each"
              " framework's files read by `steadfast ckpt export`, their tensors matched against the framework's"
              " weights by value (layouts differ).", "", "| system | what | outcome |", "|---|---|---|"]
    for r in results:
        for what, outcome in r.get("cross-loading", {}).items():
            lines.append(f"| {r['system']} | {what} | {outcome.replace('|', '/')} |")
    lines += ["", "### Determinism of a restart", "",
              f"N = {N_RESTART} steps (past the first epoch of {PER_EPOCH} steps), checkpoint, a new process resumes"
              f" to N+M = {N_RESTART + M_RESTART} (past the second); are the final weights bit-identical to the"
              " uninterrupted run?", "",
              "| system | saver | model | threads | identical |", "|---|---|---|---|---|"]
    for r in results:
        for row in r["restart"]:
            what = yes(row["identical"]) + (f" (the resume failed: {row['failed']})" if "failed" in row else "")
            lines.append(f"| {r['system']} | {row['saver']} | {row['model']} | {row['threads']} |"
                         f" {what.replace('|', '/')} |")
    lines += ["", "### Integrity: a damaged checkpoint", "", "| system | saver | damage | at load |", "|---|---|---|---|"]
    for r in results:
        for saver, outcomes in r.get("integrity", {}).items():
            for damage, what in outcomes.items():
                lines.append(f"| {r['system']} | {saver} | {damage} | {what.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small widths and runs (minutes)")
    ap.add_argument("--only", choices=["steadfast", "pytorch", "tensorflow", "chainer"], help="run one system's side")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "checkpoint-study.md"),
                    help="the report whose measured section is rewritten (not with --only)")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: cargo build --release")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if a.only in (None, "steadfast"):
            results.append(steadfast_side(a, tmp))
        frameworks = [s for s in VENVS if a.only in (None, s.lower())]
        if frameworks:
            refs, shard, ours = references(tmp, a)
            for system in frameworks:
                print(f"{system}...", file=sys.stderr)
                results.append(framework_side(system, a, tmp, refs, shard, ours))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    images = plots(results, a, os.path.join(ROOT, "docs", "img")) if a.only is None else []
    text = report(results, a, images)
    print(text)
    if a.only is None:
        write_section(a.doc, "study", "<!-- study:start -->\n" + text + "<!-- study:end -->")


if __name__ == "__main__":
    main()
