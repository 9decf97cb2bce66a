"""Bit flips in checkpoint files, as ``steadfast inject`` makes them.

The plans, logs, replay and undo are the Rust core's, the same as the command's: a fault
named by the same knobs with the same seed flips the same bits, and a log written here
replays or undoes with ``steadfast inject --replay/--undo`` and the other way round. The
files may be Steadfast checkpoints (a directory, or a root: its newest checkpoint) or a
safetensors, PyTorch ``.pt``/``.pth``, NumPy ``.npz`` or HDF5 ``.h5`` file.

    log = steadfast.inject("model.pt", out="altered.pt", target="fc1.*", bits="exponent", count=3, seed=1)
    for flip in log["flips"]:
        print(flip["tensor"], flip["element"], flip["old_value"], "->", flip["new_value"])
    steadfast.undo("altered.pt", log)          # the original bytes again
"""
import json
import os

from . import _steadfast
from ._steadfast import InjectError

__all__ = ["inject", "replay", "undo", "tensors_in", "InjectError"]


def _fs(path):
    return None if path is None else os.fspath(path)


def _log_text(log):
    if isinstance(log, dict):
        return json.dumps(log)
    with open(log) as f:
        return f.read()


def inject(path, *, out=None, target=None, role=None, bits="any", count=None, rate=None, burst=1, seed=0,
           keep_checksums=False, allow_corrupt_input=False, log=None):
    """Flips bits in the tensors of ``path`` (in place, or in a copy at ``out``) and returns
    the log as a dict. ``target`` is a glob over tensor names, ``role`` one of ``model``,
    ``optim``, ``extra``; ``bits`` is ``sign``, ``exponent``, ``mantissa``, ``any``, a
    position ``N`` or a range ``N-M``; ``count`` flips (one by default) or each candidate bit
    with probability ``rate``, in bursts of ``burst`` adjacent bits. A Steadfast
    checkpoint's checksums are rewritten (as corruption before checksumming would leave
    them) unless ``keep_checksums``. The log is written to ``log`` (default: beside the
    altered file, ``<name>.inject.json``) before an altered copy appears."""
    text = _steadfast.inject(
        os.fspath(path), out=_fs(out), target=target, role=role, bits=str(bits), count=count, rate=rate,
        burst=burst, seed=seed, keep_checksums=keep_checksums, allow_corrupt_input=allow_corrupt_input,
        log=_fs(log))
    return json.loads(text)


def replay(path, log, *, out=None, log_out=None):
    """Applies the flips of ``log`` (a dict from :func:`inject`, or a log file's path) to
    ``path`` again, or to a copy at ``out``; each element must hold the log's old bytes.
    Returns the new log."""
    return json.loads(_steadfast.replay(os.fspath(path), _log_text(log), out=_fs(out), log_out=_fs(log_out)))


def undo(path, log, *, out=None):
    """Restores the bytes that ``log`` altered in ``path`` (or in a copy at ``out``); each
    element must hold the log's new bytes."""
    _steadfast.undo(os.fspath(path), _log_text(log), out=_fs(out))


def tensors_in(path):
    """The tensors found in ``path``: a list of dicts with ``name``, ``role``, ``dtype`` and
    ``shape``."""
    return [{"name": n, "role": r, "dtype": d, "shape": s} for n, r, d, s in _steadfast.tensors_in(os.fspath(path))]
