"""Verified, crash-safe checkpoints of a PyTorch loop, and what an exact restart needs.

Saving::

    import steadfast.torch as st

    state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
             "step": step, "rng": st.rng_state(), "sampler": sampler.state_dict()}
    st.save(state, "ckpt", step=step)          # ckpt/step-00000100/, committed atomically

Resuming::

    state = st.load("ckpt")                    # the newest checkpoint that verifies
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    st.set_rng_state(state["rng"])
    sampler.load_state_dict(state["sampler"])

A checkpoint is a directory of safetensors shards and a manifest, written last, that
checksums every byte; it only gets its ``step-*`` name once complete, so a kill at any
instant leaves either the whole checkpoint or nothing, and ``load`` of a root falls back
to the newest checkpoint that verifies. Loading a damaged one raises
:class:`steadfast.CheckpointError` naming the file and tensor.
"""
from __future__ import annotations

import os
import pathlib
import random
import time
import warnings
from typing import Any, Iterator, Optional, Sized, Union

import numpy as np
import torch

from . import _steadfast, _tree
from ._steadfast import CheckpointError

#: A file or directory name.
_Path = Union[str, "os.PathLike[str]"]

__all__ = [
    "save", "load", "verify", "steps", "Problem", "AsyncCheckpointer", "rng_state", "set_rng_state",
    "ResumableSampler", "CheckpointError",
]

_TORCH = _tree._torch_dtypes(torch)


def _to_torch(dtype, shape, data):
    if dtype not in _TORCH:
        raise CheckpointError(f"this PyTorch has no dtype for {dtype}")
    if len(data) == 0:
        return torch.empty(tuple(shape), dtype=_TORCH[dtype])
    return torch.frombuffer(data, dtype=torch.uint8).view(_TORCH[dtype]).reshape(tuple(shape))


def steps(root: _Path) -> list[int]:
    """The steps of the checkpoints committed under ``root``, ascending (empty when there
    are none, or no such directory)."""
    return _steadfast.steps(os.fspath(root))


def _next_step(root):
    done = steps(root)
    return done[-1] + 1 if done else 0


def save(state: Any, path: _Path, *, step: Optional[int] = None, keep_last: Optional[int] = None) -> pathlib.Path:
    """Saves ``state`` (nested dicts, lists and tuples of tensors, arrays and plain values)
    as the checkpoint of ``step`` under the root directory ``path``, and returns the
    committed directory. ``step`` defaults to one after the newest checkpoint there (0 for
    the first); ``keep_last`` deletes all but that many of the newest after the commit.
    Blocks until the checkpoint is durable. Raises :class:`CheckpointError` if another
    process writes the same root."""
    # The tensors' bytes are written from where they lie; `tensors` holds every one of
    # them until the save returns.
    tree, tensors = _tree.encode(state)
    if step is None:
        step = _next_step(path)
    out = _steadfast.save(os.fspath(path), int(step), [t.address() for t in tensors], tree, keep_last)
    return pathlib.Path(out)


def load(path: _Path, *, map_location: Any = None, with_info: bool = False, layout: str = "steadfast") -> Any:
    """The state saved in the checkpoint ``path`` names: a checkpoint directory, or a root
    (its newest checkpoint that verifies; newer ones that do not are skipped with a
    warning). Every checksum is verified first. Tensors come back on the CPU, or moved to
    ``map_location``. A checkpoint written by ``steadfast train`` (no state tree) comes
    back as a flat ``{name: tensor}`` of its registry names. With ``layout="torch"`` it
    comes back as the state dict of a ``torch.nn`` module whose layers have the names of
    Steadfast's (``fc1``, ``conv1``, ...): the model's tensors only, linear weights
    transposed to ``[out, in]`` (the layout ``steadfast ckpt export --layout torch``
    writes), ready for ``module.load_state_dict``. With ``with_info``, returns
    ``(state, info)`` where ``info`` holds ``dir``, ``step`` and ``skipped``."""
    if layout not in ("steadfast", "torch"):
        raise ValueError(f"layout {layout!r}: give 'steadfast' or 'torch'")
    raw = _steadfast.load(os.fspath(path), torch_layout=layout == "torch")
    for skipped, reason in raw["skipped"]:
        warnings.warn(f"skipped {skipped}: {reason}", stacklevel=2)
    buffers = {name: (dtype, shape, data) for name, _role, dtype, shape, data in raw["tensors"]}

    def to_torch(dtype, shape, data):
        t = _to_torch(dtype, shape, data)
        return t if map_location is None else t.to(map_location)

    if raw["tree"] is None:
        state = {name: to_torch(*b) for name, b in buffers.items()}
    else:
        try:
            state = _tree.decode(raw["tree"], buffers, to_torch)
        except ValueError as e:
            raise CheckpointError(f"{raw['dir']}: {e}") from None
    info = {"dir": pathlib.Path(raw["dir"]), "step": raw["step"], "skipped": raw["skipped"]}
    return (state, info) if with_info else state


class Problem(tuple):
    """One problem that :func:`verify` found: ``(file, tensor or None, reason)``."""

    __slots__ = ()

    @property
    def file(self):
        return self[0]

    @property
    def tensor(self):
        return self[1]

    @property
    def reason(self):
        return self[2]

    def __str__(self):
        where = f"{self.file}" + (f" (tensor {self.tensor})" if self.tensor else "")
        return f"{where}: {self.reason}"


