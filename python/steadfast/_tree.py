"""A nested training state as named tensors plus a tree that says where each one goes.

``encode`` walks dictionaries, lists and tuples down to their leaves. Each tensor (torch or
NumPy) becomes a named buffer, its name the path of keys joined by dots
(``model.fc1.weight``, ``optimizer.state.0.exp_avg``), and the tree holds
``{"tensor": name}`` (or ``{"ndarray": name}``) in its place. Every other leaf is kept
exactly: integers as decimal text (any size), floats as the hex of their 64 bits (NaN
payloads and signed zeros included), strings, bytes, booleans and None; dictionary keys
keep their types and order, and an ``OrderedDict`` stays one, with the ``_metadata`` that a
module's state dict carries. ``decode`` rebuilds the same structure.

The tree is JSON with no JSON floats, so the checkpoint's manifest that carries it stays
canonical and checksummed like everything else in it.
"""
import collections
import json
import struct
import sys

import numpy as np

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


def _torch_dense(t, path):
    """A torch tensor as a dense, contiguous tensor in host memory (itself when it is one)."""
    torch = sys.modules["torch"]
    if t.layout != torch.strided or t.is_quantized:
        raise TypeError(f"{path}: cannot save a {t.layout} tensor (only dense ones)")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.resolve_conj().resolve_neg().contiguous()


def _role(path, default):
    head = path[0] if path else ""
    if head in ("model", "model_state_dict", "state_dict", "module"):
        return "model"
    if head in ("optimizer", "optim", "optimizer_state_dict"):
        return "optim"
    return default


def encode(state):
    """``(tree as JSON text, [Tensor])`` for ``state``. Each tensor's ``data`` is the dense
    host tensor or array of its values (the original where it is one already), whose memory
    the native module reads (``address``) while the caller holds it."""
    torch = sys.modules.get("torch")
    torch_names = {v: k for k, v in _torch_dtypes(torch).items()} if torch else {}
    tensors = []
    seen = {}
    # A flat dictionary of tensors is one module's state dict: all of it is model state.
    flat = isinstance(state, dict) and state and all(_is_tensor(v, torch) for v in state.values())
    default_role = "model" if flat else "extra"

    def name_of(path):
        name = ".".join(path) if path else "tensor"
        if name in seen:
            raise ValueError(f"two tensors would both be named {name!r} (a key with a dot clashes with a nested key)")
        seen[name] = True
        return name

    def leaf(x, path):
        if x is None:
            return None
        if isinstance(x, bool):
            return {"bool": x}
        if isinstance(x, int):
            return {"int": str(x)}
        if isinstance(x, float):
            return {"float": struct.pack(">d", x).hex()}
        if isinstance(x, str):
            return {"str": x}
        if isinstance(x, (bytes, bytearray)):
            return {"bytes": bytes(x).hex()}
        if isinstance(x, np.generic):
            arr = np.asarray(x)
            return {"scalar": _numpy_name(arr.dtype, path), "hex": arr.astype(arr.dtype.newbyteorder("<")).tobytes().hex()}
        return None

    def walk(x, path):
        if torch is not None and isinstance(x, torch.Tensor):
            if x.dtype not in torch_names:
                raise TypeError(f"{'.'.join(path)}: cannot save a tensor of {x.dtype}")
            name = name_of(path)
            dense = _torch_dense(x, name)
            tensors.append(Tensor(name, _role(path, default_role), torch_names[x.dtype], tuple(x.shape), dense, x))
            return {"tensor": name}
        if isinstance(x, np.ndarray):
            name = name_of(path)
            dtype = _numpy_name(x.dtype, name)
            dense = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<"))
            tensors.append(Tensor(name, _role(path, default_role), dtype, x.shape, dense, x))
            return {"ndarray": name}
        if isinstance(x, dict):
            pairs = [[key(k, path), walk(v, path + [str(k)])] for k, v in x.items()]
            if isinstance(x, collections.OrderedDict):
                # A module's state dict carries its submodules' versions in `_metadata`.
                metadata = getattr(x, "_metadata", None)
                return {"odict": [pairs, None if metadata is None else walk(metadata, path + ["_metadata"])]}
            return {"dict": pairs}
        if isinstance(x, (list, tuple)):
            items = [walk(v, path + [str(i)]) for i, v in enumerate(x)]
            return {"tuple" if isinstance(x, tuple) else "list": items}
        encoded = leaf(x, path)
        if encoded is None and x is not None:
            raise TypeError(f"{'.'.join(path) or 'the state'}: cannot save a {type(x).__name__}")
        return encoded

    def key(k, path):
        encoded = leaf(k, path)
        if isinstance(k, tuple):
            return {"tuple": [key(i, path) for i in k]}
        if encoded is None and k is not None:
            raise TypeError(f"{'.'.join(path) or 'the state'}: cannot save a key of type {type(k).__name__}")
        return encoded

    tree = walk(state, [])
    return json.dumps(tree, separators=(",", ":")), tensors


def _is_tensor(x, torch):
    return (torch is not None and isinstance(x, torch.Tensor)) or isinstance(x, np.ndarray)


def _numpy_name(dtype, path):
    name = _NUMPY_NAME.get(np.dtype(dtype).newbyteorder("="))
    if name is None:
        raise TypeError(f"{path}: cannot save an array of {dtype}")
    return name


def decode(tree_json, tensors, to_torch):
    """The state that ``encode`` saw, from its tree and ``{name: (dtype, shape, bytearray)}``.
    ``to_torch(dtype, shape, data)`` makes a torch tensor."""
    used = set()

    def buffer(name):
        if name not in tensors:
            raise ValueError(f"the state tree names tensor {name!r}, which the checkpoint does not hold")
        used.add(name)
        return tensors[name]

    def walk(node):
        if node is None:
            return None
        if isinstance(node, dict) and set(node) == {"scalar", "hex"}:
            dtype = np.dtype(_NUMPY[node["scalar"]]).newbyteorder("<")
            return np.frombuffer(bytes.fromhex(node["hex"]), dtype=dtype)[0]
        if not isinstance(node, dict) or len(node) != 1:
            raise ValueError(f"malformed state tree node: {node!r:.80}")
        ((kind, value),) = node.items()
        if kind == "tensor":
            return to_torch(*buffer(value))
        if kind == "ndarray":
            dtype, shape, data = buffer(value)
            return np.frombuffer(data, dtype=np.dtype(_NUMPY[dtype]).newbyteorder("<")).reshape(shape)
        if kind == "dict":
            return {walk(k): walk(v) for k, v in value}
        if kind == "odict":
            pairs, metadata = value
            out = collections.OrderedDict((walk(k), walk(v)) for k, v in pairs)
            if metadata is not None:
                out._metadata = walk(metadata)
            return out
        if kind == "list":
            return [walk(v) for v in value]
        if kind == "tuple":
            return tuple(walk(v) for v in value)
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
        raise ValueError(f"unknown state tree node {kind!r}")

    state = walk(json.loads(tree_json))
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"the checkpoint holds tensors that its state tree does not place: {unused[:5]}")
    return state
