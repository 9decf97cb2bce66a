"""A nested training state as named tensors plus a tree that says where each one goes.

``encode`` walks the state down to its leaves. Each tensor (torch or NumPy) becomes a named
buffer, its name the path of keys joined by dots (``model.fc1.weight``,
``optimizer.state.0.exp_avg``), and the tree holds a tensor node in its place that records
what the buffer alone does not: the device the tensor was on (so that ``map_location`` can
follow ``torch.load``'s convention), whether it was a ``torch.nn.Parameter`` and whether it
required grad. Every other leaf is kept exactly: integers as decimal text (any size),
floats as the hex of their 64 bits (NaN payloads and signed zeros included), strings,
bytes, booleans, None, NumPy scalars, ``torch.dtype`` and ``torch.device``.

Containers keep their types: ``dict``, ``list`` and ``tuple``; an ``OrderedDict`` with the
``_metadata`` that a module's state dict carries; a ``defaultdict`` whose
``default_factory`` is None or a builtin (``_kinds.FACTORIES``); ``torch.Size``; and a
namedtuple, which comes back as its own class where that class is already imported, else
as a namedtuple of the same name and fields. Any other subclass of dict, list or tuple is
refused: it would come back as something else. Dictionary keys keep their types and order.

For a checkpoint (``encode(state, share=True)``) a tensor that the state holds under two
names is stored once. Where the two are one object (tied weights), the second place is an
alias node and ``decode`` gives back one object again; where they are two objects over the
same memory with the same shape, strides and dtype (``model.state_dict()`` of tied
weights), the second is a tensor node that shares the first's buffer and ``decode`` gives
back two tensors over the same memory. Different views of overlapping memory (a weight and
its transpose, a slice of another tensor) are refused: a checkpoint cannot keep them
sharing it.

The tree is JSON with no JSON floats, so the checkpoint's manifest that carries it stays
canonical and checksummed like everything else in it (``docs/checkpoint-format.md`` lists
the nodes).
"""
import json
import struct
import sys

import numpy as np

from . import _kinds, _tensors
from ._tensors import Tensor, same_memory  # noqa: F401  (steadfast.faults uses them from here)

# safetensors dtype names, as the checkpoint format stores them.
_NUMPY = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8,
    "BOOL": np.bool_,
}
_NUMPY_NAME = {np.dtype(v): k for k, v in _NUMPY.items()}


def _torch_dtypes(torch):
    pairs = {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
        "BOOL": torch.bool,
    }
    for name, attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
        if hasattr(torch, attr):
            pairs[name] = getattr(torch, attr)
    return pairs


def _role(path, default):
    head = str(path[0]) if path else ""
    if head in ("model", "model_state_dict", "state_dict", "module"):
        return "model"
    if head in ("optimizer", "optim", "optimizer_state_dict"):
        return "optim"
    return default


def _dotted(keys):
    return ".".join(map(str, keys)) or "the state"


def _subscripts(keys):
    return "state" + "".join(f"[{k!r}]" for k in keys)


def _clash(name, first, second):
    """Why the key paths ``first`` and ``second`` give one tensor name."""
    where = f"{_subscripts(first)} and {_subscripts(second)} would both be named {name!r}"
    for a, b in zip(first, second):
        if type(a) is not type(b) or a != b:
            if str(a) == str(b):
                return (f"{where}: the keys {a!r} ({type(a).__name__}) and {b!r} ({type(b).__name__}) read the "
                        "same in a tensor's name; use keys of one type")
            break
    dotted = [k for k in (*first, *second) if "." in str(k)]
    if dotted:
        return (f"{where}: the key {dotted[0]!r} holds a dot, which also joins nested keys in a tensor's name; "
                "rename the key")
    return where


def _leaf(x, where):
    """The node of a plain value, or None where ``x`` is not one. A subclass of a plain
    type (an ``IntEnum``, a ``str`` subclass) would come back as the plain type, and is
    refused instead."""
    if isinstance(x, np.generic):
        if isinstance(x, (np.str_, np.bytes_)):
            raise TypeError(f"{where}: cannot save a NumPy {type(x).__name__}: convert it with str() or bytes()")
        arr = np.asarray(x)
        return {"scalar": _numpy_name(arr.dtype, where), "hex": arr.astype(arr.dtype.newbyteorder("<")).tobytes().hex()}
    kind = type(x)
    if kind is bool:
        return {"bool": x}
    if kind is int:
        return {"int": str(x)}
    if kind is float:
        return {"float": struct.pack(">d", x).hex()}
    if kind is str:
        return {"str": x}
    if kind is bytes:
        return {"bytes": x.hex()}
    if kind is bytearray:
        return {"bytearray": x.hex()}
    for plain in (bool, int, float, str, bytes):
        if isinstance(x, plain):
            raise TypeError(f"{where}: cannot save a {kind.__name__} (a subclass of {plain.__name__}), which would "
                            f"come back as a plain {plain.__name__}: convert it ({plain.__name__}(x)) first")
    return None


