"""Bit flips in checkpoint files and in tensors held in memory, as ``steadfast inject``
makes them.

The plans, logs, replay and undo are the Rust core's, the same as the command's: a fault
named by the same knobs with the same seed flips the same bits, and a log written here
replays or undoes with ``steadfast inject --replay/--undo`` and the other way round. What
is altered is either a path or live state:

- a file: a Steadfast checkpoint (a directory, or a root: its newest checkpoint) or a
  safetensors, PyTorch ``.pt``/``.pth``, NumPy ``.npz`` or HDF5 ``.h5`` file;
- state in memory: a tensor or NumPy array, a module (its ``state_dict()``), an optimizer
  (its ``state_dict()``), or nested dicts, lists and tuples of them, such as a training
  state dict. The flips land in the tensors themselves; tensors are named by their key
  paths joined by dots (``model.fc1.weight``), as ``steadfast.torch.save`` names them, and
  a state's top-level keys give them roles (``model``, ``optimizer`` -> ``optim``).

    log = steadfast.inject("model.pt", out="altered.pt", target="fc1.*", bits="exponent", count=3, seed=1)
    for flip in log["flips"]:
        print(flip["tensor"], flip["element"], flip["old_value"], "->", flip["new_value"])
    steadfast.undo("altered.pt", log)          # the original bytes again

    log = steadfast.inject(model, target="*.weight", bits="exponent", count=1, seed=3)
    steadfast.undo(model, log)                 # the weights as they were
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional, Union

import numpy as np

from . import _steadfast, _tree
from ._steadfast import InjectError

#: A file or directory name.
_Path = Union[str, "os.PathLike[str]"]

__all__ = ["inject", "replay", "undo", "tensors_in", "InjectError"]


def _fs(path):
    return None if path is None else os.fspath(path)


def _log_text(log):
    if isinstance(log, dict):
        return json.dumps(log)
    with open(log) as f:
        return f.read()


def _is_path(target):
    return isinstance(target, (str, bytes, os.PathLike))


def _live(state):
    """``state`` with each module and optimizer, wherever it is nested, replaced by its state
    dict (an optimizer's under the key ``optimizer`` when it is the whole state, so that its
    tensors are named and given a role as in a checkpoint)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return state

    def walk(x):
        if isinstance(x, torch.nn.Module):
            return x.state_dict()
        if isinstance(x, torch.optim.Optimizer):
            return x.state_dict()
        if isinstance(x, dict):
            return type(x)((k, walk(v)) for k, v in x.items()) if not hasattr(x, "_metadata") else x
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        return x

    if isinstance(state, torch.optim.Optimizer):
        return {"optimizer": state.state_dict()}
    return walk(state)


def _extent(src):
    """The bytes ``[low, high)`` that a (non-empty) tensor or array spans in memory."""
    if isinstance(src, np.ndarray):
        start, size = src.__array_interface__["data"][0], src.itemsize
        reach = [(n - 1) * s for n, s in zip(src.shape, src.strides)]     # strides in bytes, maybe negative
        return start + sum(r for r in reach if r < 0), start + sum(r for r in reach if r > 0) + size
    low = src.data_ptr()
    span = 1 + sum((n - 1) * s for n, s in zip(src.shape, src.stride()))
    return low, low + span * src.element_size()


class _InMemory:
    """The tensors of live state, each once, with what has to be copied back.

    A tensor that appears under several names (tied weights) is altered through its first
    name; the others are its aliases. Two different views of overlapping memory (a tensor
    and its transpose, overlapping slices) are refused: a flip made through one would be
    overwritten when the other's copy is written back."""

    def __init__(self, state):
        try:
            _, tensors = _tree.encode(_live(state))
        except TypeError as e:
            raise TypeError(str(e).replace("cannot save", "cannot alter")) from None
        self.tensors, self.aliases, first = [], {}, {}
        for t in tensors:
            view = self._view(t)
            if view is not None and view in first:
                self.aliases[t.name] = first[view]
                continue
            if view is not None:
                first[view] = t.name
            if isinstance(t.source, np.ndarray) and not t.source.flags.writeable:
                raise ValueError(f"{t.name}: the array is read-only")
            self.tensors.append(t)
        spans = sorted((*_extent(t.source), t.name) for t in self.tensors if self._view(t) is not None)
        for (_, high, a), (low, _, b) in zip(spans, spans[1:]):
            if low < high:
                raise ValueError(f"{a} and {b} are different views of overlapping memory: alter the tensor they "
                                 "both view, or one of them alone")

    @staticmethod
    def _view(t):
        """What makes two tensors the same tensor: memory, offset, strides, shape, dtype."""
        src = t.source
        if hasattr(src, "untyped_storage"):
            if src.numel() == 0:
                return None
            return (src.untyped_storage().data_ptr(), src.storage_offset(), tuple(src.stride()), tuple(src.shape),
                    src.dtype)
        return None if src.nbytes == 0 else (src.__array_interface__["data"][0], src.strides, src.shape, src.dtype)

    def addresses(self):
        return [t.address() for t in self.tensors]

    def hint(self, target):
        """Why a target that matched nothing may have meant an alias."""
        import fnmatch
        hits = sorted(a for a in self.aliases if target is not None and fnmatch.fnmatchcase(a, target))
        if not hits:
            return ""
        return "; " + ", ".join(f"{a} is the same tensor as {self.aliases[a]}" for a in hits) + ": target that name"

    def write_back(self):
        """Copies each flipped value into a source that the flips could not reach directly
        (a tensor on a device, or not contiguous)."""
        for t in self.tensors:
            if not _tree.same_memory(t.data, t.source):
                if hasattr(t.source, "copy_"):
                    with sys.modules["torch"].no_grad():
                        t.source.copy_(t.data)
                else:
                    t.source[...] = t.data


