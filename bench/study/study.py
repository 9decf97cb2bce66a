"""The checkpoint/restart study: the same training checkpointed in each system, compared
on cost, size and contents, determinism of a restart, and integrity.

    bench/run.sh study            # the whole study; rewrites docs/checkpoint-study.md
    bench/run.sh study --quick    # a small form (minutes)
    python3 bench/study/study.py --quick --only steadfast --json OUT   # the Steadfast side alone

The workload is the MLP (784-W-W/2-10, ReLU) on Fashion-MNIST, batch 128, AdamW, with W
scaling the state. Each system checkpoints the way its users do: Steadfast with its own
checkpoints (`--checkpoint-every`), PyTorch with `torch.save` of the state dicts and with
`torch.distributed.checkpoint` (bench/study/torch_side.py). TensorFlow and Chainer have no
side yet; the report says so.

Per system it measures:
- cost: training steps/s without and with a checkpoint every K steps, the stall per
  checkpoint (the time training waits), the time to load (Steadfast: `ckpt verify`, which
  reads and checks every byte), bytes on disk per byte of state;
- contents: what the checkpoint holds (read back from the files);
- determinism: N steps, checkpoint, a new process resumes and trains to N+M: are the final
  weights those of an uninterrupted N+M run? N crosses an epoch boundary (468 steps);
- integrity: one bit flipped in the middle of the largest file, and the file truncated to
  half: does loading notice?
"""
import argparse, datetime, json, math, os, platform, shutil, statistics, subprocess, sys, tempfile, time

from damage import KINDS, damaged_copy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("STEADFAST_BIN", os.path.join(ROOT, "target", "release", "steadfast"))
VENV_PY = os.path.join(ROOT, "bench", ".venv", "bin", "python")
PER_EPOCH = 60000 // 128


def sh(cmd, env=None, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, env=dict(os.environ, **(env or {})))


# ---------------------------------------------------------------- Steadfast


def sf_train(out, width, steps, threads, extra=()):
    """Runs `steadfast train` and returns (summary, checkpoint lines) of its metrics."""
    cmd = [BIN, "train", "--model", "mlp", "--width", str(width), "--steps", str(steps), "--eval-every", "0",
           "--eval-limit", "1", "--out", out, *extra]
    sh(cmd, {"RAYON_NUM_THREADS": str(threads)})
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return [l for l in lines if l["kind"] == "summary"][-1], [l for l in lines if l["kind"] == "checkpoint"]


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def newest(root):
    return os.path.join(root, sorted(d for d in os.listdir(root) if d.startswith("step-"))[-1])


def steadfast_cost(tmp, width, steps, every, threads):
    plain, _ = sf_train(os.path.join(tmp, "plain"), width, steps, threads)
    root = os.path.join(tmp, "ckpt")
    shutil.rmtree(root, ignore_errors=True)
    summary, ckpts = sf_train(os.path.join(tmp, "with"), width, steps, threads,
                              ["--checkpoint-every", str(every), "--checkpoint-dir", root, "--keep-last", "1"])
    last = newest(root)
    t = time.perf_counter()
    sh([BIN, "ckpt", "verify", last])
    load = time.perf_counter() - t
    inspect = json.loads(sh([BIN, "ckpt", "inspect", "--json", last]).stdout)
    state = sum(4 * math.prod(t["shape"]) for t in inspect["manifest"]["tensors"])
    return {
        "steps_per_s": steps / plain["train_seconds"],
        "steps_per_s_with": steps / summary["train_seconds"],
        "stall_seconds": statistics.median(c["stall_seconds"] for c in ckpts),
        "load_seconds": load,
        "bytes": dir_bytes(last),
        "state_bytes": state,
    }


def steadfast_contents(tmp):
    root = os.path.join(tmp, "contents")
    sf_train(os.path.join(tmp, "c"), 256, 3, 1, ["--checkpoint-every", "3", "--checkpoint-dir", root])
    m = json.loads(sh([BIN, "ckpt", "inspect", "--json", root]).stdout)["manifest"]
    roles = sorted({t["role"] for t in m["tensors"]})
    meta = m["meta"]
    return {
        "weights": "model" in roles,
        "optimizer state": any(r.startswith("optim") for r in roles) and "optimizer.updates" in meta.get("scalars", {}),
        "RNG": "rng" in meta,
        "data position": "data_cursor" in meta,
        "step": "step" in meta,
    }


