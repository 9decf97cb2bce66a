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
instant leaves either the whole checkpoint or nothing, and ``load`` of a root falls back,
with a warning, to the newest checkpoint whose every byte verifies. Loading a damaged
checkpoint directory raises :class:`steadfast.CheckpointError` naming the file and tensor.
``load(..., into=...)`` reads straight into tensors you have (a module's parameters).

A loop that draws its batches through a ``DataLoader`` with worker processes uses
:class:`ResumableLoader`, which counts the batches the loop took rather than those the
workers drew ahead, so that the sampler's state resumes at the next batch.
"""
from __future__ import annotations

import operator
import os
import pathlib
import time
import warnings
from typing import Any, Optional, Union

import numpy as np
import torch

from . import _load, _location, _steadfast, _tree
from ._resume import ResumableLoader, ResumableSampler, rng_state, set_rng_state
from ._steadfast import CheckpointError

#: A file or directory name.
_Path = Union[str, "os.PathLike[str]"]

__all__ = [
    "save", "load", "verify", "steps", "Problem", "AsyncCheckpointer", "rng_state", "set_rng_state",
    "ResumableSampler", "ResumableLoader", "CheckpointError",
]



def _local(path):
    """``path`` as the native module takes it: text, with ``~`` expanded to the user's
    home. A URL is refused: checkpoints are written to a file system."""
    text = os.fsdecode(os.fspath(path))
    if "://" in text:
        raise ValueError(f"{text!r} is a URL: Steadfast reads and writes checkpoints on a local or mounted file "
                         "system; mount the bucket (with a FUSE driver such as s3fs or gcsfuse) and give its "
                         "path, or save to a local directory and upload that")
    return os.path.expanduser(text)


def _count(value, name, what):
    """``value`` as an int (anything with ``__index__`` but a bool), or a TypeError that
    says what to give: ``what``."""
    try:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} {value!r} ({type(value).__name__}): give {what}") from None


def _step(step):
    """``step`` as an int, or a TypeError or ValueError that says what to give."""
    value = _count(step, "step", "the step as an int, the count of optimizer steps done")
    if not 0 <= value < 2**63:
        raise ValueError(f"step {value}: give an int from 0 to 2**63 - 1, the count of optimizer steps done")
    return value


def _keep_last(keep_last):
    """``keep_last`` checked: None (keep every checkpoint) or an int of at least 1."""
    if keep_last is None:
        return None
    value = _count(keep_last, "keep_last", "an int, how many of the newest checkpoints to keep, or None to keep all")
    if value < 1:
        raise ValueError(f"keep_last must be at least 1 (it keeps that many of the newest checkpoints), not "
                         f"{value}; give None to keep them all")
    return value


def steps(root: _Path) -> list[int]:
    """The steps of the checkpoints committed under ``root``, ascending (empty when there
    are none, or no such directory)."""
    return _steadfast.steps(_local(root))


def _next_step(root):
    done = steps(root)
    return done[-1] + 1 if done else 0


def save(state: Any, path: _Path, *, step: Optional[int] = None, keep_last: Optional[int] = None,
         overwrite: bool = False) -> pathlib.Path:
    """Saves ``state`` (nested dicts, lists and tuples of tensors, arrays and plain values)
    as the checkpoint of ``step`` under the root directory ``path``, and returns the
    committed directory. ``load`` gives back the same types (README, "Checkpoints"): a
    tensor held under two names is stored once and comes back shared; what could not come
    back as it was is refused, before anything is written. ``path`` is a local or mounted
    directory (``~`` is expanded; a URL is refused). ``step`` (an int, 0 to 2**63 - 1)
    defaults to one after the newest checkpoint there (0 for the first); ``keep_last``
    (None, or at least 1) deletes all but that many of the newest after the commit.
    Blocks until the checkpoint is durable. Raises :class:`CheckpointError` if another
    process writes the same root, or if the root holds a checkpoint of ``step`` that
    verifies, unless ``overwrite`` (one that does not verify, left by a run that resumed
    past it, is replaced with a warning)."""
    path = _local(path)
    step = None if step is None else _step(step)
    keep_last = _keep_last(keep_last)
    # The tensors' bytes are written from where they lie; `tensors` holds every one of
    # them until the save returns.
    tree, tensors = _tree.encode(state, share=True)
    if step is None:
        step = _next_step(path)
    out = _steadfast.save(path, step, [t.address() for t in tensors], tree, keep_last, overwrite=bool(overwrite))
    return pathlib.Path(out)


def load(path: _Path, *, map_location: Any = None, with_info: bool = False, layout: str = "steadfast",
         into: Any = None) -> Any:
    """The state saved in the checkpoint ``path`` names: a checkpoint directory, or a root:
    its newest checkpoint whose every byte verifies. A root's newer checkpoint that does not
    (a damaged manifest, a flipped bit or a truncated shard) is passed over with a warning
    for the one before it, as ``steadfast train --resume latest`` does; a checkpoint
    directory named itself that does not verify raises :class:`CheckpointError`.

    Each file is read once, straight into the tensors that come back, and every byte is
    checked against its checksum as it arrives: the state is never held twice. ``into`` is
    a state of the same structure whose tensors to read into, e.g. ``{"model":
    model.state_dict()}`` (whose tensors are the module's own parameters): each checkpoint
    tensor of the same name goes into its memory (it must have the same dtype and shape),
    so loading a model costs no memory beside it; the returned state holds those very
    tensors. If no checkpoint verifies, the tensors of ``into`` may be partly overwritten.

    Tensors come back on the CPU, or where ``map_location`` says (what ``torch.load``
    accepts: a device, a dict from saved locations to devices, or a callable). A checkpoint
    written by ``steadfast train`` (no state tree) comes back as a flat ``{name: tensor}``
    of its registry names. With ``layout="torch"`` it comes back as the state dict of a
    ``torch.nn`` module whose layers have the names of Steadfast's (``fc1``, ``conv1``,
    ...): the model's tensors only, linear weights transposed to ``[out, in]`` (the layout
    ``steadfast ckpt export --layout torch`` writes), ready for ``module.load_state_dict``.
    With ``with_info``, returns ``(state, info)`` where ``info`` holds ``dir``, ``step``
    and ``skipped`` (the checkpoints passed over, with why)."""
    if layout not in ("steadfast", "torch"):
        raise ValueError(f"layout {layout!r}: give 'steadfast' or 'torch'")
    if into is not None and layout == "torch":
        raise ValueError("into= reads Steadfast's layout; load with layout='torch' and call load_state_dict instead")
    place = _location.mover(map_location)
    targets = {}
    if into is not None:
        _tree_json, listed = _tree.encode(into, share=True)
        targets = {t.name: t.source for t in listed if isinstance(t.source, torch.Tensor)}
    read = _load.read(_local(path), targets=targets, torch_layout=layout == "torch")
    if read.tree is None:
        state = {name: place(t, "cpu") for name, t in read.tensors.items()}
    else:
        try:
            state = _tree.decode(read.tree, read.tensors, place)
        except ValueError as e:
            raise CheckpointError(f"{read.dir}: {e}") from None
    info = {"dir": pathlib.Path(read.dir), "step": read.step, "skipped": read.skipped}
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
    return [Problem(p) for p in _steadfast.verify(_local(path))]


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

    ``stalls`` lists the seconds each ``save`` kept the caller. The first save also maps
    in the memory of its buffers, a page fault per 4 KiB: :meth:`prepare` does that on a
    thread of its own beforehand. ``overwrite`` is :func:`save`'s.
    """

    def __init__(self, root: _Path, *, keep_last: Optional[int] = None, overwrite: bool = False) -> None:
        root = _local(root)
        self.root = pathlib.Path(root)
        self._saver = _steadfast.Saver(root, _keep_last(keep_last), overwrite=bool(overwrite))
        self.stalls = []
        self.committed = None

    def _open(self):
        if self._saver is None:
            raise CheckpointError(f"the AsyncCheckpointer of {self.root} is closed: create a new one to save again")
        return self._saver

    def save(self, state: Any, step: int) -> None:
        """Snapshots ``state`` as the checkpoint of ``step`` and returns as soon as the
        snapshot is taken; a background thread writes and commits it as :func:`save`
        would.

        First waits for the save in flight, if there is one, and raises that save's error
        if it failed (its checkpoint was not committed; this one is not taken). Then
        copies every tensor's values (from a GPU too) into host buffers that the
        checkpointer reuses from one save to the next: once it returns, the loop may
        change its tensors. Other values are encoded into the checkpoint's state tree at
        once. ``committed`` names the newest committed checkpoint; :meth:`wait` waits for
        this one. Raises :class:`CheckpointError` once the checkpointer is closed."""
        saver = self._open()
        step = _step(step)
        started = time.perf_counter()
        # The tensors' memory is read where it lies, into buffers the checkpointer keeps
        # from one save to the next; `tensors` holds every tensor until that copy is done.
        tree, tensors = _tree.encode(state, share=True)
        done = saver.snapshot(step, [t.address() for t in tensors], tree)
        del tensors
        if done is not None:
            self.committed = pathlib.Path(done)
        self.stalls.append(time.perf_counter() - started)

    def prepare(self, state: Any) -> None:
        """Makes the buffers that saves of states like ``state`` (the same tensors' sizes,
        in the same order) copy into, on a background thread, and returns at once: the
        first :meth:`save` then stalls the loop no longer than the later ones. Call it
        once, before the loop's first steps; waits for the save in flight, if any."""
        saver = self._open()
        _tree_json, tensors = _tree.encode(state, share=True)
        done = saver.prepare([t.address()[5] for t in tensors])
        if done is not None:
            self.committed = pathlib.Path(done)

    def wait(self) -> Optional[pathlib.Path]:
        """Waits for the save in flight; raises its error if it failed."""
        done = self._open().wait()
        if done is not None:
            self.committed = pathlib.Path(done)
        return self.committed

    def busy(self) -> bool:
        """Whether a save is in flight."""
        return self._open().busy()

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
