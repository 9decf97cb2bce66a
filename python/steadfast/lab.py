"""Fault-injection campaigns on your own PyTorch model: the SDC lab of ``steadfast campaign``
around a training job you describe in a few functions.

A campaign trains a golden (fault-free) run once, then runs many trials. Trial ``i`` draws
its fault from the campaign seed alone (the kind of state, the injection step, the flip
seed), resumes from the golden state at that step, suffers the fault, trains on for
``steps_after`` steps and is judged against the golden trajectory, step by step: its
losses against golden's, the elements of every state tensor whose bits differ from
golden's, the detectors' alarms, and its final held-out quality. The classes (masked,
degraded, diverged, crashed, detected, corrected), the thresholds and the way trials are
drawn are the Rust core's, the same as ``steadfast campaign``'s, and so are the tables
written at the end: ``steadfast report DIR`` draws the campaign's HTML report, and
``python -m steadfast.lab replay DIR --trials 17`` (or ``steadfast campaign DIR/spec.toml
--replay 17``) replays trial 17 bit for bit.

The job is a module-level function that returns a :class:`Job`; trials run in worker
processes that import it by file and name::

    # my_study.py
    import torch, steadfast.lab as lab

    def job():
        x, y = ...                                   # the data, loaded once per process
        return lab.Job(
            model=lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)),
            optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3),
            batch=lambda step: (x[step * 64 % 59_968:][:64], y[step * 64 % 59_968:][:64]),
            evaluate=lambda m: lab.accuracy(m, x_test, y_test),
            name="linear", data="fashion-mnist")

    if __name__ == "__main__":
        lab.campaign(job, "runs/sdc", trials=1000, inject_at=[20, 40], steps_after=30,
                     state=["param", "grad", "optim", "activation"], bits="any")

Where a fault lands (``state``), in the tensor names that ``target`` globs over:

- ``param``: the model's state dict, ``model.<name>``, flipped before the step's forward;
- ``optim``: the optimizer's state, ``optimizer.state.<i>.<slot>``, before the step;
- ``grad``: the parameters' gradients, ``grad.<name>``, after the backward pass and
  before the optimizer's step;
- ``activation``: the output of a leaf module, ``act.<module>``, through a forward hook
  during the step's forward pass (the next layer reads the flipped value; the module's
  own backward uses what it computed);
- with ``where="checkpoint"``, ``param`` and ``optim`` faults are flipped in the golden
  run's Steadfast checkpoint of that step (a copy, its checksums rewritten as corruption
  before checksumming would leave them), which the trial loads and trains on from.

The golden run and every trial run on one thread each, in the deterministic mode PyTorch
offers (``torch.use_deterministic_algorithms``), and before any trial a worker process
resumes the golden run from its first snapshot and must reach its final bits: a job whose
training is not a function of its state and step (an unseeded shuffle, a random draw
outside torch's generator) is refused rather than judged wrongly.

Detectors, with the thresholds of the spec's ``[detect]``: ``nonfinite`` (a NaN/Inf loss
or gradient norm), ``grad_norm`` and ``loss_spike`` (above a multiple of the running
average of the values that raised no alarm), and ``checksum`` (the state at rest between
two steps no longer matches the digest taken at the end of the last step: it catches the
live ``param`` and ``optim`` flips). ``vote`` and ``fingerprint`` compare data-parallel
replicas and stay silent on one process. ``response`` is ``observe`` (alarms are reported
beside the class), ``stop`` (the first alarm ends the trial: detected) or ``repair`` (roll
back to the state before the step that raised the alarm and redo it; corrected when the
final bits are golden's).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import copy
import fcntl
import dataclasses
import hashlib
import importlib.util
import json
import math
import multiprocessing
import os
import pathlib
import sys
import tempfile
import time
import tomllib
from typing import Any, Callable, Iterable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from . import _steadfast
from . import torch as _checkpoints
from .faults import inject as _inject

__all__ = ["Job", "accuracy", "campaign", "replay", "LabError"]

#: The detectors, in the order of the tables' columns.
DETECTORS = ("checksum", "vote", "fingerprint", "nonfinite", "grad_norm", "loss_spike")
KINDS = ("param", "grad", "optim", "activation")


class LabError(RuntimeError):
    """A campaign that cannot run, with the reason."""


def _cross_entropy(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


@dataclasses.dataclass
class Job:
    """A training job, described by functions a worker process can call.

    ``model()`` builds the model (called after ``torch.manual_seed(seed)``, so its
    initial weights are the same in every process); ``optimizer(model)`` its optimizer;
    ``batch(step)`` the batch of step ``step`` (a pure function of the step: trials resume
    mid-run); ``loss(model, batch)`` the scalar loss (default: cross-entropy of
    ``model(x)`` against ``y`` for ``batch = (x, y)``); ``evaluate(model)`` the held-out
    ``(loss, accuracy)`` (see :func:`accuracy`), called without gradients; ``name`` and
    ``data`` describe the job in the tables and the report."""

    model: Callable[[], torch.nn.Module]
    optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer]
    batch: Callable[[int], Any]
    evaluate: Callable[[torch.nn.Module], "tuple[float, float]"]
    loss: Callable[[torch.nn.Module, Any], torch.Tensor] = _cross_entropy
    name: str = "model"
    data: str = ""
    seed: int = 0


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 1000) -> "tuple[float, float]":
    """Mean cross-entropy and accuracy of a classifier on ``(x, y)``, in eval mode, in
    batches of ``batch`` examples: an ``evaluate`` for :class:`Job`."""
    was = model.training
    model.eval()
    loss, right = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            out = model(x[i:i + batch])
            loss += float(F.cross_entropy(out, y[i:i + batch], reduction="sum"))
            right += int((out.argmax(1) == y[i:i + batch]).sum())
    model.train(was)
    return loss / len(x), right / len(x)


# ---------------------------------------------------------------------------------------
# The spec: written as the CLI's campaign spec, validated and completed by the Rust core.

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


def _job_ref(job: Callable[[], Job]) -> str:
    """``/abs/path/file.py:function``: how a worker (or a replay, later) finds the job."""
    name = getattr(job, "__qualname__", "")
    code = getattr(job, "__code__", None)
    path = code.co_filename if code is not None else None
    if not name or "<" in name or path is None or not os.path.isfile(path):
        raise LabError("the job must be a function defined at the top level of a Python file (worker processes "
                       f"import it by file and name); got {job!r}")
    return f"{os.path.abspath(path)}:{name}"


def _load_job(ref: str) -> Job:
    path, _, name = ref.rpartition(":")
    if not os.path.isfile(path):
        raise LabError(f"the campaign's job {ref!r}: no such file")
    key = "_steadfast_job_" + hashlib.sha256(path.encode()).hexdigest()[:12]
    module = sys.modules.get(key)
    if module is None:
        spec = importlib.util.spec_from_file_location(key, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        sys.path.insert(0, os.path.dirname(path))
        spec.loader.exec_module(module)
    factory = module
    for part in name.split("."):
        factory = getattr(factory, part, None)
    if not callable(factory):
        raise LabError(f"the campaign's job {ref!r}: {name} is not a function of {path}")
    job = factory()
    if not isinstance(job, Job):
        raise LabError(f"the campaign's job {ref!r} returned {type(job).__name__}, not a steadfast.lab.Job")
    return job


# ---------------------------------------------------------------------------------------
# Training: one step, the state's tensors, snapshots.

class _Monitors:
    """Running averages of the gradient norm and the loss: the spike detectors' rule of
    ``steadfast campaign`` (a value that raised an alarm stays out of the average)."""

    def __init__(self, grad_norm=None, loss=None):
        self.grad_norm, self.loss = grad_norm, loss

    def copy(self):
        return _Monitors(self.grad_norm, self.loss)

    def key(self):
        return (self.grad_norm, self.loss)

    def check(self, loss, grad_norm, detect):
        def fires(avg, x, factor):
            return avg is not None and (math.isnan(x) or x > factor * avg)

        def blend(avg, x):
            return x if avg is None else detect["smoothing"] * avg + (1.0 - detect["smoothing"]) * x

        norm = fires(self.grad_norm, grad_norm, detect["grad_norm_factor"])
        spike = fires(self.loss, loss, detect["loss_factor"])
        if not norm and math.isfinite(grad_norm):
            self.grad_norm = blend(self.grad_norm, grad_norm)
        if not spike and math.isfinite(loss):
            self.loss = blend(self.loss, loss)
        return norm, spike


class _Run:
    """A model and its optimizer, built as the job says."""

    def __init__(self, job: Job):
        self.job = job
        torch.manual_seed(job.seed)
        self.model = job.model()
        self.opt = job.optimizer(self.model)
        self.model.train()

    def tensors(self):
        """``(name, tensor)`` of the state: the model's state dict, then the optimizer's
        tensors, named as a checkpoint of ``{"model": ..., "optimizer": ...}`` names them."""
        out = [(f"model.{k}", v) for k, v in self.model.state_dict().items()]
        for i, slots in sorted(self.opt.state_dict()["state"].items()):
            out += [(f"optimizer.state.{i}.{k}", v) for k, v in sorted(slots.items()) if torch.is_tensor(v)]
        return out

    def snapshot(self):
        return ({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                copy.deepcopy(self.opt.state_dict()), torch.get_rng_state())

    def restore(self, snap):
        model, opt, rng = snap
        self.model.load_state_dict(model)
        # The optimizer keeps the tensors it is given: hand it copies, not the snapshot's.
        self.opt.load_state_dict(copy.deepcopy(opt))
        torch.set_rng_state(rng)

    def digest(self):
        h = hashlib.blake2b(digest_size=16)
        for name, t in self.tensors():
            h.update(name.encode())
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    def step(self, step, on_grads=None):
        """One training step; returns ``(loss, gradient norm)`` (the norm of what the
        optimizer consumes, after any fault in the gradients)."""
        self.opt.zero_grad(set_to_none=True)
        loss = self.job.loss(self.model, self.job.batch(step))
        loss.backward()
        if on_grads is not None:
            on_grads()
        sq = sum(float(p.grad.double().pow(2).sum()) for p in self.model.parameters() if p.grad is not None)
        self.opt.step()
        return float(loss.detach()), math.sqrt(sq)

    def evaluate(self):
        """Held-out (loss, accuracy), leaving the random generator and the mode as they were."""
        rng, was = torch.get_rng_state(), self.model.training
        with torch.no_grad():
            loss, acc = self.job.evaluate(self.model)
        self.model.train(was)
        torch.set_rng_state(rng)
        return float(loss), float(acc)


def _amount(fault):
    """How many bits a trial flips, as :func:`steadfast.inject` takes it."""
    return {"count": None, "rate": fault["rate"]} if fault["rate"] is not None else {"count": fault["flips"]}


def _bits_of(t):
    t = t.detach().contiguous().view(-1)
    size = t.element_size()
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64, 16: torch.int64}[size])
    return t


def _differing(a, b):
    """Per tensor, elements whose bits differ (a tensor missing from one side: none)."""
    b = dict(b)
    out = []
    for name, x in a:
        y = b.get(name)
        if y is None or x.shape != y.shape:
            out.append(0 if y is None else x.numel())
            continue
        out.append(int((_bits_of(x) != _bits_of(y)).sum()))
    return out


def _leaves(model):
    return [(n, m) for n, m in model.named_modules() if n and not any(True for _ in m.children())]


class _Replace(torch.autograd.Function):
    """The flipped activation forward; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, out, flipped):
        return flipped

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _flip_in_place(t, element, bits):
    flat = _bits_of(t)
    for b in bits:
        flat[element] ^= (1 << b) if b < flat.element_size() * 8 - 1 else -(1 << b)


