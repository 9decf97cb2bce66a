"""One trial: resume from the golden state, inject the fault, train on, compare with the
golden trajectory step by step, classify; and the entry points of the worker processes."""
from __future__ import annotations

import math
import os
import tempfile
import time
import tomllib
from typing import Optional

import torch

from .. import _steadfast
from .. import torch as _checkpoints
from ..faults import inject as _inject
from ._job import Job, LabError, _load_job
from ._training import (_Monitors, _Replace, _Run, _amount, _differing, _flip_in_place, _leaves,
                        _settings, named)


class _Worker:
    """What one process needs to run trials: the job, the spec, the golden run."""

    def __init__(self, job: Job, spec_text: str, golden: dict):
        self.job, self.text, self.golden = job, spec_text, golden
        self.spec = tomllib.loads(spec_text)
        self.run = _Run(job)
        self.golden_tensors = {}
        self.order = {n: i for i, (n, _) in enumerate(golden["tensors"])}

    def golden_state(self, step):
        """The golden state's tensors after ``step`` steps, named as :meth:`_Run.tensors`."""
        if step not in self.golden_tensors:
            model, opt, _ = self.golden["states"][step]
            self.golden_tensors[step] = named(model, opt)
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
        row = [0] * len(self.order)
        for (n, _), d in zip(mine, differing):
            if n in self.order:
                row[self.order[n]] = d
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
