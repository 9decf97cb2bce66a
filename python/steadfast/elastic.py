"""A PyTorch training loop that survives the loss of workers with the same bits.

Wrap the model and the optimizer in a :class:`Job` and iterate over it: each item is a
:class:`Step`, whose micro-batches this worker computes, each inside its context::

    import steadfast.elastic as se

    torch.manual_seed(0)                                   # the same initial weights everywhere
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    job = se.Job(model, opt, steps=500, micro_batches=8, data=(len(x), 256), seed=0)
    for step in job:
        for i in step.micro_batches:                       # this worker's share of the step
            with step.micro_batch(i):                      # forward and backward inside
                part = step.examples(i)                    # the example indices of micro-batch i
                F.cross_entropy(model(x[part]), y[part]).backward()
    print("weights sha256:", job.weights_sha256())

Run alone (``python train.py``), the loop trains as one process that computes every
micro-batch. Started by Steadfast's launcher, it is a worker of an elastic job::

    steadfast launch --nproc 4 --max-restarts 3 -- python train.py

and then a worker killed with ``kill -9``, stopped past its heartbeat, or lost with its
node is replaced (or the job shrinks, ``--on-failure shrink``): the survivors keep their
state, a replacement fetches the whole state from the live replicas (several at once), no
step is skipped and none is applied twice, and the final weights have the same bits as the
run that was never disturbed, on 1, 2, 4 or any number of workers that divides nothing in
particular: micro-batch ``i`` of a step runs on the worker of rank ``i % world``, each
micro-batch's gradient is kept apart, and the job sums them with Steadfast's
order-independent fixed-point sum, so the mean gradient has the same bits whoever
computed what.

**Who decides.** The Python side decides nothing: the step protocol (the same
``comm::protocol`` worker that Steadfast's own elastic trainer runs, in the native module)
says which step to compute with which members, runs the reproducible all-reduce over the
epoch's mesh (shared memory on one host, TCP across hosts), the vote, the replica check and
the fetches, and asks Python only for what Python holds: the gradients of a micro-batch,
the optimizer's update, and the state as bytes.

**The replicated state** is everything a replacement needs to continue exactly: the
model's ``state_dict()``, the optimizer's, the LR scheduler's, every generator's state
(torch's, NumPy's, Python's ``random``), and whatever the caller registers in ``extra``
(objects with ``state_dict()``/``load_state_dict()``). The data position is a function of
the step (:meth:`Step.examples`), so a replacement is exactly where the job is.

**The contract a loop keeps** for the bits not to depend on the workers: every worker
builds the same initial model (seed before building it); a micro-batch's loss depends only
on its examples and on the generator the context seeds for it (dropout draws from torch's
generator, which ``micro_batch(i)`` seeds from the job's seed, the step and ``i``, and
restores after); gradients are float32 on the CPU; modules that change their state in the
forward pass (batch norm's running statistics) would make the replicas differ, and the
replica check says so.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import sys
from typing import Any, Iterator, Optional

import torch

from . import _steadfast, _tree
from . import torch as _st

__all__ = ["Job", "Step", "JobError", "JobOver"]

JobError = _steadfast.JobError
JobOver = _steadfast.JobOver


def _leave(over: Exception) -> None:
    """Ends a process that joined after the job had finished (a replacement started before
    its end): it holds nothing of the final state, so nothing after the job's loop (a
    save, a print of the weights) may run; and it is no failure."""
    print(f"[steadfast] {over}: this process has nothing to do", file=sys.stderr)
    raise SystemExit(0)


def _at(t: torch.Tensor) -> tuple[int, int]:
    n = t.numel() * t.element_size()
    return (t.data_ptr() if n else 0, n)


def _align8(n: int) -> int:
    return (n + 7) // 8 * 8


def _mix(*words: int) -> int:
    """A seed for torch's generator from ``words`` (SplitMix64 steps), below 2**63."""
    x = 0x9E3779B97F4A7C15
    for w in words:
        x = (x ^ (w & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 29)) >> 1


def _seed_generators(seed: int) -> None:
    import random

    import numpy as np

    torch.default_generator.manual_seed(_mix(seed, 0x6A6F62))
    np.random.seed(_mix(seed, 0x6E70) % 2**32)
    random.seed(_mix(seed, 0x7079))


_UNSEEDED = ("\nThe workers started from different states: seed torch before building the model "
             "(torch.manual_seed(seed)), so that every worker builds the same initial weights.")