def steadfast_restart(tmp, width, n, m, threads):
    whole, _ = sf_train(os.path.join(tmp, "whole"), width, n + m, threads)
    root = os.path.join(tmp, "restart")
    shutil.rmtree(root, ignore_errors=True)
    sf_train(os.path.join(tmp, "first"), width, n, threads, ["--checkpoint-every", str(n), "--checkpoint-dir", root])
    resumed, _ = sf_train(os.path.join(tmp, "second"), width, n + m, threads,
                          ["--checkpoint-dir", root, "--resume", "latest"])
    return {"identical": whole["fingerprint"] == resumed["fingerprint"], "uninterrupted": whole["fingerprint"],
            "resumed": resumed["fingerprint"]}


def steadfast_integrity(tmp):
    root = os.path.join(tmp, "integrity")
    sf_train(os.path.join(tmp, "i"), 256, 3, 1, ["--checkpoint-every", "3", "--checkpoint-dir", root])
    clean = newest(root)
    out = {}
    for damage in KINDS:
        bad = os.path.join(tmp, damage.replace(" ", "-"))
        damaged_copy(clean, bad, damage)
        r = sh([BIN, "ckpt", "verify", bad], check=False)
        said = (r.stdout + r.stderr).strip().splitlines()
        said = [l for l in said if "corrupt" in l.lower() or "error" in l.lower()] or said
        out[damage] = (f"refused: {said[0][:160]}" if r.returncode != 0 else "loaded silently") if said else "?"
    return out


def steadfast_side(a, tmp):
    widths = [256, 2048] if a.quick else [256, 1024, 4096, 12000]
    steps = 60 if a.quick else 300
    out = {"system": "Steadfast", "version": sh([BIN, "--version"]).stdout.split()[-1], "cost": {}, "restart": {}}
    for w in widths:
        out["cost"][w] = steadfast_cost(tmp, w, steps, 10, 2)
    out["contents"] = steadfast_contents(tmp)
    n, m = (PER_EPOCH + 20, 20) if a.quick else (PER_EPOCH + 32, 100)
    for threads in [1, 2]:
        out["restart"][threads] = steadfast_restart(tmp, 256, n, m, threads)
    out["integrity"] = steadfast_integrity(tmp)
    return out


# ---------------------------------------------------------------- PyTorch


def torch_run(*args):
    r = sh([VENV_PY, os.path.join(ROOT, "bench", "study", "torch_side.py"), *map(str, args)])
    return json.loads(r.stdout.strip().splitlines()[-1])


def torch_side(a, tmp):
    widths = [256, 2048] if a.quick else [256, 1024, 4096, 12000]
    steps = 60 if a.quick else 300
    out = {"system": "PyTorch", "cost": {}, "restart": {}, "integrity": {}}
    for saver in ["torch.save", "dcp"]:
        for w in widths:
            d = tempfile.mkdtemp(dir=tmp)
            plain = torch_run("cost", "--width", w, "--steps", steps, "--every", steps + 1, "--threads", 2, "--dir", d)
            r = torch_run("cost", "--width", w, "--steps", steps, "--every", 10, "--saver", saver, "--threads", 2, "--dir", d)
            out["version"] = r["torch"]
            out["cost"][f"{saver} {w}"] = {
                "steps_per_s": steps / sum(plain["step_seconds"]),
                "steps_per_s_with": steps / (sum(r["step_seconds"]) + sum(r["save_seconds"])),
                "stall_seconds": statistics.median(r["save_seconds"]),
                "load_seconds": r["load_seconds"],
                "bytes": r["bytes"],
                "state_bytes": r["state_bytes"],
            }
        out["integrity"][saver] = torch_run("integrity", "--saver", saver, "--dir", tempfile.mkdtemp(dir=tmp))
    out["contents"] = torch_run("contents", "--dir", tempfile.mkdtemp(dir=tmp))
    n, m = (PER_EPOCH + 20, 20) if a.quick else (PER_EPOCH + 32, 100)
    for threads in [1, 2]:
        for rng in [False, True]:
            flag = ["--with-rng"] if rng else []
            whole = torch_run("run", "--steps", n + m, "--threads", threads, *flag)
            ck = os.path.join(tempfile.mkdtemp(dir=tmp), "r.pt")
            torch_run("run", "--steps", n, "--save-at", n, "--dir", ck, "--threads", threads, *flag)
            resumed = torch_run("run", "--steps", n + m, "--resume", ck, "--threads", threads, *flag)
            out["restart"][f"{threads} {'with the epoch RNG' if rng else 'as users save'}"] = {
                "identical": whole["weights_sha256"] == resumed["weights_sha256"]}
    return out