def encode(state, *, share=False):
    """``(tree as JSON text, [Tensor])`` for ``state``. Each tensor's ``data`` is the dense
    host tensor or array of its values (the original where it is one already), whose memory
    the native module reads (``address``) while the caller holds it.

    With ``share`` (what a checkpoint stores), a tensor met again under another name is not
    listed again: the tree's node there refers to the first name, and different views of
    overlapping memory raise ValueError. Without it, every name gets its own entry (what
    ``steadfast.inject`` lists and flips in memory)."""
    torch = sys.modules.get("torch")
    torch_names = {v: k for k, v in _torch_dtypes(torch).items()} if torch else {}
    tensors, names = [], {}
    sharing = _tensors.Sharing() if share else None
    # A flat dictionary of tensors is one module's state dict: all of it is model state.
    flat = isinstance(state, dict) and state and all(_is_tensor(v, torch) for v in state.values())
    default_role = "model" if flat else "extra"

    def name_of(keys):
        name = ".".join(map(str, keys)) if keys else "tensor"
        if name in names:
            raise ValueError(_clash(name, names[name], keys))
        names[name] = keys
        return name

    def tensor(x, keys):
        name = name_of(keys)
        _tensors.check(x, name, torch)
        if x.dtype not in torch_names:
            raise TypeError(f"{name}: cannot save a tensor of {x.dtype}")
        node = {"tensor": name}
        if isinstance(x, torch.nn.Parameter):
            node["parameter"] = True
        if x.requires_grad:
            node["requires_grad"] = True
        first = sharing.first(x, name) if sharing is not None else None
        if first is not None:
            return first if "alias" in first else {**node, **first}
        if x.device.type != "cpu":
            node["location"] = str(x.device)
        dense = _tensors.dense(x)
        tensors.append(Tensor(name, _role(keys, default_role), torch_names[x.dtype], tuple(x.shape), dense, x))
        return node

    def array(x, keys):
        name = name_of(keys)
        dtype = _numpy_name(x.dtype, name)
        first = sharing.first(x, name) if sharing is not None else None
        if first is not None:
            return first
        dense = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<"))
        tensors.append(Tensor(name, _role(keys, default_role), dtype, x.shape, dense, x))
        return {"ndarray": name}

    def pairs(x, keys):
        return [[key(k, keys), walk(v, keys + [k])] for k, v in x.items()]

    def walk(x, keys):
        if torch is not None and isinstance(x, torch.Tensor):
            return tensor(x, keys)
        if isinstance(x, np.ndarray):
            return array(x, keys)
        if isinstance(x, (dict, list, tuple)):
            kind = _kinds.container(x, _dotted(keys), torch)
            if kind == "dict":
                return {"dict": pairs(x, keys)}
            if kind == "odict":
                # A module's state dict carries its submodules' versions in `_metadata`.
                metadata = getattr(x, "_metadata", None)
                return {"odict": [pairs(x, keys), None if metadata is None else walk(metadata, keys + ["_metadata"])]}
            if kind == "defaultdict":
                return {"defaultdict": [_kinds.factory_name(x.default_factory, _dotted(keys)), pairs(x, keys)]}
            if kind == "size":
                return {"size": [str(n) for n in x]}
            items = [walk(v, keys + [i]) for i, v in enumerate(x)]
            if kind == "namedtuple":
                cls = type(x)
                return {"namedtuple": [cls.__module__, cls.__qualname__, list(cls._fields), items]}
            return {kind: items}
        if torch is not None and isinstance(x, torch.dtype):
            return {"dtype": str(x).removeprefix("torch.")}
        if torch is not None and isinstance(x, torch.device):
            return {"device": str(x)}
        encoded = _leaf(x, _dotted(keys))
        if encoded is None and x is not None:
            raise TypeError(f"{_dotted(keys)}: cannot save a {type(x).__name__}")
        return encoded

    def key(k, keys):
        if type(k) is tuple:
            return {"tuple": [key(i, keys) for i in k]}
        encoded = _leaf(k, _dotted(keys))
        if encoded is None and k is not None:
            raise TypeError(f"{_dotted(keys)}: cannot save a key of type {type(k).__name__}")
        return encoded

    try:
        tree = walk(state, [])
    except RecursionError:
        raise ValueError("the state nests too deeply to save (or contains itself): flatten it") from None
    if sharing is not None:
        sharing.check_overlaps()
    return json.dumps(tree, separators=(",", ":")), tensors


