"""Training the job: one step, its state's tensors, snapshots, the spike detectors'
averages, bitwise comparison; and the golden run that trials are judged against."""
from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import pathlib
import time

import torch

from .. import torch as _checkpoints
from ._job import Job, LabError


def named(model_state, optim_state):
    """``(name, tensor)`` of a model's and an optimizer's state dicts: the model's tensors,
    then the optimizer's, named as a checkpoint of ``{"model": ..., "optimizer": ...}``
    names them (``model.fc1.weight``, ``optimizer.state.0.exp_avg``)."""
    out = [(f"model.{k}", v) for k, v in model_state.items()]
    for i, slots in sorted(optim_state["state"].items()):
        out += [(f"optimizer.state.{i}.{k}", v) for k, v in sorted(slots.items()) if torch.is_tensor(v)]
    return out


@contextlib.contextmanager
def one_thread():
    """Torch on one thread in its deterministic mode (what the golden run, the workers and
    a replay train in, so that their bits agree), restored afterwards."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


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
        """``(name, tensor)`` of the state (see :func:`named`)."""
        return named(self.model.state_dict(), self.opt.state_dict())

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
    g["params"] = [n for n, _ in run.model.named_parameters()]
    g["digest"] = run.digest()
    g["seconds"] = time.perf_counter() - started
    return g
