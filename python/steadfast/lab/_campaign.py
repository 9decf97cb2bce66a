"""A campaign: its spec (written as ``steadfast campaign``'s and completed by the Rust core),
the golden run, the trials in worker processes, the tables; and the replay of a trial."""
from __future__ import annotations

import concurrent.futures
import csv
import fcntl
import fnmatch
import json
import math
import multiprocessing
import os
import pathlib
import sys
import time
import tomllib
from typing import Callable, Iterable, Optional, Sequence, Union

import torch

from .. import _steadfast
from ._job import Job, LabError, _job_ref, _load_job
from ._training import _golden, named, one_thread
from ._trial import _Worker, _check_worker, _run_worker, _start_worker


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} in a spec")


def _toml_table(name, fields):
    lines = [f"[{name}]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items() if v is not None]
    return "\n".join(lines) + "\n"


def _check_targets(spec, golden):
    """Every kind of state a trial may hit has a tensor its target matches at every
    injection step, so that no trial fails for want of one (as the CLI's campaign checks)."""
    target = spec["trials"].get("target") or "*"
    for step in spec["trials"]["inject_at"]:
        model, opt, _ = golden["states"][step]
        names = {
            "param": [f"model.{k}" for k in model],
            "grad": [f"grad.{n}" for n in golden["params"]],
            "optim": [n for n, _ in named({}, opt)],
            "activation": [n for n, _, _ in golden["activations"]],
        }
        for kind in spec["trials"]["state"]:
            if not any(fnmatch.fnmatchcase(n, target) for n in names[kind]):
                listed = ", ".join(names[kind])
                if not listed:
                    listed = "none: the optimizer holds no state before its first step" if kind == "optim" else "none"
                raise LabError(f"trials.target {target!r} matches no {kind} tensor at step {step} (they are: {listed})")


def _finite(x):
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _record(res, log):
    """A trial's result as the Rust core's writer reads it."""
    r = dict(res)
    r["losses"] = [_finite(x) for x in r["losses"]]
    r["quality"] = None if r["quality"] is None else [_finite(x) for x in r["quality"]]
    r["flips_done"] = [{"rank": 0, "tensor": f["tensor"], "element": int(f["element"]), "bits": list(f["bits"]),
                        "old": _finite(float(f["old_value"])), "new": _finite(float(f["new_value"]))}
                       for f in log.get("flips", [])]
    r["evidence"] = {k: (_finite(v) if isinstance(v, float) else v) for k, v in r["evidence"].items()}
    return r


def _golden_record(g):
    return {"reduce": "deterministic", "losses": [_finite(x) for x in g["losses"]],
            "grad_norms": [_finite(x) for x in g["grad_norms"]],
            "alarms": g["alarms"], "evals": {str(k): list(v) for k, v in g["evals"].items()},
            "tensors": [list(t) for t in g["tensors"]], "seconds": g["seconds"]}


def _workers(n):
    if n is None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n < 1:
        raise ValueError(f"workers={n}: give at least 1")
    return n


def campaign(job: Union[Callable[[], Job], str], out: Union[str, "os.PathLike[str]"], *, trials: int,
             inject_at: Sequence[int], steps_after: int, state: Iterable[str] = ("param", "optim"),
             where: str = "live", target: Optional[str] = None, bits: Union[str, int] = "any", flips: int = 1,
             rate: Optional[float] = None, burst: int = 1, seed: int = 1, detect: Optional[dict] = None,
             classify: Optional[dict] = None,
             workers: Optional[int] = None, progress: Optional[Callable[[int, int], None]] = None) -> str:
    """Runs a campaign of ``trials`` trials of ``job`` (a module-level function returning a
    :class:`Job`, or ``"file.py:function"`` naming one) and writes its tables, spec, summary,
    golden trajectory and flip logs into ``out``; returns the summary (Markdown).

    The knobs are ``steadfast campaign``'s ``[trials]`` (``inject_at``, ``steps_after``,
    ``state``: kinds among param, grad, optim, activation; ``target``: a glob over tensor
    names; ``bits``: sign, exponent, mantissa, any, ``N`` or ``N-M``; ``flips`` bursts, or
    each candidate bit with probability ``rate``; ``burst`` adjacent bits; ``seed``),
    ``[detect]`` and ``[classify]`` (dicts of those tables' keys); ``where`` is ``live`` or
    ``checkpoint``. Trials run in ``workers`` processes (default: one per core), each
    resuming from the golden state at its injection step; the results do not depend on how
    many. ``progress(done, total)`` is called as trials finish."""
    if where not in ("live", "checkpoint"):
        raise ValueError(f"where={where!r}: give 'live' or 'checkpoint'")
    state = list(state)
    if where == "checkpoint" and any(k not in ("param", "optim") for k in state):
        raise ValueError("a checkpoint holds parameters and optimizer state: with where='checkpoint', state may "
                         f"name only param and optim (got {state})")
    if isinstance(job, (str, os.PathLike)):
        path, sep, name = os.fspath(job).rpartition(":")
        if not sep or not path:
            raise ValueError(f"job {job!r}: give a function, or 'file.py:function'")
        ref = f"{os.path.abspath(path)}:{name}"
    else:
        ref = _job_ref(job)
    workers = _workers(workers)
    the_job = _load_job(ref)
    run = {"model": the_job.name, "framework": "pytorch", "data": the_job.data, "replicas": 1,
           "reduce": ["deterministic"], "where": where, "job": ref, "python": sys.executable,
           "torch": torch.__version__}
    text = _toml_table("run", run) + _toml_table("trials", {
        "count": trials, "seed": seed, "inject_at": list(inject_at), "steps_after": steps_after, "state": state,
        "target": target, "bits": str(bits), "flips": flips, "rate": rate, "burst": burst})
    if detect:
        text += _toml_table("detect", detect)
    if classify:
        text += _toml_table("classify", classify)
    try:
        text = _steadfast.lab_spec(text)
    except ValueError as e:
        raise ValueError(f"bad campaign: {e}") from None
    spec = tomllib.loads(text)

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lock = open(out / ".campaign.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise LabError(f"another campaign is running in {out}") from None
    try:
        return _campaign(ref, the_job, spec, text, out, trials, workers, progress)
    finally:
        lock.close()


def _campaign(ref, the_job, spec, text, out, trials, workers, progress):
    if (out / "trials.csv").exists():
        raise LabError(f"{out} already holds a campaign's tables: give another directory, or remove it first")
    started = time.perf_counter()
    with one_thread():
        golden = _golden(the_job, spec, out / "golden" / "checkpoints")
    _check_targets(spec, golden)
    golden_path = out / "golden" / "trajectory.pt"
    golden_path.parent.mkdir(exist_ok=True)
    try:
        torch.save(golden, golden_path)
    except (OSError, RuntimeError) as e:   # torch's writer reports a full disk as a RuntimeError
        golden_path.unlink(missing_ok=True)
        raise LabError(f"cannot write {golden_path}: {e} (is the disk full?)") from None
    (out / "spec.toml").write_text(text)

    results = {}
    logs = out / "logs"
    logs.mkdir(exist_ok=True)

    def take(res, log):
        results[res["trial"]] = _record(res, log)
        path = logs / f"trial-{res['trial']:06}.json"
        try:
            with open(path, "w") as f:
                json.dump(log, f)
        except OSError as e:
            raise LabError(f"cannot write {path}: {e}; {out} holds no tables") from None
        if progress is not None:
            progress(len(results), trials)

    chunk = max(1, min(16, trials // (4 * workers)))
    # A chunk of trials costs about its steps of the golden run; one that takes far longer
    # (a worker stopped by SIGSTOP, or stuck) must not hang the campaign for ever.
    per_step = golden["seconds"] / max(1, len(golden["losses"]))
    stall = 120.0 + 50 * per_step * (spec["trials"]["steps_after"] + 1) * chunk
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_start_worker, initargs=(ref, text, str(golden_path)))
    finished = False
    try:
        # The workers resume the golden run and must reach its bits before any trial runs.
        for f in [pool.submit(_check_worker, i) for i in range(workers)]:
            f.result(timeout=stall + golden["seconds"] * 50)
        pending = {pool.submit(_run_worker, range(i, min(i + chunk, trials))) for i in range(0, trials, chunk)}
        while pending:
            done, pending = concurrent.futures.wait(pending, timeout=stall,
                                                    return_when=concurrent.futures.FIRST_COMPLETED)
            if not done:
                raise LabError(f"no trial finished in {stall:.0f} s: a worker process is stopped or stuck; "
                               f"{out} holds no tables")
            for f in done:
                for res, log in f.result():
                    take(res, log)
        finished = True
    except concurrent.futures.process.BrokenProcessPool as e:
        raise LabError(f"a worker process died ({e}): killed, or out of memory; the trials it ran are lost, "
                       f"and {out} holds no tables") from None
    except concurrent.futures.TimeoutError:
        raise LabError(f"a worker process did not resume the golden run in time; {out} holds no tables") from None
    finally:
        # Workers left running (the campaign failed, or was interrupted) are ended, not
        # waited for: a stopped one would never finish. (The executor keeps no public list.)
        if not finished:
            for p in list((getattr(pool, "_processes", None) or {}).values()):
                if p.is_alive():
                    p.kill()
        pool.shutdown(wait=True, cancel_futures=True)
    record = {"goldens": [_golden_record(golden)], "results": [results[i] for i in range(trials)]}
    return _steadfast.lab_write(str(out), text, json.dumps(record), time.perf_counter() - started)


def replay(out: Union[str, "os.PathLike[str]"], trials: Sequence[int], *, keep: Optional[str] = None) -> list:
    """Replays trials of the campaign in ``out`` from its spec, job and golden trajectory,
    in this process; returns, per trial, ``(text, result, log)``: the description
    ``steadfast campaign --replay`` prints, the result, the flip log (what
    :func:`steadfast.undo` takes). Raises :class:`LabError` if a trial's outcome differs
    from the one in ``trials.csv``. With ``keep`` (a checkpoint campaign, one trial), the
    altered checkpoint is left at that path."""
    out = pathlib.Path(out)
    text = (out / "spec.toml").read_text()
    spec = tomllib.loads(text)
    if spec["run"].get("framework") != "pytorch":
        raise LabError(f"{out} holds a campaign of steadfast's own models: replay it with `steadfast campaign "
                       f"SPEC --replay N`")
    with one_thread():
        worker = _Worker(_load_job(spec["run"]["job"]), text, torch.load(out / "golden" / "trajectory.pt",
                                                                              weights_only=False))
        recorded = {}
        if (out / "trials.csv").exists():
            with open(out / "trials.csv", newline="") as f:
                recorded = {int(r["trial"]): r["outcome"] for r in csv.DictReader(f)}
        done = []
        for index in trials:
            if not 0 <= index < spec["trials"]["count"]:
                raise LabError(f"trial {index}: the campaign has trials 0 to {spec['trials']['count'] - 1}")
            res, log = worker.trial(index, keep=keep)
            if index in recorded and recorded[index] != res["outcome"]:
                raise LabError(f"trial {index} replayed as {res['outcome']}, but the campaign recorded "
                               f"{recorded[index]}: the job or its environment changed")
            done.append((_steadfast.lab_trial_text(text, json.dumps(_record(res, log))), res, log))
        return done
