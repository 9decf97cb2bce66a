"""Comparing states bit for bit, for the tests: ``same(a, b)`` asserts that ``b`` has the
types, structure and bits of ``a`` all the way down."""
import struct

import numpy as np
import torch


def raw(t):
    """A tensor's bytes, in row-major order."""
    t = t.detach().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same(a, b, path="state"):
    """``a`` and ``b`` are equal bit for bit, with the same types (and, for tensors, the
    same ``requires_grad``) all the way down."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} became {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert (a.dtype, tuple(a.shape), a.requires_grad) == (b.dtype, tuple(b.shape), b.requires_grad), path
        assert raw(a) == raw(b), path
    elif isinstance(a, np.ndarray):
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} became {list(b)}"
        assert getattr(a, "default_factory", None) is getattr(b, "default_factory", None), path
        if hasattr(a, "_metadata") or hasattr(b, "_metadata"):
            same(getattr(a, "_metadata", None), getattr(b, "_metadata", None), f"{path}._metadata")
        for k in a:
            same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert struct.pack(">d", a) == struct.pack(">d", b), f"{path}: {a!r} became {b!r}"
    else:
        assert a == b, f"{path}: {a!r} became {b!r}"
