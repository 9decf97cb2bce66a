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

The golden run and every trial run on the CPU, on one thread each, in the deterministic
mode PyTorch offers (``torch.use_deterministic_algorithms``), and before any trial a worker process
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
from ._campaign import campaign, replay
from ._job import Job, LabError, accuracy

__all__ = ["Job", "LabError", "accuracy", "campaign", "replay"]
