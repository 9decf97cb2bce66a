"""The FPNA lab's run-to-run variability metrics on torch tensors and NumPy arrays.

The metrics are those of the floating-point non-associativity study, computed by the Rust
core (``repro::metrics``) as ``steadfast fpna`` computes them:

- ``scalar_variability(nd, d)``: ``V_s = 1 - |nd / d|`` of a scalar against the reference.
- ``variability(nd, d)``: for arrays, the mean and largest element-wise relative difference
  ``|nd_i - d_i| / |d_i|`` (``|nd_i|`` where ``d_i = 0``) and the fraction of elements whose
  bits differ.
- ``distinct_outputs(outputs)``: how many results of repeated runs differ in at least one bit.
- ``measure(fn, runs)``: runs ``fn`` repeatedly and reports all of them against its first
  result (or a given reference), e.g. to see what ``torch.use_deterministic_algorithms``
  changes::

      import torch, steadfast.fpna as fpna
      x = torch.randn(1 << 16)
      index = torch.randint(0, 100, (1 << 16,))
      report = fpna.measure(lambda: torch.zeros(100).index_add_(0, index, x), runs=20)
      report["distinct"], report["max_fraction_differing"]
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np

from . import _steadfast

__all__ = ["scalar_variability", "variability", "distinct_outputs", "measure"]


def _array(x):
    """A C-contiguous little-endian float32 or float64 NumPy array of ``x``'s values
    (half precision widened exactly to float32)."""
    if hasattr(x, "detach"):  # a torch tensor
        import torch
        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()
        x = x.numpy()
    x = np.asarray(x)
    if x.dtype == np.float16:
        x = x.astype(np.float32)
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"variability of {x.dtype} values: give floating-point results")
    return np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<"))


def _bytes(x):
    """Every byte of ``x`` as stored: any dtype, compared bit for bit."""
    if hasattr(x, "detach"):
        import torch
        t = x.detach().cpu().contiguous().reshape(-1)
        return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return np.ascontiguousarray(x).tobytes()


def scalar_variability(nd: float, d: float) -> float:
    """``V_s = 1 - |nd / d|``: 0 when equal, infinite when only ``d`` is 0."""
    return _steadfast.scalar_variability(float(nd), float(d))


def variability(nd: Any, d: Any) -> dict[str, float]:
    """The element-wise metrics of the result ``nd`` against the reference ``d`` (same
    shape and dtype): a dict with ``mean_relative_difference``, ``max_relative_difference``
    and ``fraction_differing``."""
    a, b = _array(nd), _array(d)
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"a result of {a.dtype}{list(a.shape)} against a reference of {b.dtype}{list(b.shape)}")
    dtype = "F32" if a.dtype == np.float32 else "F64"
    mean, largest, fraction = _steadfast.array_metrics(a.tobytes(), b.tobytes(), dtype)
    return {"mean_relative_difference": mean, "max_relative_difference": largest, "fraction_differing": fraction}


def distinct_outputs(outputs: Iterable[Any]) -> int:
    """How many of ``outputs`` (tensors or arrays of any dtype) are bitwise distinct."""
    return _steadfast.distinct_outputs([_bytes(o) for o in outputs])


def measure(fn: Callable[[], Any], runs: int = 50, reference: Any = None) -> dict[str, Any]:
    """Calls ``fn()`` ``runs`` times and compares every result with ``reference`` (the first
    result if not given): ``distinct`` outputs, and the mean and largest of each metric
    over the runs (for a scalar result, ``V_s`` in place of the element-wise ones)."""
    outputs = [fn() for _ in range(runs)]
    ref = outputs[0] if reference is None else reference
    report = {"runs": runs, "distinct": distinct_outputs(outputs)}
    if (ref.dim() if hasattr(ref, "dim") else np.ndim(ref)) == 0:
        vs = [abs(scalar_variability(float(o), float(ref))) for o in outputs]
        report.update(mean_abs_vs=float(np.mean(vs)), max_abs_vs=float(np.max(vs)))
        return report
    metrics = [variability(o, ref) for o in outputs]
    for key in ("mean_relative_difference", "max_relative_difference", "fraction_differing"):
        values = [m[key] for m in metrics]
        report[f"mean_{key}"] = float(np.mean(values))
        report[f"max_{key}"] = float(np.max(values))
    return report
