"""Where ``load`` puts each tensor: ``map_location`` as ``torch.load`` takes it."""
import torch


def mover(map_location):
    """``place(tensor, saved_location) -> tensor`` for ``map_location``, which is one of:

    - None: the tensor stays on the CPU, where it was read;
    - a device (``"cuda:0"``, ``torch.device("cpu")``): every tensor is moved there;
    - a dict from saved locations to devices (``{"cuda:1": "cuda:0"}``): a tensor saved
      from a location that it names moves there, any other stays on the CPU;
    - a callable ``(storage, location) -> storage``, as ``torch.load`` calls it: it gets
      the tensor's ``untyped_storage()`` and the location the tensor was saved from
      (``"cpu"``, ``"cuda:0"``); the tensor is rebuilt over the storage it returns, with
      the same dtype, shape and strides. It may return a tensor instead, which is taken as
      it is, or None, which leaves the tensor on the CPU.

    Anything else is a TypeError."""
    if map_location is None:
        return _stay
    if isinstance(map_location, (str, torch.device)):
        device = torch.device(map_location)
        return lambda t, location: t.to(device)
    if isinstance(map_location, dict):
        targets = {str(k): torch.device(v) for k, v in map_location.items()}

        def place(t, location):
            target = targets.get(location)
            return t if target is None else t.to(target)

        return place
    if callable(map_location):
        return lambda t, location: _rebuild(t, map_location(t.untyped_storage(), location), map_location)
    raise TypeError(f"map_location {map_location!r}: give None, a device (a str or torch.device), a dict from saved "
                    "locations to devices, or a callable (storage, location) -> storage")


def _stay(t, location):
    return t


def _rebuild(t, moved, fn):
    if moved is None:
        return t
    if isinstance(moved, torch.Tensor):
        return moved
    if isinstance(moved, torch.TypedStorage):
        moved = moved.untyped()
    if not isinstance(moved, torch.UntypedStorage):
        raise TypeError(f"map_location {fn!r} returned a {type(moved).__name__}: it must return a storage or a tensor")
    return torch.empty(0, dtype=t.dtype, device=moved.device).set_(moved, t.storage_offset(), t.shape, t.stride())
