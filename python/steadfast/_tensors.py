"""The tensors of a state as the native module reads them: what can be saved, its dense
host copy, and which tensors of a state are one tensor under two names."""
import sys

import numpy as np


class Tensor:
    """One buffer of the state: what the native module stores. ``data`` is the dense host
    copy (or the original, where it is one already) and ``source`` the tensor or array as
    the state holds it."""

    __slots__ = ("name", "role", "dtype", "shape", "data", "source")

    def __init__(self, name, role, dtype, shape, data, source=None):
        self.name, self.role, self.dtype, self.shape, self.data = name, role, dtype, shape, data
        self.source = data if source is None else source

    def address(self):
        """``(name, role, dtype, shape, address, length)``: where its bytes lie in memory,
        valid while ``data`` is held."""
        d = self.data
        if isinstance(d, np.ndarray):
            return (self.name, self.role, self.dtype, list(self.shape), d.ctypes.data if d.nbytes else 0, d.nbytes)
        length = d.numel() * d.element_size()
        return (self.name, self.role, self.dtype, list(self.shape), d.data_ptr() if length else 0, length)


def same_memory(data, source):
    """Whether the dense buffer ``data`` is the memory of ``source`` itself (so that
    writing one writes the other), not a copy of it."""
    if data is source:
        return True
    if isinstance(data, np.ndarray) or isinstance(source, np.ndarray):
        return (isinstance(data, np.ndarray) and isinstance(source, np.ndarray) and source.flags.c_contiguous
                and data.dtype == source.dtype and data.ctypes.data == source.ctypes.data)
    return (source.device.type == "cpu" and source.is_contiguous() and data.dtype == source.dtype
            and data.data_ptr() == source.data_ptr())


def check(t, name, torch):
    """Raises a TypeError or ValueError that says what to do where the torch tensor ``t``
    holds no values of its own that could be saved."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is not None and isinstance(t, dtensor):
        raise TypeError(f"{name}: a DTensor (distributed over a device mesh) holds only this rank's part: save "
                        f"{name}.full_tensor() (the whole tensor, gathered on every rank), or save "
                        f"{name}.to_local() on each rank under a root of its own")
    if t.layout != torch.strided or t.is_quantized:
        raise TypeError(f"{name}: cannot save a {t.layout} tensor (only dense ones)")
    if isinstance(t, torch.nn.parameter.UninitializedTensorMixin):
        raise ValueError(f"{name}: an uninitialized (lazy) parameter has no values yet: run a forward pass first")
    if t.device.type == "meta":
        raise ValueError(f"{name}: a tensor on the meta device has a shape but no values: materialize it first "
                         "(module.to_empty(device=...) and initialize it, or load its weights)")
    if t.numel() and _data_ptr(t) == 0:
        raise ValueError(f"{name}: a {type(t).__name__} of shape {list(t.shape)} has no memory of its own to save: "
                         "save a plain tensor of its values")


def _data_ptr(t):
    try:
        return t.data_ptr()
    except RuntimeError:
        return 0


def dense(t):
    """A torch tensor as a dense, contiguous tensor in host memory (itself when it is one)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.resolve_conj().resolve_neg().contiguous()


def _extent(t):
    """The bytes ``[low, high)`` of memory that the non-empty torch tensor ``t`` spans."""
    low = t.data_ptr()
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return low, low + span * t.element_size()


class Sharing:
    """Which tensors of a state are one tensor met again under another name.

    ``first(x, name)`` remembers ``x`` under ``name`` and returns None, or, where ``x``
    was met before, what the tree holds in its place: ``{"alias": first name}`` for the
    same object, ``{"shares": first name}`` for another torch tensor with the same memory,
    dtype, shape and strides. After the walk, ``check_overlaps`` refuses different views
    of overlapping memory."""

    def __init__(self):
        self.objects = {}      # id -> (object, the name it was first met under)
        self.views = {}        # (device, address, stride, shape, dtype, conj, neg) -> stored name
        self.spans = []        # (device, low, high, name) of each stored torch tensor

    def first(self, x, name):
        met = self.objects.get(id(x))
        if met is not None:
            return {"alias": met[1]}
        self.objects[id(x)] = (x, name)
        if isinstance(x, np.ndarray) or x.numel() == 0:
            return None
        view = (str(x.device), x.data_ptr(), tuple(x.stride()), tuple(x.shape), x.dtype, x.is_conj(), x.is_neg())
        if view in self.views:
            return {"shares": self.views[view]}
        self.views[view] = name
        self.spans.append((str(x.device), *_extent(x), name))
        return None

    def check_overlaps(self):
        spans = sorted(self.spans)
        for (device, _, high, a), (other, low, _, b) in zip(spans, spans[1:]):
            if device == other and low < high:
                raise ValueError(
                    f"{a} and {b} are different views of overlapping memory (such as a weight and its transpose, "
                    "or a slice of another tensor): a checkpoint stores each tensor's values on their own, so they "
                    "would come back apart; save a copy of one of them (`.clone()`)")
