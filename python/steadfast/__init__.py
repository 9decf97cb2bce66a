"""Steadfast for PyTorch users: verified, crash-safe checkpoints that restart exactly.

The work is done by Steadfast's Rust core (the native module ``steadfast._steadfast``);
this package is the glue that reaches it from a Python training loop.

- :func:`inject`, :func:`replay`, :func:`undo` (:mod:`steadfast.faults`): bit flips in
  checkpoint files of every format ``steadfast inject`` reads, and in tensors, modules
  and state dicts in memory, with its plans and logs.
- :mod:`steadfast.fpna`: the FPNA study's variability metrics on tensors.
- :mod:`steadfast.torch`: ``save``, ``load`` and ``verify`` of nested state (model,
  optimizer, scalars, random generators) in Steadfast's checkpoint format, the
  ``AsyncCheckpointer`` (training waits for the snapshot only), the state an exact
  restart needs beyond the state dicts (``rng_state``, ``ResumableSampler`` and, for a
  ``DataLoader`` with workers, ``ResumableLoader``), and
  ``load(..., layout="torch")`` of what ``steadfast train`` wrote into a ``torch.nn``
  module.
- :mod:`steadfast.ddp`: a DDP communication hook and micro-batch helper whose final
  weights are the same bits on any number of processes.

Checkpoints written here are ordinary Steadfast checkpoints: ``steadfast ckpt verify``,
``ckpt inspect`` and ``inject`` work on them, and every byte is covered by a checksum, so
a flipped bit or a truncated file is an error naming the file and tensor, never a state
that loads silently wrong.
"""
from ._steadfast import FORMAT_VERSION, CheckpointError, InjectError
from ._steadfast import __version__
from .faults import inject, replay, tensors_in, undo

__all__ = ["CheckpointError", "FORMAT_VERSION", "InjectError", "__version__", "inject", "replay", "undo", "tensors_in"]