# ---------------------------------------------------------------------------------------
# The golden run.

def _settings(spec):
    return spec["run"], spec["trials"], spec["detect"], spec["classify"]


def _golden(job: Job, spec: dict, checkpoints: pathlib.Path) -> dict:
    """Trains the golden run to the last step any trial reaches and keeps what trials are
    judged against: per step the loss, gradient norm, false alarms; from the first
    injection step on, the state, the random generator and the detectors' averages; the
    held-out quality where trials end; checkpoints at the injection steps (``where =
    "checkpoint"``); the activations' shapes (``activation`` faults)."""
    run_spec, trials, detect, _ = _settings(spec)
    first, last = min(trials["inject_at"]), max(trials["inject_at"]) + trials["steps_after"]
    ends = {s + trials["steps_after"] for s in trials["inject_at"]}
    started = time.perf_counter()
    run, monitors = _Run(job), _Monitors()
    g = {"losses": [], "grad_norms": [], "alarms": [], "evals": {}, "states": {}, "monitors": {},
         "checkpoints": {}, "activations": [], "first": first, "last": last}
    for step in range(last):
        if step >= first:
            g["states"][step] = run.snapshot()
            g["monitors"][step] = monitors.key()
        if step in trials["inject_at"] and run_spec["where"] == "checkpoint":
            state = {"model": run.model.state_dict(), "optimizer": run.opt.state_dict()}
            g["checkpoints"][step] = str(_checkpoints.save(state, checkpoints, step=step, overwrite=True))
        hooks = []
        if step == first and "activation" in trials["state"]:
            seen = g["activations"]

            def record(name):
                def hook(module, args, out):
                    if torch.is_tensor(out) and out.is_floating_point() and all(n != name for n, _, _ in seen):
                        seen.append((name, tuple(out.shape), out.dtype))
                return hook
            hooks = [m.register_forward_hook(record(f"act.{n}")) for n, m in _leaves(run.model)]
        loss, norm = run.step(step)
        for h in hooks:
            h.remove()
        if not math.isfinite(loss):
            raise LabError(f"the golden run's loss is {loss} at step {step}: nothing to judge trials against")
        g["losses"].append(loss)
        g["grad_norms"].append(norm)
        spike_norm, spike_loss = monitors.check(loss, norm, detect)
        g["alarms"].append([d for d, fired in (("nonfinite", not math.isfinite(norm)), ("grad_norm", spike_norm),
                                               ("loss_spike", spike_loss)) if fired])
        if step + 1 in ends:
            g["evals"][step + 1] = run.evaluate()
    g["states"][last] = run.snapshot()
    g["monitors"][last] = monitors.key()
    g["tensors"] = [(n, t.numel()) for n, t in run.tensors()]
    g["digest"] = run.digest()
    g["seconds"] = time.perf_counter() - started
    return g