# ---------------------------------------------------------------- report


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def report(results, a):
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    today = datetime.date.today().isoformat()
    cmd = "bench/run.sh study" + (" --quick" if a.quick else "")
    lines = ["# The checkpoint/restart study", "",
             f"- Date: {today}; machine: {cpu_name()}, {os.cpu_count()} cores; command: `{cmd}`"
             " (driver: `bench/study/study.py`).",
             "- Versions: " + "; ".join(f"{r['system']} {r.get('version', '?')}" for r in results) + ".",
             "- Workload: the MLP (784-W-W/2-10) on Fashion-MNIST, batch 128, AdamW, 2 threads for the costs;"
             " W scales the state (weights and AdamW's two slots).",
             "- TensorFlow/Keras and Chainer: not run. Their sides of the study are not written yet.",
             *(["- Quick form: 60 steps per cost cell, so its steps/s are indicative only (a with-checkpoint"
                " figure can exceed the one without)."] if a.quick else []),
             "",
             "## Cost of a checkpoint every 10 steps", "",
             "| system | saver | W | state MB | steps/s without | steps/s with | stall per checkpoint (ms)"
             " | load (ms) | bytes on disk per byte of state |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for key, c in r["cost"].items():
            saver, w = (key.split(" ") if " " in str(key) else ("own", key))
            lines.append(f"| {r['system']} | {saver} | {w} | {c['state_bytes'] / 1e6:.1f} | {c['steps_per_s']:.1f} |"
                         f" {c['steps_per_s_with']:.1f} | {1e3 * c['stall_seconds']:.1f} | {1e3 * c['load_seconds']:.1f} |"
                         f" {c['bytes'] / c['state_bytes']:.3f} |")
    lines += ["", "Steadfast's stall is the in-memory snapshot (the files are written in the background); PyTorch's"
              " savers are synchronous, so the stall is the whole save. Steadfast's load is `steadfast ckpt verify`,"
              " which reads every byte and checks every checksum.", "",
              "## What a checkpoint holds (read back from the files)", "",
              "| system | " + " | ".join(results[0]["contents"]) + " |",
              "|---|" + "---|" * len(results[0]["contents"])]
    for r in results:
        lines.append(f"| {r['system']} | " + " | ".join(yes(v) for v in r["contents"].values()) + " |")
    lines += ["", "PyTorch's row is what `torch.save({model, optimizer, step})` holds, the form its tutorials use:"
              " the keys of the dict that `torch.load` gives back. Whether a damaged file is noticed is the"
              " integrity table's subject.", "",
              "## Determinism of a restart", "",
              f"N steps (past the first epoch of {PER_EPOCH} steps), checkpoint, a new process resumes to N+M; are the"
              " final weights bit-identical to the uninterrupted run?", "",
              "| system | threads / what was saved | identical |", "|---|---|---|"]
    for r in results:
        for key, v in r["restart"].items():
            lines.append(f"| {r['system']} | {key} | {yes(v['identical'])} |")
    lines += ["", "## Integrity: a damaged checkpoint", "", "| system | saver | damage | at load |", "|---|---|---|---|"]
    for r in results:
        integ = r["integrity"]
        per_saver = integ if all(isinstance(v, dict) for v in integ.values()) else {"own": integ}
        for saver, outcomes in per_saver.items():
            for damage, what in outcomes.items():
                lines.append(f"| {r['system']} | {saver} | {damage} | {what.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small widths and runs (minutes)")
    ap.add_argument("--only", choices=["steadfast", "pytorch"], help="run one system's side")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "checkpoint-study.md"),
                    help="the report to rewrite (not written with --only)")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} is missing: cargo build --release")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if a.only in (None, "steadfast"):
            results.append(steadfast_side(a, tmp))
        if a.only in (None, "pytorch"):
            results.append(torch_side(a, tmp))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    text = report(results, a)
    print(text)
    if a.only is None:
        with open(a.doc, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
