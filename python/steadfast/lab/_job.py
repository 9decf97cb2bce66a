"""The job a campaign trains, as the user describes it, and how worker processes find it."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F


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