# ---------------------------------------------------------------------------------------
# A trial.

class _Worker:
    """What one process needs to run trials: the job, the spec, the golden run."""

    def __init__(self, job: Job, spec_text: str, golden: dict):
        self.job, self.text, self.golden = job, spec_text, golden
        self.spec = tomllib.loads(spec_text)
        self.run = _Run(job)
        self.golden_tensors = {}

    def golden_state(self, step):
        """The golden state's tensors after ``step`` steps, named as :meth:`_Run.tensors`."""
        if step not in self.golden_tensors:
            model, opt, _ = self.golden["states"][step]
            out = [(f"model.{k}", v) for k, v in model.items()]
            for i, slots in sorted(opt["state"].items()):
                out += [(f"optimizer.state.{i}.{k}", v) for k, v in sorted(slots.items()) if torch.is_tensor(v)]
            self.golden_tensors[step] = out
        return self.golden_tensors[step]

    def check_determinism(self):
        """Resumes the golden run from its first snapshot and asks for its final bits."""
        g = self.golden
        self.run.restore(g["states"][g["first"]])
        for step in range(g["first"], g["last"]):
            self.run.step(step)
        if self.run.digest() != g["digest"]:
            raise LabError(
                f"the job is not deterministic: resumed from its state at step {g['first']}, it did not reach the "
                f"golden run's bits at step {g['last']}. Trials could not be told apart from noise: seed every random "
                "draw through torch's generator, make batch(step) a function of the step, and avoid operations "
                "PyTorch cannot run deterministically")

    def trial(self, index: int, keep: Optional[str] = None) -> "tuple[dict, dict]":
        """Runs trial ``index``; returns its result (the tables' record) and its flip log.
        With ``keep`` (checkpoint faults), the altered checkpoint is left there."""
        started = time.perf_counter()
        fault = _steadfast.lab_trial(self.text, index)
        trials = self.spec["trials"]
        g = self.golden
        s, end = fault["step"], fault["step"] + trials["steps_after"]
        res = {"trial": index, "reduce": "deterministic", "state": fault["state"], "rank": fault["rank"], "step": s,
               "flip_seed": fault["seed"], "target": fault["target"], "role": fault["role"], "bits": fault["bits"],
               "flips": fault["flips"], "rate": fault["rate"], "burst": fault["burst"], "flips_done": [],
               "first_alarm": {},
               "losses": [], "replica_differing": [], "tensor_differing": [], "quality": None, "rejoined": None,
               "rollbacks": 0, "repairs": 0, "error": None}
        evidence = {"crashed": False, "diverged": False, "acted_on_alarm": False, "bitwise_golden": False,
                    "accuracy_drop": 0.0, "loss_rise": 0.0}
        log = {}
        try:
            log = self._run_trial(fault, res, evidence, keep)
        except Exception as e:  # the trial's outcome, not the campaign's failure
            evidence["crashed"] = True
            res["error"] = f"{type(e).__name__}: {e}"
        if res["quality"] is not None and not evidence["crashed"]:
            g_loss, g_acc = g["evals"][end]
            loss, acc = res["quality"]
            evidence["accuracy_drop"] = g_acc - acc
            evidence["loss_rise"] = (loss - g_loss) / g_loss if g_loss else (0.0 if loss == g_loss else math.inf)
        res["evidence"] = evidence
        res["outcome"] = _steadfast.lab_classify(self.text, **evidence)
        res["seconds"] = time.perf_counter() - started
        return res, log

    def _inject_live(self, fault, subject):
        return _inject(subject, target=fault["target"], bits=fault["bits"], **_amount(fault), burst=fault["burst"],
                       seed=fault["seed"])

    def _run_trial(self, fault, res, evidence, keep):
        run_spec, trials, detect, classify = _settings(self.spec)
        g, run = self.golden, self.run
        kind, s = fault["state"], fault["step"]
        end = s + trials["steps_after"]
        run.restore(g["states"][s])
        monitors = _Monitors(*g["monitors"][s])
        log = {}
        if run_spec["where"] == "checkpoint":
            with tempfile.TemporaryDirectory() as tmp:
                altered = keep or os.path.join(tmp, "altered")
                log = _inject(g["checkpoints"][s], out=altered, target=fault["target"], role=fault["role"],
                              bits=fault["bits"], **_amount(fault), burst=fault["burst"], seed=fault["seed"],
                              log=os.path.join(tmp, "log.json"))
                state = _checkpoints.load(altered)
            run.model.load_state_dict(state["model"])
            run.opt.load_state_dict(state["optimizer"])
        fired = False
        step = s
        while step < end:
            # Repair rolls back to the state before the step that raised the alarm (taken
            # before this step's fault, so that redoing the step redoes it without).
            before = (run.snapshot(), monitors.copy()) if detect["response"] == "repair" else None
            alarms = []
            on_grads, hooks = None, []   # a gradient fault sets on_grads, an activation fault hooks
            if step == s and not fired and run_spec["where"] == "live":
                fired = True
                if kind == "param":
                    log = self._inject_live(fault, {"model": run.model})
                elif kind == "optim":
                    log = self._inject_live(fault, {"optimizer": run.opt})
                elif kind == "grad":
                    def flip_grads():
                        grads = {n: p.grad for n, p in run.model.named_parameters() if p.grad is not None}
                        log.update(self._inject_live(fault, {"grad": grads}))
                    on_grads = flip_grads
                else:
                    log, hooks = self._activation_fault(fault)
                if kind in ("param", "optim"):
                    alarms.append("checksum")   # the state at rest no longer matches its digest
            try:
                loss, norm = run.step(step, on_grads)
            finally:
                for h in hooks:
                    h.remove()
            if kind == "activation" and step == s and not log.get("flips"):
                raise LabError("the activation fault found no module output to flip")
            spike_norm, spike_loss = monitors.check(loss, norm, detect)
            if not (math.isfinite(loss) and math.isfinite(norm)):
                alarms.append("nonfinite")
            if spike_norm:
                alarms.append("grad_norm")
            if spike_loss:
                alarms.append("loss_spike")
            for a in alarms:
                res["first_alarm"].setdefault(a, step)
            if alarms and detect["response"] == "stop":
                evidence["acted_on_alarm"] = True
                res["losses"].append(loss)
                self._compare(res, step + 1)
                break
            if alarms and detect["response"] == "repair":
                evidence["acted_on_alarm"] = True
                if res["rollbacks"] >= detect["max_rollbacks"]:
                    res["losses"].append(loss)
                    self._compare(res, step + 1)
                    break
                res["rollbacks"] += 1
                run.restore(before[0])
                monitors = before[1]
                continue
            res["losses"].append(loss)
            if not math.isfinite(loss) or loss > classify["diverged_loss"] * g["losses"][step]:
                evidence["diverged"] = True
                self._compare(res, step + 1)
                return log
            differing = self._compare(res, step + 1)
            step += 1
            if fired or run_spec["where"] == "checkpoint":
                if not any(differing) and monitors.key() == tuple(g["monitors"][step]):
                    # Golden's state again: by determinism the rest of the trial is golden's.
                    res["rejoined"] = step - 1
                    for k in range(step, end):
                        res["losses"].append(g["losses"][k])
                        res["replica_differing"].append([0])
                        res["tensor_differing"].append([0] * len(g["tensors"]))
                    res["quality"] = g["evals"][end]
                    evidence["bitwise_golden"] = True
                    return log
        if res["tensor_differing"] and step == end:
            res["quality"] = run.evaluate()
            evidence["bitwise_golden"] = not any(res["tensor_differing"][-1])
        return log

    def _compare(self, res, after):
        """Records the elements differing from golden's state after ``after`` steps."""
        mine = self.run.tensors()
        differing = _differing(mine, self.golden_state(after))
        order = {n: i for i, (n, _) in enumerate(self.golden["tensors"])}
        row = [0] * len(order)
        for (n, _), d in zip(mine, differing):
            if n in order:
                row[order[n]] = d
        res["tensor_differing"].append(row)
        res["replica_differing"].append([sum(differing)])
        return differing

    def _activation_fault(self, fault):
        """Draws the flips over placeholders shaped as the golden run's activations, then
        applies them to the real outputs as the forward pass produces them."""
        shapes = self.golden["activations"]
        placeholders = {"act": {n[len("act."):]: torch.zeros(shape, dtype=dtype) for n, shape, dtype in shapes}}
        log = self._inject_live(fault, placeholders)
        by_tensor = {}
        for f in log["flips"]:
            by_tensor.setdefault(f["tensor"], []).append(f)
        hooks = []
        for name, module in _leaves(self.run.model):
            flips = by_tensor.get(f"act.{name}")
            if not flips:
                continue

            def hook(module, args, out, flips=flips, done=[]):
                if done or not torch.is_tensor(out):
                    return None
                done.append(True)
                flipped = out.detach().clone()
                for f in flips:
                    old = float(flipped.view(-1)[f["element"]])
                    _flip_in_place(flipped, f["element"], f["bits"])
                    f["old_value"], f["new_value"] = repr(old), repr(float(flipped.view(-1)[f["element"]]))
                return _Replace.apply(out, flipped)
            hooks.append(module.register_forward_hook(hook))
        return log, hooks


