"""The SDC study on the frameworks it studied: checkpoint alteration in PyTorch DDP and
Horovod jobs, beside Steadfast's own campaigns on the same models and faults.

    bench/run.sh sdc-study            # 304 trials per library and model; rewrites docs/sdc-study.md
    bench/run.sh sdc-study --quick    # 40 per library and model (under 10 minutes once installed);
                                      # its report goes to bench/out/sdc-study-quick/report.md

The frameworks run from their own virtual environment, `bench/.venv-horovod`, installed here
at pinned versions (`PINS`): PyTorch 2.0.1, the newest PyTorch that Horovod 0.28.1 (the
newest Horovod on PyPI) builds against; DDP runs there too, so both libraries share one
PyTorch. If Horovod cannot be built, pip's last words are recorded and the study goes on
with DDP alone.

For each library, model (the MLP and LeNet-5 on Fashion-MNIST, batch 128, AdamW) and world
(2 and 4 processes), one job runs the golden run and then every trial of the plan
(`verdict.plan`): checkpoint at step 200 or 400 as the library's users save one, alter a
copy with `steadfast inject` (model or optimizer tensors; sign, exponent or mantissa bits;
1 or 10 flips), resume with the library's idiom, train 50 (MLP) or 30 (CNN) steps on, and
judge against golden (`verdict.judge`). Both libraries see the same faults: inject's draws
depend on the seed and the tensors' shapes, not their values. Steadfast's side runs
`steadfast campaign` with the same knobs on the same models.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time

import verdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
from common import cpu_name, last_words, write_section  # noqa: E402

BIN = os.environ.get("STEADFAST_BIN", os.path.join(ROOT, "target", "release", "steadfast"))
VENV = os.path.join(ROOT, "bench", ".venv-horovod")
OUT = os.path.join(ROOT, "bench", "out", "sdc-study")
DOC = os.path.join(ROOT, "docs", "sdc-study.md")
IMG = os.path.join(ROOT, "docs", "img")
WORKER = os.path.join(HERE, "worker.py")

# What the study installs, in order (a list is one pip install). Horovod 0.28.1 compiles
# with C++14; PyTorch from 2.1 needs C++17 in extensions that include it, so 2.0.1 is the
# newest that Horovod's release builds against (PyTorch 2.15 fails with "C++20 or later
# compatible compiler is required"). CMake below 4: Horovod's CMakeLists predate 3.5.
PINS = [["torch==2.0.1", "numpy==1.26.4", "cmake==3.31.10", "wheel"]]
HOROVOD = "horovod[pytorch]==0.28.1"
HOROVOD_ENV = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1",
               "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_CPU_OPERATIONS": "GLOO",
               "MAKEFLAGS": f"-j{os.cpu_count() or 2}"}

# Steps trained after the resume, as in Steadfast's campaigns (examples/campaign-*.toml).
MODELS = {"mlp": {"steps_after": 50}, "cnn": {"steps_after": 30}}
INJECT_AT = [200, 400]
WORLDS = [2, 4]
LIBRARIES = ["ddp", "horovod"]
NAMES = {"ddp": "PyTorch DDP", "horovod": "Horovod", "horovod-nofusion": "Horovod, fusion off",
         "steadfast-det": "Steadfast (deterministic)", "steadfast-repro": "Steadfast (reproducible)"}
# The parameters in the optimizer's order, to name `optimizer.state.I.*` tensors.
PARAMS = {"mlp": [f"fc{i}.{w}" for i in (1, 2, 3) for w in ("weight", "bias")],
          "cnn": [f"{l}.{w}" for l in ("conv1", "conv2", "fc1", "fc2", "fc3") for w in ("weight", "bias")]}
# Seconds a trial may take before its job is taken as hung (generous: 4 ranks on 2 cores).
TRIAL_BUDGET = {"mlp": 15, "cnn": 30}


def job_error(text):
    """What killed a job: the first exception a worker printed (launchers print their own
    summary last; a peer's lost connection is a consequence), else the output's last lines."""
    import re
    found = []
    for line in (text or "").splitlines():
        m = re.match(r"^(?:\[\d+\]<std(?:err|out)>:|\[rank\d+\]:)?\s*([\w.]*(?:Error|Exception): .*)", line)
        if m and "ChildFailedError" not in m.group(1):
            found.append(m.group(1)[:400])
    consequences = ("Connection closed", "Connection reset", "Horovod has been shut down",
                    "Horovod detected that one or more processes exited")
    causes = [e for e in found if not any(c in e for c in consequences)]
    if not causes:
        # A rank killed from outside prints nothing; its launcher says how it ended.
        # (A launcher stops the surviving ranks with SIGTERM: that is not the cause.)
        import signal
        signals = []
        for m in re.finditer(r"Signal \d+ \((SIG\w+)\)|exit with status code (\d+)", text or ""):
            if m.group(1):
                signals.append(m.group(1))
            elif int(m.group(2)) > 128:  # the shell's 128 + signal
                n = int(m.group(2)) - 128
                signals.append(signal.Signals(n).name if n in signal.valid_signals() else str(n))
        killed = [g for g in signals if g != "SIGTERM"]
        if signals:
            return f"a rank was killed by signal {(killed or signals)[0]}"
    return (causes or found or [last_words(text, 3)])[0]


def ensure_env(log):
    """The study's environment: returns (python, horovod_error or None)."""
    py = os.path.join(VENV, "bin", "python")
    env = dict(os.environ, PATH=os.path.join(VENV, "bin") + os.pathsep + os.environ["PATH"], **HOROVOD_ENV)
    if not (os.path.exists(py) and run([py, "-c", "import torch, numpy"]).returncode == 0):
        run([sys.executable, "-m", "venv", VENV], check=True)
        for packages in PINS:
            r = run([py, "-m", "pip", "install", "-q", *packages])
            if r.returncode != 0:
                raise SystemExit("pip install " + " ".join(packages) + " failed: " + last_words(r.stderr, 3))
    if run([py, "-c", "import horovod.torch"]).returncode == 0:
        return py, None
    print(f"building {HOROVOD} (several minutes) ...", flush=True)
    r = run([py, "-m", "pip", "install", "--no-build-isolation", "--no-cache-dir", HOROVOD], env=env)
    with open(log, "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        return py, f"pip install {HOROVOD} failed: {last_words(r.stderr, 3)}"
    probe = run([py, "-c", "import horovod.torch"])
    return py, None if probe.returncode == 0 else f"installed but does not import: {last_words(probe.stderr, 3)}"


def run(cmd, env=None, check=False, timeout=None, cwd=None):
    return subprocess.run(cmd, env=env, check=check, timeout=timeout, cwd=cwd, capture_output=True, text=True)


def descendants(pid):
    """The processes below `pid`, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def run_job(cmd, env, stall, progress=lambda: 0):
    """Runs a job in its own process group; returns None if it succeeded, else what ended
    it. A job whose `progress()` (say, trials recorded) stays put for `stall` seconds is
    taken as hung (a rank stopped, a collective waiting for ever) and killed, its whole
    group with it (a launcher's workers too)."""
    import signal
    import tempfile
    with tempfile.TemporaryFile("w+") as log:
        p = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        seen, since = progress(), time.time()
        hung = False
        while p.poll() is None:
            time.sleep(0.5)
            now = progress()
            if now != seen:
                seen, since = now, time.time()
            elif time.time() - since > stall:
                hung = True
                break
        # A hung job, or stragglers of a finished launcher. torchrun starts each rank in a
        # session of its own, so the group is not enough: every descendant goes.
        for pid in [p.pid, *descendants(p.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()
        log.seek(0)
        out = log.read()
    if hung:
        return f"no progress for {stall} s"
    return None if p.returncode == 0 else job_error(out)


def launch(library, py, world, args):
    """The command that starts a job as the library's users start one."""
    if library == "ddp":
        return [py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", WORKER, *args]
    return [os.path.join(VENV, "bin", "horovodrun"), "-np", str(world), "--gloo", "-H", f"localhost:{world}",
            py, WORKER, *args]


def job_env(py):
    return dict(os.environ, PATH=os.path.dirname(py) + os.pathsep + os.environ["PATH"], OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1")


def records_size(job_dir):
    """Bytes of trial records so far: grows with every trial a job finishes."""
    return sum(os.path.getsize(os.path.join(job_dir, n)) for n in os.listdir(job_dir) if n.startswith("trials-rank"))


def spent(cell_dir, seconds):
    """Adds `seconds` to the time a cell's runs have taken (its `elapsed.json`), so that a
    report made by a later run that reuses the cell still says what the whole study cost."""
    path = os.path.join(cell_dir, "elapsed.json")
    before = json.load(open(path))["seconds"] if os.path.exists(path) else 0.0
    with open(path, "w") as f:
        json.dump({"seconds": before + seconds}, f)


def elapsed(out):
    """Seconds that every cell under `out` has taken, over all the runs that built them."""
    total = 0.0
    for root, _, files in os.walk(out):
        if "elapsed.json" in files:
            with open(os.path.join(root, "elapsed.json")) as f:
                total += json.load(f)["seconds"]
    return total


def run_cell(library, py, model, world, plan, out, extra=(), env=None):
    """The golden run and every trial of one (library, model, world); returns the verdicts.
    A job that dies or hangs marks the trial in flight crashed and a new job takes the rest.
    `extra`: more arguments for the worker (a smaller model, another data directory);
    `env`: more environment for the job."""
    job = dict(job_env(py), **(env or {}))
    began = time.time()
    os.makedirs(out, exist_ok=True)
    plan_path = os.path.join(out, "plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f)
    common = ["--library", library, "--model", model, "--plan", plan_path, "--out", out, "--steadfast", BIN, *extra]
    if not os.path.exists(os.path.join(out, f"golden-rank{world - 1}.json")):
        error = run_job(launch(library, py, world, common + ["--golden"]), job, 900)
        if error:
            raise RuntimeError(f"{library} {model} x{world}: the golden run failed: {error}")
    digests = set()
    for r in range(world):
        with open(os.path.join(out, f"golden-rank{r}.json")) as f:
            digests.add(json.load(f)["digest"])
    if len(digests) != 1:
        raise RuntimeError(f"{library} {model} x{world}: the golden run's replicas ended apart ({sorted(digests)})")
    trials = plan["trials"]
    crash_log = os.path.join(out, "crashes.json")
    crashes = {int(k): e for k, e in json.load(open(crash_log)).items()} if os.path.exists(crash_log) else {}
    start, stalled = 0, 0
    while True:
        done = verdict.read_records(out)
        complete = lambda t: len(done.get(t["index"], {})) == world  # noqa: E731
        pending = [t["index"] for t in trials if t["index"] >= start and not complete(t) and t["index"] not in crashes]
        if not pending:
            break
        first = pending[0]
        # A job starts (data, golden references) and then records trial after trial.
        stall = 60 + TRIAL_BUDGET[model]
        r = run_job(launch(library, py, world, common + ["--trials", f"{first}:{len(trials)}"]), job, stall,
                    lambda: records_size(out))
        done = verdict.read_records(out)
        stuck = next((t["index"] for t in trials if t["index"] >= first and not complete(t)), None)
        if stuck is None:
            break
        error = r or f"the job ended without a record of trial {stuck}"
        # A job that cannot even finish its first trial three times over is broken, not
        # its trials.
        stalled = stalled + 1 if stuck == first else 0
        if stalled > 2:
            raise RuntimeError(f"{library} {model} x{world}: jobs keep failing at trial {stuck}: {error}")
        crashes[stuck] = error
        with open(crash_log, "w") as f:
            json.dump(crashes, f)
        start = stuck + 1
    spent(out, time.time() - began)
    done = verdict.read_records(out)
    return [verdict.judge(t, done.get(t["index"], {}), world, crashes.get(t["index"])) for t in trials]


def campaign_spec(model, replicas, bits, flips, count, seed):
    """A Steadfast campaign with the study's knobs: one bit class and flip count, weights or
    AdamW moments, injected at step 200 or 400 (the campaign draws which)."""
    return f"""[run]
model = "{model}"
data = "fashion-mnist"
batch = 128
micro_batch = 32
replicas = {replicas}
reduce = ["deterministic", "reproducible"]
eval_examples = 2000

[trials]
count = {count}
seed = {seed}
inject_at = {INJECT_AT}
steps_after = {MODELS[model]['steps_after']}
state = ["param", "optim"]
bits = "{bits}"
flips = {flips}
burst = 1

[detect]
fingerprint_every = 1
response = "observe"
"""


def steadfast_cell(model, placement, world, n, out):
    """Steadfast's campaigns for one (model, placement): `all` is one replica holding the
    altered state (every replica equal, as after a shared checkpoint), `one` is `world`
    replicas of which one is altered. Returns verdicts per reduction, in the study's terms."""
    import csv
    replicas = 1 if placement == "all" else world
    combos = [(b, c) for b in verdict.BIT_CLASSES for c in (1, 10)]
    per = max(1, -(-n // len(combos)))
    verdicts = {"steadfast-det": [], "steadfast-repro": []}
    for j, (bits, flips) in enumerate(combos):
        d = os.path.join(out, f"{model}-{placement}-r{replicas}-{bits}-{flips}")
        if not os.path.exists(os.path.join(d, "trials.csv")):
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            spec = os.path.join(d, "spec-in.toml")
            with open(spec, "w") as f:
                f.write(campaign_spec(model, replicas, bits, flips, per, seed=1 + j))
            began = time.time()
            r = run([BIN, "campaign", spec, "--out", d], timeout=3600)
            if r.returncode != 0:
                raise RuntimeError(f"steadfast campaign {spec}: {last_words(r.stderr, 3)}")
            spent(d, time.time() - began)
        steps = {}
        with open(os.path.join(d, "steps.csv")) as f:
            for row in csv.DictReader(f):
                steps.setdefault((row["trial"], row["reduce"]), {})[int(row["step"])] = [
                    int(x) for x in row["differing"].split(";") if x]
        with open(os.path.join(d, "trials.csv")) as f:
            for row in csv.DictReader(f):
                key = "steadfast-det" if row["reduce"] == "deterministic" else "steadfast-repro"
                s0 = int(row["step"])
                per_step = steps.get((row["trial"], row["reduce"]), {})
                alarms = [k[len("alarm_"):] for k, v in row.items() if k.startswith("alarm_") and v]
                verdicts[key].append({
                    "index": int(row["trial"]), "placement": placement, "bits": bits, "count": flips,
                    "kind": "model" if row["state"] == "param" else "optimizer", "inject_at": s0,
                    "outcome": row["outcome"], "bitwise_golden": row["bitwise_golden"] == "true",
                    "elements": {o: per_step[s0 + o] for o in (1, 2, 5, 10, 20) if s0 + o in per_step},
                    "alarms": alarms, "tensor": row["tensor"]})
    return verdicts


# ---------------------------------------------------------------- report

def select(results, lib, model, placement, altered=False, judged=False):
    """One library's verdicts on one model over both worlds, in one placement; only the
    altered trials (controls left out) and only those judged (not crashed) if asked."""
    return [v for (l, m, _), vs in results.items() if l == lib and m == model for v in vs
            if v["placement"] == placement and (v["count"] or not altered)
            and (v["outcome"] != "crashed" or not judged)]


def pct(k, n):
    return f"{k}/{n} ({100 * k / n:.1f}%)" if n else "-"


def harm_cell(vs):
    n = len(vs)
    k = sum(1 for v in vs if v["outcome"] != "masked")
    lo, hi = verdict.wilson(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.0f}-{100 * hi:.0f}]" if n else "-"


def outcome_row(name, vs):
    c = verdict.counts(vs)
    n = len(vs)
    return f"| {name} | {n} | " + " | ".join(str(c.get(o, 0)) for o in verdict.OUTCOMES) + f" | {harm_cell(vs)} |"


def report(results, meta, quick, img):
    """The generated part of docs/sdc-study.md, and its plots."""
    lines = ["<!-- sdc-study:start -->", "",
             f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores), Python {meta['python']}, "
             f"PyTorch {meta['torch']}, Horovod {meta['horovod']}; Steadfast at `{meta['commit']}`. "
             f"Command: `bench/run.sh sdc-study{' --quick' if quick else ''}` "
             f"({meta['minutes']:.0f} minutes: the cells' own run times, summed). Raw verdicts: `bench/out/sdc-study/verdicts.json`.", ""]
    if meta.get("horovod_error"):
        lines += [f"**Horovod could not run here**: {meta['horovod_error']}", ""]
    libs = [l for l in LIBRARIES + ["steadfast-det", "steadfast-repro"] if any(k[0] == l for k in results)]
    for model in MODELS:
        lines += [f"### {model.upper()}: outcomes", "",
                  "Harmful = not masked; the bracket is its 95% Wilson interval. `all`: every replica "
                  "resumes from the altered checkpoint; `one`: one replica's copy is altered.", "",
                  "| library | placement | trials | masked | degraded | diverged | crashed | harmful |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for lib in libs:
            for placement in ("all", "one"):
                vs = select(results, lib, model, placement, altered=True)
                if vs:
                    lines.append(outcome_row(f"{NAMES[lib]} | {placement}", vs).replace("| ", "| ", 1))
        lines += ["", f"### {model.upper()}: harmful share by kind of state, bit class and flips (placement `all`)", "",
                  "| library | model | optimizer | sign | exponent | mantissa | 1 flip | 10 flips |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for lib in libs:
            vs = select(results, lib, model, "all", altered=True)
            if not vs:
                continue
            cells = [harm_cell([v for v in vs if v["kind"] == k]) for k in verdict.KINDS]
            cells += [harm_cell([v for v in vs if v["bits"] == b]) for b in verdict.BIT_CLASSES]
            cells += [harm_cell([v for v in vs if v["count"] == c]) for c in (1, 10)]
            lines.append(f"| {NAMES[lib]} | " + " | ".join(cells) + " |")
        lines += ["", f"### {model.upper()}: harmful trials by kind of state and bit class (placement `all`)", "",
                  "| library | " + " | ".join(f"{k} {b}" for k in verdict.KINDS for b in verdict.BIT_CLASSES) + " |",
                  "|---|" + "---:|" * (len(verdict.KINDS) * len(verdict.BIT_CLASSES))]
        for lib in libs:
            vs = select(results, lib, model, "all", altered=True)
            cells = []
            for k in verdict.KINDS:
                for b in verdict.BIT_CLASSES:
                    sub = [v for v in vs if v["kind"] == k and v["bits"] == b]
                    cells.append(f"{sum(v['outcome'] != 'masked' for v in sub)}/{len(sub)}")
            if vs:
                lines.append(f"| {NAMES[lib]} | " + " | ".join(cells) + " |")
        lines += ["", f"### {model.upper()}: by world size (placement `all`, harmful share)", "",
                  "| library | " + " | ".join(f"{w} processes" for w in WORLDS) + " |",
                  "|---|" + "---:|" * len(WORLDS)]
        for lib in LIBRARIES:
            row = [harm_cell([v for v in results.get((lib, model, w), []) if v["placement"] == "all" and v["count"]])
                   for w in WORLDS]
            if any(c != "-" for c in row):
                lines.append(f"| {NAMES[lib]} | " + " | ".join(row) + " |")
        lines += ["", f"### {model.upper()}: spread over the steps after the resume", "",
                  "Median over altered trials (placement `all`) of the elements of model and optimizer state "
                  "that differ from golden in the worst replica: in any bit / by more than 1% "
                  "(Steadfast's campaign counts the first only, from step 1).", ""]
        offsets = sorted({int(o) for (l, m, w), vv in results.items() if m == model for v in vv
                          for o in v.get("elements", {})})
        lines += ["| library | " + " | ".join(f"+{o}" for o in offsets) + " |", "|---|" + "---:|" * len(offsets)]
        for lib in libs:
            vs = select(results, lib, model, "all", judged=True)
            if not vs:
                continue
            any_bits = verdict.spread_over_steps(vs, "elements")
            far = verdict.spread_over_steps(vs, "large") if "large" in vs[0] else {}
            cells = []
            for o in offsets:
                a = f"{any_bits[o][0]:.0f}" if o in any_bits else "-"
                b = f" / {far[o][0]:.0f}" if o in far else ""
                cells.append(a + b)
            lines.append(f"| {NAMES[lib]} | " + " | ".join(cells) + " |")
        lines += ["", f"### {model.upper()}: replicas reached when one replica's copy is altered", "",
                  "| library | trials | altered replica reached others by the end | replicas equal at the end | "
                  "bits equal to golden at the end |", "|---|---:|---:|---:|---:|"]
        for lib in LIBRARIES:
            vs = select(results, lib, model, "one", altered=True, judged=True)
            if vs:
                reached = sum(1 for v in vs if v["ranks_reached_at_end"] > 1)
                equal = sum(1 for v in vs if v["replicas_equal_at_end"])
                golden = sum(1 for v in vs if v["bitwise_golden"])
                lines.append(f"| {NAMES[lib]} | {len(vs)} | {pct(reached, len(vs))} | {pct(equal, len(vs))} | "
                             f"{pct(golden, len(vs))} |")
        for lib in ("steadfast-det", "steadfast-repro"):
            vs = select(results, lib, model, "one")
            if vs:
                caught = sum(1 for v in vs if "fingerprint" in v["alarms"])
                lines.append(f"| {NAMES[lib]} | {len(vs)} | (the replica fingerprint named the altered replica "
                             f"in {pct(caught, len(vs))}) | - | {pct(sum(v['bitwise_golden'] for v in vs), len(vs))} |")
        lines += ["", f"### {model.upper()}: which tensors the corruption reaches", "",
                  "Share of altered trials (placement `all`) in which a tensor holds an element off by more "
                  "than 1% from golden's, one step after the resume and at the end of the window.", ""]
        hdr = [l for l in LIBRARIES if (l, model, WORLDS[0]) in results]
        lines += ["| tensor | " + " | ".join(f"{NAMES[l]} +1 | {NAMES[l]} end" for l in hdr) + " |",
                  "|---|" + "---:|---:|" * len(hdr)]
        reach = {}
        for lib in hdr:
            vs = select(results, lib, model, "all")
            reach[lib] = (verdict.far_reach(vs, 1), verdict.far_reach(vs, -1))
        names = sorted({t for a, b in reach.values() for t in list(a) + list(b)},
                       key=lambda t: (not t.startswith("model."), t))
        for t in names:
            cells = [f"{100 * reach[l][0].get(t, 0):.0f}% | {100 * reach[l][1].get(t, 0):.0f}%" for l in hdr]
            lines.append(f"| `{t}`{param_of(model, t)} | " + " | ".join(cells) + " |")
        lines += ["", f"### {model.upper()}: tensors hit", "",
                  "Per tensor: altered trials (placement `all`) whose flips hit it, and the harmful share of those.", "",
                  "| tensor | " + " | ".join(NAMES[l] for l in LIBRARIES if (l, model, WORLDS[0]) in results) + " |",
                  "|---|" + "---:|" * sum(1 for l in LIBRARIES if (l, model, WORLDS[0]) in results)]
        tensors = sorted({t for (l, m, w), vv in results.items() if m == model and l in LIBRARIES
                          for v in vv for t in v.get("flipped_tensors", [])})
        for t in tensors:
            cells = []
            for lib in LIBRARIES:
                if (lib, model, WORLDS[0]) not in results:
                    continue
                vs = [v for v in select(results, lib, model, "all") if t in v.get("flipped_tensors", [])]
                cells.append(f"{len(vs)}: {harm_cell(vs)}" if vs else "-")
            lines.append(f"| `{t}`{param_of(model, t)} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["### Controls: a resume from the unaltered checkpoint", "",
              "| library | model | world | trials | bits equal to golden at the end |", "|---|---|---:|---:|---:|"]
    for (lib, model, world), vs in sorted(results.items()):
        ctl = [v for v in vs if not v["count"]]
        if ctl:
            lines.append(f"| {NAMES[lib]} | {model} | {world} | {len(ctl)} | "
                         f"{pct(sum(1 for v in ctl if v['bitwise_golden']), len(ctl))} |")
    lines += ["", "### Paired faults: DDP against Horovod", "",
              "The two libraries saw the same flips (same seed, same tensor shapes). Trials whose outcome "
              "class differs between them:", ""]
    for model in MODELS:
        for world in WORLDS:
            a, b = results.get(("ddp", model, world)), results.get(("horovod", model, world))
            if a and b:
                pairs = [(x, y) for x, y in zip(a, b) if x["count"] and x["placement"] == "all"]
                diff = [(x["outcome"], y["outcome"]) for x, y in pairs if x["outcome"] != y["outcome"]]
                what = ", ".join(f"DDP {p} / Horovod {q}" for p, q in diff[:6]) or "none"
                lines.append(f"- {model}, {world} processes: {len(diff)} of {len(pairs)} ({what})")
    lines += ["", "![harmful share](img/sdc-study-harm.png)", "", "![spread](img/sdc-study-spread.png)", "",
              "<!-- sdc-study:end -->"]
    plots(results, libs, img)
    return "\n".join(lines)


def param_of(model, tensor):
    """` (fc1.weight)` for an optimizer tensor `optimizer.state.0.exp_avg`."""
    parts = tensor.split(".")
    if parts[:2] == ["optimizer", "state"] and parts[2].isdigit() and int(parts[2]) < len(PARAMS[model]):
        return f" ({PARAMS[model][int(parts[2])]})"
    return ""


def plots(results, libs, img):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    os.makedirs(img, exist_ok=True)
    fig, axes = plt.subplots(1, len(MODELS), figsize=(11, 3.8), sharey=True)
    for ax, model in zip(axes, MODELS):
        groups = ["model", "optimizer", "sign", "exponent", "mantissa"]
        width = 0.8 / max(1, len(libs))
        for i, lib in enumerate(libs):
            vs = select(results, lib, model, "all", altered=True)
            ys = []
            for g in groups:
                sub = [v for v in vs if (v["kind"] == g if g in verdict.KINDS else v["bits"] == g)]
                ys.append(100 * sum(v["outcome"] != "masked" for v in sub) / len(sub) if sub else 0)
            ax.bar([x + i * width for x in range(len(groups))], ys, width, label=NAMES[lib])
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], groups)
        ax.set_title(f"{model.upper()}: harmful outcomes (altered checkpoint read by all)")
        ax.set_ylabel("% of trials")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(img, "sdc-study-harm.png"), dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(MODELS), figsize=(11, 3.8))
    for ax, model in zip(axes, MODELS):
        for i, lib in enumerate(libs):
            vs = select(results, lib, model, "all", judged=True)
            for measure, style in (("elements", "-"), ("large", "--")):
                if not vs or measure not in vs[0]:
                    continue
                s = verdict.spread_over_steps(vs, measure)
                xs = [o for o in s if o > 0]
                ax.plot(xs, [max(1, s[o][0]) for o in xs], style, marker="o", color=f"C{i}", alpha=0.8,
                        label=f"{NAMES[lib]}{' (>1%)' if measure == 'large' else ''}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("steps after the resume")
        ax.set_ylabel("elements differing from golden (median)")
        ax.set_title(model.upper())
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(img, "sdc-study-spread.png"), dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="40 trials per library and model")
    ap.add_argument("--only", choices=["ddp", "horovod", "steadfast"], action="append",
                    help="run these sides only (repeatable); the report goes beside the data, not into the docs")
    ap.add_argument("--keep", action="store_true", help="reuse finished cells in bench/out/sdc-study")
    a = ap.parse_args()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    import fcntl
    lock = open(OUT + ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"another sdc-study is running (it holds {OUT}.lock)")
    n_all, n_one, controls = (12, 6, 2) if a.quick else (100, 50, 2)
    out = OUT + ("-quick" if a.quick else "")
    if not a.keep:
        shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out, exist_ok=True)
    only = set(a.only or ["ddp", "horovod", "steadfast"])
    py, horovod_error = ensure_env(os.path.join(out, "horovod-install.log"))
    if horovod_error:
        print(f"Horovod will not run: {horovod_error}", flush=True)
    results = {}
    for model, m in MODELS.items():
        for world in WORLDS:
            plan = verdict.plan(n_all, n_one, world, INJECT_AT, m["steps_after"], controls=controls)
            for lib in LIBRARIES:
                if lib not in only or (lib == "horovod" and horovod_error):
                    continue
                t = time.time()
                vs = run_cell(lib, py, model, world, plan, os.path.join(out, f"{lib}-{model}-w{world}"))
                results[(lib, model, world)] = vs
                c = verdict.counts([v for v in vs if v["count"]])
                print(f"{NAMES[lib]:12} {model} x{world}: {dict(c)} in {time.time() - t:.0f} s", flush=True)
            if "horovod" in only and not horovod_error and model == "mlp":
                # Is Horovod's run-to-run variation its tensor fusion? Controls alone, fusion off.
                ctl = verdict.plan(0, 0, world, INJECT_AT, m["steps_after"], controls=3)
                results[("horovod-nofusion", model, world)] = run_cell(
                    "horovod", py, model, world, ctl, os.path.join(out, f"horovod-nofusion-{model}-w{world}"),
                    env={"HOROVOD_FUSION_THRESHOLD": "0"})
            if "steadfast" in only:
                t = time.time()
                for placement, n in (("all", n_all), ("one", n_one)):
                    if placement == "all" and world != WORLDS[0]:
                        continue  # one replica stands for any world: Steadfast's reproducible bits do not depend on it
                    for key, vs in steadfast_cell(model, placement, world, n * (len(WORLDS) if placement == "all" else 1),
                                                  os.path.join(out, "steadfast")).items():
                        results.setdefault((key, model, world), []).extend(vs)
                print(f"Steadfast    {model} x{world}: campaigns in {time.time() - t:.0f} s", flush=True)
    flat = [dict(v, library=l, model=m, world=w) for (l, m, w), vs in results.items() for v in vs]
    with open(os.path.join(out, "verdicts.json"), "w") as f:
        json.dump(flat, f)
    versions = run([py, "-c", "import torch; print(torch.__version__)"]).stdout.strip()
    hvd = run([py, "-c", "import horovod; print(horovod.__version__)"]).stdout.strip() or "not installed"
    commit = run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT).stdout.strip()
    meta = {"date": datetime.date.today().isoformat(), "cpu": cpu_name(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": versions, "horovod": hvd, "commit": commit,
            "minutes": elapsed(out) / 60, "horovod_error": horovod_error}
    # The quick form is a check that the study runs, too small for findings, and --only
    # runs part of it: their reports stay beside their data, and docs/sdc-study.md keeps
    # the full run's.
    partial = a.quick or a.only
    img = os.path.join(out, "img") if partial else IMG
    section = report(results, meta, a.quick, img)
    print(section)
    if partial:
        with open(os.path.join(out, "report.md"), "w") as f:
            f.write(section + "\n")
        print(f"(this partial run's report: {out}/report.md)")
    else:
        write_section(DOC, "sdc-study", section)


if __name__ == "__main__":
    main()