class Step:
    """One step of the job, as this worker computes it: ``index`` (the step's number, from
    0) and ``micro_batches`` (the indices of the micro-batches this worker computes, in the
    order to compute them)."""

    def __init__(self, job: "Job", index: int, micro_batches: list[int]) -> None:
        self._job = job
        self.index = index
        self.micro_batches = micro_batches
        self._done = 0
        self._current: Optional[int] = None

    def examples(self, i: int) -> torch.Tensor:
        """The example indices of micro-batch ``i`` of this step, when the job was given
        ``data=(examples, batch)``: the step's global batch is the next ``batch`` examples
        of a seeded permutation of the data set (a new one each epoch), cut into
        ``micro_batches`` equal slices. A function of the step alone: a replacement reads
        exactly the examples the job is at."""
        return self._job._examples(self.index, i)

    @contextlib.contextmanager
    def micro_batch(self, i: int) -> Iterator[None]:
        """The context of micro-batch ``i`` (the next of :attr:`micro_batches`): run its
        forward and backward inside. Its gradient is kept apart from the others'; torch's
        generator is seeded for it (from the job's seed, the step and ``i``) and restored
        after, so dropout draws the same mask on whichever worker computes it."""
        if self._current is not None:
            raise ValueError(f"micro-batch {i} inside micro-batch {self._current}: one micro-batch at a time")
        if self._done >= len(self.micro_batches) or self.micro_batches[self._done] != i:
            expected = self.micro_batches[self._done] if self._done < len(self.micro_batches) else "none"
            raise ValueError(f"micro-batch {i} out of turn: this worker computes {expected} next")
        job = self._job
        term = job._term(self._done)
        term.zero_()
        views = job._views(term)
        for p, v in zip(job._params, views):
            p.grad = v
        self._current = i
        # (The CPU generator's alone: torch.manual_seed would seed every device's too, and
        # that costs more than the micro-batch of a small model.)
        generator = torch.default_generator
        kept = generator.get_state()
        try:
            generator.manual_seed(_mix(job.seed, self.index, i))
            yield
        finally:
            generator.set_state(kept)
            self._current = None
            for p, v in zip(job._params, views):
                # A backward pass accumulates into the gradient it finds; one that replaced
                # it instead is copied in.
                if p.grad is not None and p.grad.data_ptr() != v.data_ptr():
                    v.copy_(p.grad)
                p.grad = None
        self._done += 1

    def _terms(self) -> list[torch.Tensor]:
        if self._done != len(self.micro_batches):
            left = self.micro_batches[self._done:]
            raise RuntimeError(f"step {self.index} ended with micro-batches {left} not computed: every micro-batch "
                               "of step.micro_batches runs inside its step.micro_batch(i)")
        return [self._job._term(k) for k in range(self._done)]


def _rng_state() -> dict[str, Any]:
    """Every generator's state: torch's as its tensor, NumPy's and Python's pickled into
    one string (their 600-odd words each as leaves of the state's tree would cost more to
    encode every step than the rest of the state)."""
    import random

    import numpy as np

    return {"torch": torch.get_rng_state(),
            "host": pickle.dumps((np.random.get_state(), random.getstate()), protocol=4)}


def _set_rng_state(state: dict[str, Any]) -> None:
    import random

    import numpy as np

    torch.set_rng_state(state["torch"])
    numpy_state, python_state = pickle.loads(state["host"])
    np.random.set_state(numpy_state)
    random.setstate(python_state)


class _Host:
    """What the native worker asks of Python: the state as bytes, the update, a fetched
    state put back."""

    def __init__(self, job: "Job") -> None:
        self.job = job
        self._keep: Any = None

    def state_dict(self) -> dict[str, Any]:
        """The replicated state, as a checkpoint holds it."""
        job = self.job
        state = {"model": job.model.state_dict(), "optimizer": job.optimizer.state_dict(), "rng": _rng_state()}
        if job.scheduler is not None:
            state["scheduler"] = job.scheduler.state_dict()
        if job.extra:
            state["extra"] = {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in job.extra.items()}
        return state

    def state(self) -> tuple[bytes, str, list[tuple]]:
        """The state as the native worker reads it: the header its image and fingerprint
        begin with, the tree (JSON), and each tensor's name, role, dtype, shape and bytes."""
        tree, tensors = _tree.encode(self.state_dict())
        header = json.dumps({"tree": tree, "tensors": [[t.name, t.dtype, list(t.shape)] for t in tensors]},
                            separators=(",", ":")).encode()
        self._keep = tensors          # the native side reads their memory until the next call
        return header, tree, [t.address() for t in tensors]

    def apply(self, step: int, which: int) -> None:
        self.job._apply(self.job._sums[which])

    def at_rest(self, done: int) -> None:
        for hook in self.job._at_rest:
            hook(done)

    def load(self, image: bytearray, header_len: int) -> None:
        header = json.loads(bytes(image[8:8 + header_len]))
        dtypes = _tree._torch_dtypes(torch)
        offset = _align8(8 + header_len)
        tensors = {}
        for name, dtype, shape in header["tensors"]:
            dt = dtypes[dtype]
            n = math.prod(shape)
            size = n * torch.empty((), dtype=dt).element_size()
            flat = torch.frombuffer(image, dtype=dt, count=n, offset=offset) if n else torch.empty(0, dtype=dt)
            tensors[name] = flat.reshape(shape).clone()
            offset = _align8(offset + size)
        self.put_back(_tree.decode(header["tree"], tensors))

    def put_back(self, state: dict[str, Any]) -> None:
        """Makes the job's state `state` (what :meth:`state_dict` gave)."""
        job = self.job
        job.model.load_state_dict(state["model"])
        job.optimizer.load_state_dict(state["optimizer"])
        if job.scheduler is not None:
            job.scheduler.load_state_dict(state["scheduler"])
        for k, v in job.extra.items():
            if hasattr(v, "load_state_dict"):
                v.load_state_dict(state["extra"][k])
            else:
                job.extra[k] = state["extra"][k]
        _set_rng_state(state["rng"])