# ---------------------------------------------------------------------------------------
# Workers.

_WORKER: Optional[_Worker] = None


def _start_worker(job_ref, spec_text, golden_path):
    global _WORKER
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    _WORKER = _Worker(_load_job(job_ref), spec_text, torch.load(golden_path, weights_only=False))


def _check_worker(_):
    _WORKER.check_determinism()
    return os.getpid()


def _run_worker(indices):
    return [_WORKER.trial(i) for i in indices]


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
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        golden = _golden(the_job, spec, out / "golden" / "checkpoints")
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    golden_path = out / "golden" / "trajectory.pt"
    golden_path.parent.mkdir(exist_ok=True)
    torch.save(golden, golden_path)
    (out / "spec.toml").write_text(text)

    results = {}
    logs = out / "logs"
    logs.mkdir(exist_ok=True)

    def take(res, log):
        results[res["trial"]] = _record(res, log)
        with open(logs / f"trial-{res['trial']:06}.json", "w") as f:
            json.dump(log, f)
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
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        worker = _Worker(_load_job(spec["run"]["job"]), text, torch.load(out / "golden" / "trajectory.pt",
                                                                              weights_only=False))
        recorded = {}
        if (out / "trials.csv").exists():
            import csv
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
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m steadfast.lab", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("replay", help="replay trials of a campaign bit for bit and print them",
                       epilog="example: python -m steadfast.lab replay runs/sdc-torch --trials 17,230")
    r.add_argument("dir", help="the campaign's directory (where spec.toml and trials.csv are)")
    r.add_argument("--trials", required=True, help="comma-separated trial indices")
    r.add_argument("--keep", help="for one trial of a checkpoint campaign: leave the altered checkpoint here")
    a = p.parse_args(argv)
    try:
        indices = [int(x) for x in a.trials.split(",") if x.strip()]
    except ValueError:
        p.error(f"--trials {a.trials!r}: give comma-separated integers")
    try:
        for text, _, _ in replay(a.dir, indices, keep=a.keep):
            print(text, end="")
    except (LabError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Run as `python -m steadfast.lab`, this file is `__main__`; the job's file imports
    # `steadfast.lab`, whose Job is the one to check against: run that module's main.
    from steadfast.lab import main as _main
    sys.exit(_main())