def _is_tensor(x, torch):
    return (torch is not None and isinstance(x, torch.Tensor)) or isinstance(x, np.ndarray)


def _numpy_name(dtype, path):
    name = _NUMPY_NAME.get(np.dtype(dtype).newbyteorder("="))
    if name is None:
        raise TypeError(f"{path}: cannot save an array of {dtype}")
    return name


_TENSOR_FIELDS = {"tensor", "shares", "location", "parameter", "requires_grad"}


def decode(tree_json, tensors, place=None):
    """The state that ``encode`` saw, from its tree and ``tensors``: ``{name: torch
    tensor}`` of every stored tensor, on the CPU, contiguous, with its dtype, shape and
    values. ``place(tensor, saved_location)`` (``_location.mover(map_location)``; None
    leaves tensors where they are) is called once per stored torch tensor, with the
    device it was saved from (``"cpu"`` where the tree records none); what it returns is
    shared by every name of that tensor, and becomes a Parameter or requires grad as
    recorded. An array node comes back as a NumPy array over its tensor's memory."""
    torch = sys.modules["torch"]
    dtype_names = {v: k for k, v in _torch_dtypes(torch).items()}
    place = place or (lambda t, location: t)
    placed, objects, used = {}, {}, set()

    def stored(name):
        if name not in tensors:
            raise ValueError(f"the state tree names tensor {name!r}, which the checkpoint does not hold")
        used.add(name)
        return tensors[name]

    def tensor(node):
        unknown = set(node) - _TENSOR_FIELDS
        if unknown:
            raise ValueError(f"malformed state tree node: unknown fields {sorted(unknown)} in {node!r:.80}")
        name = node["tensor"]
        if "shares" in node:
            if node["shares"] not in placed:
                raise ValueError(f"malformed state tree: {name} shares the tensor {node['shares']!r}, which comes "
                                 "later or not at all")
            base = placed[node["shares"]].detach()
        elif name in placed:
            raise ValueError(f"malformed state tree: tensor {name!r} is placed twice")
        else:
            base = placed[name] = place(stored(name), node.get("location", "cpu"))
        requires_grad = bool(node.get("requires_grad", False))
        if node.get("parameter"):
            out = torch.nn.Parameter(base, requires_grad=requires_grad)
        elif requires_grad:
            out = base.detach().requires_grad_()
        else:
            out = base
        objects[name] = out
        return out

    def array(name):
        t = stored(name)
        dtype = np.dtype(_NUMPY[dtype_names[t.dtype]]).newbyteorder("<")
        if t.numel() == 0:
            out = np.zeros(tuple(t.shape), dtype=dtype)
        else:
            out = t.reshape(-1).view(torch.uint8).numpy().view(dtype).reshape(tuple(t.shape))
        objects[name] = out
        return out

    def pairs(value):
        return [(walk(k), walk(v)) for k, v in value]

    def walk(node):
        if node is None:
            return None
        if isinstance(node, dict) and "tensor" in node:
            return tensor(node)
        if isinstance(node, dict) and set(node) == {"scalar", "hex"}:
            dtype = np.dtype(_NUMPY[node["scalar"]]).newbyteorder("<")
            return np.frombuffer(bytes.fromhex(node["hex"]), dtype=dtype)[0]
        if not isinstance(node, dict) or len(node) != 1:
            raise ValueError(f"malformed state tree node: {node!r:.80}")
        ((kind, value),) = node.items()
        if kind == "ndarray":
            return array(value)
        if kind == "alias":
            if value not in objects:
                raise ValueError(f"malformed state tree: an alias of {value!r} comes before it")
            return objects[value]
        if kind in ("dict", "odict", "defaultdict", "list", "tuple", "namedtuple", "size", "dtype", "device"):
            return _kinds.rebuild(kind, value, walk, pairs, torch)
        if kind == "bool":
            return bool(value)
        if kind == "int":
            return int(value)
        if kind == "float":
            return struct.unpack(">d", bytes.fromhex(value))[0]
        if kind == "str":
            return value
        if kind == "bytes":
            return bytes.fromhex(value)
        if kind == "bytearray":
            return bytearray.fromhex(value)
        raise ValueError(f"unknown state tree node {kind!r}")

    state = walk(json.loads(tree_json))
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"the checkpoint holds tensors that its state tree does not place: {unused[:5]}")
    return state