def inject(subject: Any, *, out: Optional[_Path] = None, target: Optional[str] = None, role: Optional[str] = None,
           bits: Union[str, int] = "any", count: Optional[int] = None, rate: Optional[float] = None, burst: int = 1,
           seed: int = 0, keep_checksums: bool = False, allow_corrupt_input: bool = False,
           log: Optional[_Path] = None) -> dict[str, Any]:
    """Flips bits in the tensors of ``subject`` and returns the log as a dict.

    ``subject`` is a file or checkpoint (altered in place, or in a copy at ``out``) or
    state in memory (altered where it lies). ``target`` is a glob over tensor names,
    ``role`` one of ``model``, ``optim``, ``extra``; ``bits`` is ``sign``, ``exponent``,
    ``mantissa``, ``any``, a position ``N`` or a range ``N-M``; ``count`` flips (one by
    default) or each candidate bit with probability ``rate``, in bursts of ``burst``
    adjacent bits.

    For files: a Steadfast checkpoint's checksums are rewritten (as corruption before
    checksumming would leave them) unless ``keep_checksums``; the log is written to
    ``log`` (default: beside the altered file, ``<name>.inject.json``) before an altered
    copy appears. For state in memory, the log is written to ``log`` if given."""
    if _is_path(subject):
        text = _steadfast.inject(
            os.fspath(subject), out=_fs(out), target=target, role=role, bits=str(bits), count=count, rate=rate,
            burst=burst, seed=seed, keep_checksums=keep_checksums, allow_corrupt_input=allow_corrupt_input,
            log=_fs(log))
        return json.loads(text)
    if out is not None or keep_checksums or allow_corrupt_input:
        raise ValueError("out, keep_checksums and allow_corrupt_input are for files; state in memory is altered "
                         "where it lies")
    state = _InMemory(subject)
    try:
        text = _steadfast.inject_memory(state.addresses(), target=target, role=role, bits=str(bits), count=count,
                                        rate=rate, burst=burst, seed=seed)
    except InjectError as e:
        raise InjectError(f"{e}{state.hint(target)}") from None
    state.write_back()
    if log is not None:
        with open(log, "w") as f:
            f.write(text)
    return json.loads(text)


def replay(subject: Any, log: Union[dict[str, Any], _Path], *, out: Optional[_Path] = None,
           log_out: Optional[_Path] = None) -> dict[str, Any]:
    """Applies the flips of ``log`` (a dict from :func:`inject`, or a log file's path) to
    ``subject`` (a file, or state in memory) again, or to a copy of a file at ``out``; each
    element must hold the log's old bytes, and nothing changes unless all do. Returns the
    new log."""
    if _is_path(subject):
        return json.loads(_steadfast.replay(os.fspath(subject), _log_text(log), out=_fs(out), log_out=_fs(log_out)))
    state = _InMemory(subject)
    text = _steadfast.replay_memory(state.addresses(), _log_text(log))
    state.write_back()
    return json.loads(text)


def undo(subject: Any, log: Union[dict[str, Any], _Path], *, out: Optional[_Path] = None) -> None:
    """Restores the bytes that ``log`` altered in ``subject`` (a file, or state in memory),
    or in a copy of a file at ``out``; each element must hold the log's new bytes, and
    nothing changes unless all do."""
    if _is_path(subject):
        _steadfast.undo(os.fspath(subject), _log_text(log), out=_fs(out))
        return
    state = _InMemory(subject)
    _steadfast.undo_memory(state.addresses(), _log_text(log))
    state.write_back()


def tensors_in(subject: Any) -> list[dict[str, Any]]:
    """The tensors found in ``subject`` (a file, or state in memory): a list of dicts with
    ``name``, ``role``, ``dtype`` and ``shape``; in memory, a tensor that appears under a
    second name is listed under it too, with ``alias_of`` its first name (flips are made
    and logged through that one)."""
    if _is_path(subject):
        found = _steadfast.tensors_in(os.fspath(subject))
        return [{"name": n, "role": r, "dtype": d, "shape": s} for n, r, d, s in found]
    state = _InMemory(subject)
    found = {t.name: {"name": t.name, "role": t.role, "dtype": t.dtype, "shape": list(t.shape)}
             for t in state.tensors}
    return list(found.values()) + [{**found[first], "name": alias, "alias_of": first}
                                   for alias, first in state.aliases.items()]