class Job:
    """An elastic training job over ``model`` and ``optimizer``: ``steps`` steps, each the
    mean gradient of ``micro_batches`` micro-batches.

    ``scheduler``: an LR scheduler stepped after every update. ``extra``: more state to
    replicate, by name (objects with ``state_dict()``/``load_state_dict()``, or plain
    values). ``data=(examples, batch)`` makes :meth:`Step.examples` give each micro-batch's
    examples. ``seed`` seeds the data order, each micro-batch's generator, and (at once)
    torch's, NumPy's and Python's global generators, which are part of the replicated state.
    ``check_every``: compare the replicas' fingerprints after every that many updates (and
    after the last); ``repair``: a replica found holding another state than the others'
    fetches theirs (otherwise the job stops).

    ``checkpoint_dir`` and ``checkpoint_every``: a checkpoint of the whole replicated state
    every that many steps and after the last (an ordinary Steadfast checkpoint that
    ``steadfast.torch.load`` reads), written by the workers in parts, a part each, in the
    background, and committed once every part is durable; ``keep_last`` of them are kept.
    ``resume``: ``"latest"`` (the newest checkpoint under ``checkpoint_dir`` that verifies,
    if any) or a checkpoint's path: the job starts from its state and step, on any number
    of workers, with the bits of the run that never stopped.

    A replacement that starts before the job's end and joins after it (the others went on
    without it and finished) holds nothing of the final state: its iteration says so and
    exits the process with status 0 (`JobOver`, caught), so that nothing after the loop (a
    save, a print of the weights) runs on a state that is not the job's."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, steps: int, micro_batches: int,
                 scheduler: Any = None, extra: Optional[dict[str, Any]] = None,
                 data: Optional[tuple[int, int]] = None, seed: int = 0, check_every: int = 1,
                 repair: bool = True, checkpoint_dir: Any = None, checkpoint_every: int = 0,
                 keep_last: Optional[int] = 3, resume: Any = None) -> None:
        if steps < 0 or micro_batches < 1:
            raise ValueError(f"steps={steps}, micro_batches={micro_batches}: give steps >= 0 and micro_batches >= 1")
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.extra = dict(extra or {})
        self.steps, self.micro_batches, self.seed = steps, micro_batches, seed
        self._params = [p for p in model.parameters() if p.requires_grad]
        odd = [(n, p.dtype, p.device.type) for n, p in model.named_parameters()
               if p.requires_grad and (p.dtype != torch.float32 or p.device.type != "cpu")]
        if odd:
            raise TypeError(f"an elastic job sums float32 gradients in host memory; {odd[0][0]} is {odd[0][1]} on "
                            f"{odd[0][2]}")
        if data is not None:
            examples, batch = data
            if batch % micro_batches or batch > examples:
                raise ValueError(f"a batch of {batch} must split into {micro_batches} equal micro-batches and fit in "
                                 f"{examples} examples")
        self._data = data
        self._order: Optional[tuple[int, torch.Tensor]] = None
        self._n = sum(p.numel() for p in self._params)
        self._sums = [torch.zeros(self._n), torch.zeros(self._n)]
        self._terms: list[torch.Tensor] = []
        # Every worker starts with the same generators: they are part of the replicated
        # state (the model's initial weights are the caller's to seed).
        _seed_generators(seed)
        self._at_rest: list[Any] = []
        self._host = _Host(self)
        if checkpoint_every < 0 or (checkpoint_every and checkpoint_dir is None):
            raise ValueError("checkpoint_every needs a checkpoint_dir (and is at least 0)")
        self._checkpoint = (os.fspath(checkpoint_dir), checkpoint_every, keep_last) if checkpoint_every else None
        #: The step the job starts from (0, or the resumed checkpoint's).
        self.start = 0
        if resume is not None:
            self.start = self._resume(resume, checkpoint_dir)
        self._worker = None
        self._id: Optional[int] = None
        self._incarnation = 0
        if _steadfast.launched():
            try:
                self._worker = _steadfast.ElasticWorker(self._host, self.start, steps, micro_batches,
                                                        [_at(s) for s in self._sums], check_every, repair,
                                                        self._checkpoint)
            except JobOver as e:
                _leave(e)
            # (Read once: the native worker is busy while it calls back into Python.)
            self._id, self._incarnation = self._worker.id, self._worker.incarnation

    @property
    def worker(self) -> Optional[int]:
        """This worker's id in the elastic job (None when it runs alone)."""
        return self._id

    def __iter__(self) -> Iterator[Step]:
        if self._worker is None:
            yield from self._alone()
            return
        worker = self._worker
        # The link to the coordinator closes once the job is over; a worker that stops on
        # an error leaves it open until the process ends, so that the error is printed
        # before the launcher (which takes a closed link for a lost worker) ends it.
        while True:
            try:
                got = worker.next(self._host)
            except JobOver as e:
                worker.close()
                _leave(e)
            except JobError as e:
                if "diverged at step 0" in str(e):
                    raise JobError(str(e) + _UNSEEDED) from None
                raise
            if got is None:
                worker.close()
                return
            index, rank, world = got
            step = Step(self, index, list(range(rank, self.micro_batches, world)))
            yield step
            worker.computed([_at(t) for t in step._terms()])

    def _alone(self) -> Iterator[Step]:
        for index in range(self.start, self.steps):
            step = Step(self, index, list(range(self.micro_batches)))
            yield step
            terms = step._terms()
            _steadfast.mean_of_micro_batches([_at(t) for t in terms], _at(self._sums[0]), self.micro_batches)
            self._apply(self._sums[0])
            done = index + 1
            if self._checkpoint is not None and (done % self._checkpoint[1] == 0 or done == self.steps):
                root, _, keep_last = self._checkpoint
                _st.save(self._host.state_dict(), root, step=done, keep_last=keep_last)
            self._host.at_rest(done)

    def _resume(self, resume: Any, checkpoint_dir: Any) -> int:
        """Puts back the state of the checkpoint ``resume`` names (``"latest"``: the newest
        under ``checkpoint_dir`` that verifies; none there starts at step 0); returns its
        step."""
        path = checkpoint_dir if resume == "latest" else resume
        if path is None:
            raise ValueError("resume='latest' needs a checkpoint_dir")
        if resume == "latest" and not _st.steps(path):
            return 0
        state, info = _st.load(path, with_info=True)
        for key in ("model", "optimizer", "rng"):
            if key not in state:
                raise ValueError(f"{info['dir']} holds no {key!r}: it is not an elastic job's checkpoint")
        self._host.put_back(state)
        if info["step"] > self.steps:
            raise ValueError(f"{info['dir']} is of step {info['step']}, past the job's {self.steps} steps")
        return info["step"]

    @property
    def incarnation(self) -> int:
        """Which process of its worker's slot this is: 0 for the first, counting up with
        each replacement (0 when it runs alone)."""
        return self._incarnation

    def at_rest(self, hook: Any) -> Any:
        """Registers ``hook(steps_done)``, called after each update once the job has taken
        the state's fingerprint: the state is at rest until the next step, and a change made
        then (a fault campaign's bit flip, ``steadfast.inject`` on the model) is what the
        job's check at rest finds and repairs from the replicas. Returns ``hook``."""
        self._at_rest.append(hook)
        return hook

    def weights_sha256(self) -> str:
        """The SHA-256 of the model's weights: every tensor of its ``state_dict()``, in
        order, name and bytes."""
        h = hashlib.sha256()
        for name, t in self.model.state_dict().items():
            h.update(name.encode() + b"\0")
            h.update(t.detach().contiguous().cpu().numpy().tobytes())
        return h.hexdigest()

    # The work the native worker asks for.

    def _term(self, k: int) -> torch.Tensor:
        while len(self._terms) <= k:
            self._terms.append(torch.zeros(self._n))
        return self._terms[k]

    def _views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        views, at = [], 0
        for p in self._params:
            views.append(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
        return views

    def _apply(self, flat: torch.Tensor) -> None:
        for p, v in zip(self._params, self._views(flat)):
            p.grad = v
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        for p in self._params:
            p.grad = None

    def _examples(self, step: int, i: int) -> torch.Tensor:
        if self._data is None:
            raise ValueError("Step.examples needs the job's data=(examples, batch)")
        examples, batch = self._data
        per_epoch = examples // batch
        epoch, at = divmod(step, per_epoch)
        if self._order is None or self._order[0] != epoch:
            order = _steadfast.data_order(self.seed, examples, epoch)
            self._order = (epoch, torch.frombuffer(order, dtype=torch.int32).to(torch.int64))
        size = batch // self.micro_batches
        start = at * batch + i * size
        return self._order[1][start:start + size]
