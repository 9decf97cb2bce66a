"""The containers and torch leaves of a state tree beyond JSON's own: which types are kept,
and how they are rebuilt."""
import collections
import functools
import sys

#: The ``default_factory`` values of a ``defaultdict`` that a checkpoint keeps, by name.
FACTORIES = {
    "list": list, "dict": dict, "set": set, "int": int, "float": float, "str": str, "tuple": tuple, "bool": bool,
    "collections.OrderedDict": collections.OrderedDict,
}
_FACTORY_NAME = {v: k for k, v in FACTORIES.items()}

_EXACT = {dict: "dict", list: "list", tuple: "tuple", collections.OrderedDict: "odict",
          collections.defaultdict: "defaultdict"}


def _is_namedtuple(cls):
    fields = getattr(cls, "_fields", None)
    return (issubclass(cls, tuple) and isinstance(fields, tuple) and all(isinstance(f, str) for f in fields)
            and callable(getattr(cls, "_make", None)))


def _class_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def container(x, where, torch):
    """The node kind of the dict, list or tuple ``x``: ``dict``, ``odict``, ``defaultdict``,
    ``list``, ``tuple``, ``size`` or ``namedtuple``. A TypeError for any other subclass,
    which would come back as its base class."""
    cls = type(x)
    if cls in _EXACT:
        return _EXACT[cls]
    if torch is not None and cls is torch.Size:
        return "size"
    if _is_namedtuple(cls) and len(x) == len(cls._fields):
        return "namedtuple"
    base = next(b for b in (dict, list, tuple) if isinstance(x, b)).__name__
    raise TypeError(f"{where}: cannot save a {_class_name(cls)}, a subclass of {base} that would come back as a "
                    f"plain {base}: convert it ({base}(...)) before saving if that is what you want back")


def factory_name(factory, where):
    """The name that stands for a defaultdict's ``default_factory`` in the tree."""
    if factory is None:
        return None
    name = _FACTORY_NAME.get(factory) if isinstance(factory, type) else None
    if name is None:
        raise TypeError(f"{where}: cannot save a defaultdict whose default_factory is {factory!r}: it would not come "
                        f"back; use None or one of {', '.join(FACTORIES)}, or save a dict of it")
    return name


def _namedtuple_class(module, qualname, fields):
    """The namedtuple class ``module.qualname`` where it is imported already and has these
    fields; else a namedtuple of the same name and fields."""
    cls = sys.modules.get(module)
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if isinstance(cls, type) and _is_namedtuple(cls) and cls._fields == fields:
        return cls
    return _rebuilt(qualname.rpartition(".")[2], fields)


@functools.lru_cache(maxsize=None)
def _rebuilt(name, fields):
    """One namedtuple class per name and fields, so that the tuples of one class come back
    of one class."""
    return collections.namedtuple(name if name.isidentifier() else "namedtuple", fields, rename=True)


def rebuild(kind, value, walk, pairs, torch):
    """The value of a container or torch leaf node; ``walk`` decodes a node, ``pairs`` a
    list of ``[key, value]`` nodes."""
    if kind == "dict":
        return dict(pairs(value))
    if kind == "odict":
        items, metadata = value
        out = collections.OrderedDict(pairs(items))
        if metadata is not None:
            out._metadata = walk(metadata)
        return out
    if kind == "defaultdict":
        factory, items = value
        if factory is not None and factory not in FACTORIES:
            raise ValueError(f"a defaultdict's default_factory {factory!r} is none that a checkpoint keeps")
        return collections.defaultdict(None if factory is None else FACTORIES[factory], pairs(items))
    if kind == "list":
        return [walk(v) for v in value]
    if kind == "tuple":
        return tuple(walk(v) for v in value)
    if kind == "namedtuple":
        module, qualname, fields, items = value
        cls = _namedtuple_class(module, qualname, tuple(fields))
        return cls._make(walk(v) for v in items)
    if kind == "size":
        return torch.Size(int(n) for n in value)
    if kind == "dtype":
        dtype = getattr(torch, value, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"this PyTorch has no dtype torch.{value}")
        return dtype
    if kind == "device":
        try:
            return torch.device(value)
        except RuntimeError as e:
            raise ValueError(f"this PyTorch has no device {value!r}: {e}") from None
    raise ValueError(f"unknown state tree node {kind!r}")