def verify(path: _Path) -> list[Problem]:
    """Every problem of what ``path`` names, each a :class:`Problem`; an empty list when
    every byte checks out. The same check as ``steadfast ckpt verify``: a checkpoint
    directory alone, or a root's every committed checkpoint (files named
    ``step-<N>/<file>``) and its ``LATEST``."""
    return [Problem(p) for p in _steadfast.verify(os.fspath(path))]


class AsyncCheckpointer:
    """Checkpoints that cost the training loop only their snapshot.

    ``save(state, step)`` copies every tensor into host buffers that the checkpointer
    reuses from one save to the next (the loop may change its tensors as soon as it
    returns; it must not change them from another thread during the call) and hands the
    copy to a background thread, which
    writes and commits it as :func:`save` would. At most one save is in flight: the next
    ``save`` first waits for it. The checkpointer holds the root's writer lock while it
    lives, so a second run on the same root fails at once instead of corrupting this
    one's checkpoints; ``close`` (or leaving a ``with`` block) waits and releases it. A
    kill at any instant leaves the newest committed checkpoint loadable.

    ``stalls`` lists the seconds each ``save`` kept the caller.
    """

    def __init__(self, root: _Path, *, keep_last: Optional[int] = None) -> None:
        self.root = pathlib.Path(root)
        self._saver = _steadfast.Saver(os.fspath(root), keep_last)
        self.stalls = []
        self.committed = None

    def save(self, state: Any, step: int) -> Optional[pathlib.Path]:
        started = time.perf_counter()
        # The tensors' memory is read where it lies, into buffers the checkpointer keeps
        # from one save to the next; `tensors` holds every tensor until that copy is done.
        tree, tensors = _tree.encode(state)
        done = self._saver.snapshot(int(step), [t.address() for t in tensors], tree)
        del tensors
        if done is not None:
            self.committed = pathlib.Path(done)
        self.stalls.append(time.perf_counter() - started)

    def wait(self) -> Optional[pathlib.Path]:
        """Waits for the save in flight; raises its error if it failed."""
        done = self._saver.wait()
        if done is not None:
            self.committed = pathlib.Path(done)
        return self.committed

    def busy(self) -> bool:
        return self._saver.busy()

    def close(self) -> None:
        if self._saver is not None:
            try:
                self.wait()
            finally:
                self._saver = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def rng_state() -> dict[str, Any]:
    """Every random generator a PyTorch loop draws from: torch's (CPU, and CUDA's when
    present), NumPy's global one and Python's ``random``. Save it with the state dicts;
    :func:`set_rng_state` puts it back."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class ResumableSampler(torch.utils.data.Sampler):
    """A shuffling sampler that knows where it is, so that a restarted loop visits the
    remaining examples of the epoch in the same order.

    Epoch ``e`` visits the permutation of ``range(n)`` that is a pure function of
    ``(seed, e)``: the order ``steadfast train`` uses for the same seed, so a PyTorch
    loop can see the data exactly as Steadfast's trainer does. ``state_dict()`` records
    the epoch and how many indices were handed out; a new sampler given it continues from
    there. Iterating past the end of an epoch moves to the next one.
    """

    def __init__(self, data_source: Union[int, Sized], *, seed: int = 0, shuffle: bool = True) -> None:
        self.n = data_source if isinstance(data_source, int) else len(data_source)
        if self.n < 0:
            raise ValueError(f"a sampler over {self.n} examples")
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.epoch, self.position = 0, 0

    def order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.n)
        raw = _steadfast.data_order(self.seed, self.n, int(epoch))
        return torch.from_numpy(np.frombuffer(raw, dtype="<u4").astype(np.int64))

    def __iter__(self):
        order = self.order(self.epoch)
        while self.position < self.n:
            i = int(order[self.position])
            self.position += 1
            yield i
        self.epoch, self.position = self.epoch + 1, 0

    def __len__(self):
        return self.n - self.position

    def batches(self, batch_size: int) -> Iterator[torch.Tensor]:
        """Endless batches of ``batch_size`` indices (int64 tensors), epoch after epoch;
        an epoch's last, short batch is dropped. The sampler's position advances by each
        batch as it is handed out, so ``state_dict()`` taken between batches resumes at the
        next one. Every process that iterates a sampler of the same seed sees the same
        batches: the global batches a data-parallel job splits into micro-batches."""
        if batch_size < 1 or batch_size > self.n:
            raise ValueError(f"a batch of {batch_size} from {self.n} examples")
        while True:
            order = self.order(self.epoch)
            while self.position + batch_size <= self.n:
                batch = order[self.position:self.position + batch_size]
                self.position += batch_size
                yield batch
            self.epoch, self.position = self.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = int(epoch), 0

    def state_dict(self, position: Optional[int] = None) -> dict[str, Any]:
        """Where the sampler is. ``position`` overrides how many indices of the epoch were
        consumed: a DataLoader with worker processes draws indices ahead of the batches
        the loop has taken, so such a loop passes its own count."""
        return {"seed": self.seed, "n": self.n, "epoch": self.epoch,
                "position": self.position if position is None else int(position), "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["seed"], state["n"], state["shuffle"]) != (self.seed, self.n, self.shuffle):
            raise ValueError(f"a sampler of seed {state['seed']} over {state['n']} examples cannot resume one of "
                             f"seed {self.seed} over {self.n}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.n:
            raise ValueError(f"epoch {epoch}, position {position}: not a place in an epoch of {self.n} examples")
        self.epoch, self.position = epoch, position

