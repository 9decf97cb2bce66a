"""Reading a checkpoint's tensors straight into torch tensors, every byte verified on the
way, and passing over a checkpoint whose data does not verify for the one before it.

A load is two calls into the native module: ``open_checkpoint`` reads and checks the
manifest (names, dtypes, shapes, lengths, the state tree), then this module allocates one
tensor per stored tensor (or takes the caller's own, where ``into`` gives one that fits)
and ``read_into`` reads each file once into that memory, hashing each chunk as it arrives.
So a load holds the state once, never a copy beside it, and no tensor reaches the caller
before all of its checkpoint verified.
"""
from __future__ import annotations

import json
import warnings
from typing import Any, Optional

import torch

from . import _steadfast, _tree
from ._steadfast import CheckpointError

_TORCH = _tree._torch_dtypes(torch)


class Read:
    """What a load read: the checkpoint's directory, step and state tree, its tensors by
    name, and the newer checkpoints passed over on the way, with why."""

    __slots__ = ("dir", "step", "tree", "tensors", "skipped")

    def __init__(self, opened, tensors, skipped):
        self.dir, self.step, self.tree = opened.dir, opened.step, opened.tree
        self.tensors, self.skipped = tensors, skipped


def read(path: str, *, targets: Optional[dict[str, torch.Tensor]] = None, torch_layout: bool = False) -> Read:
    """The tensors of the checkpoint ``path`` names (a checkpoint directory, or a root: its
    newest checkpoint whose every byte verifies). A root's checkpoint that fails, in its
    manifest or in its data, is passed over with a warning for the one before it, as
    ``steadfast train --resume latest`` does. ``targets`` maps stored names to tensors to
    read into (the caller's own: a model's parameters); with ``torch_layout``, the model's
    tensors in ``torch.nn``'s names and layout (``ckpt export --layout torch``)."""
    skipped: list[tuple[Any, str]] = []
    below = None
    while True:
        try:
            opened = _steadfast.open_checkpoint(path, below)
        except CheckpointError:
            if below is None:
                raise
            reasons = "; ".join(f"{d}: {why}" for d, why in skipped)
            raise CheckpointError(f"{path}: no checkpoint in it verifies ({reasons})") from None
        skipped.extend(opened.skipped)
        # A mismatch with `into`, or a layout the checkpoint cannot take, is the caller's:
        # raised, not passed over for an older checkpoint.
        if torch_layout and opened.tree is not None:
            raise CheckpointError(f"{opened.dir} holds a framework's state (it was saved from Python), already in "
                                  "that framework's layout: load it with layout='steadfast'")
        plan = None if torch_layout else _plan(opened, targets or {})
        try:
            tensors = _layout_torch(opened) if torch_layout else _read(opened, plan)
        except CheckpointError as e:
            if not opened.in_root:
                raise
            skipped.append((opened.dir, str(e)))
            below = opened.step
            continue
        for dir, why in skipped:
            warnings.warn(f"{path}: passing over {dir}, which did not check out ({why}); "
                          f"loading step {opened.step}", stacklevel=3)
        return Read(opened, tensors, skipped)


def _layout_torch(opened) -> dict[str, torch.Tensor]:
    out = {}
    for name, dtype, shape, data in opened.torch_layout():
        out[name] = torch.frombuffer(data, dtype=torch.uint8).view(_TORCH[dtype]).reshape(tuple(shape)) \
            if len(data) else torch.empty(tuple(shape), dtype=_TORCH[dtype])
    return out


def _shared_names(tree: Optional[str]) -> dict[str, str]:
    """The second names of tensors stored once under their first (tied weights): ``{second:
    first}``, from the tree's nodes that say ``shares``."""
    if tree is None or '"shares"' not in tree:
        return {}
    found = {}

    def walk(node):
        if isinstance(node, dict):
            if "shares" in node and "tensor" in node:
                found[node["tensor"]] = node["shares"]
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(tree))
    return found


def _plan(opened, targets: dict[str, torch.Tensor]) -> list:
    """Per stored tensor: ``[name, the memory read into, where to copy it afterwards (or
    None), the caller's tensor of that name (or None)]``, plus a last entry of the
    caller's tensors under a tied weight's second name, to be copied from the first.
    Checks ``targets`` against the checkpoint first: a name it lacks, or another dtype or
    shape, raises before anything is written."""
    stored = opened.tensors
    shared = _shared_names(opened.tree) if targets else {}
    names = {name for name, *_ in stored}
    missing = sorted(set(targets) - names - set(shared))
    if missing:
        raise CheckpointError(f"{opened.dir}: `into` has tensors the checkpoint does not hold: {missing[:5]}")
    plan = []
    for name, _role, dtype, shape, length in stored:
        if dtype not in _TORCH:
            raise CheckpointError(f"{opened.dir}: tensor {name} is {dtype}, which this PyTorch has no dtype for")
        want, shape = _TORCH[dtype], tuple(shape)
        for alias in [name] + [second for second, first in shared.items() if first == name and second in targets]:
            target = targets.get(alias)
            if target is not None and (target.dtype != want or tuple(target.shape) != shape):
                raise CheckpointError(f"{opened.dir}: tensor {alias} is {dtype} {list(shape)}, `into` has "
                                      f"{target.dtype} {list(target.shape)} there")
        target = targets.get(name)
        if target is None:
            plan.append([name, torch.empty(shape, dtype=want), None, None])
        elif target.device.type == "cpu" and target.is_contiguous():
            plan.append([name, target.detach(), None, target])
        else:
            plan.append([name, torch.empty(shape, dtype=want), target, target])
    _share_nothing(plan)
    seconds = [(first, targets[second]) for second, first in shared.items() if second in targets]
    return plan + [seconds]


def _read(opened, plan: list) -> dict[str, torch.Tensor]:
    *plan, seconds = plan
    opened.read_into([(t.data_ptr() if t.numel() else 0, t.numel() * t.element_size()) for _, t, _, _ in plan])
    out = {}
    with torch.no_grad():
        for name, t, copy_to, user in plan:
            if copy_to is not None:
                copy_to.copy_(t)
            elif user is not None:
                # Written behind autograd's back: tell it, as an in-place copy would.
                _bump_version(user)
            out[name] = t if user is None else user
        for first, target in seconds:
            if target.data_ptr() != out[first].data_ptr():   # an untied module: its own copy
                target.copy_(out[first])
    return out


def _share_nothing(plan: list) -> None:
    """Reads into a fresh tensor, and copies afterwards, where a target's memory overlaps
    an earlier one's (the caller's tied weights, saved twice by an older checkpoint):
    the native side writes each buffer through a slice of its own."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), i)
                   for i, (_, t, copy_to, _) in enumerate(plan) if copy_to is None and t.numel())
    end = 0
    for start, stop, i in spans:
        if start < end:
            t = plan[i][1]
            plan[i][1], plan[i][2] = torch.empty_like(t), t
        end = max(end, stop)


def _bump_version(t: torch.Tensor) -> None:
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is not None:
        bump(t)
