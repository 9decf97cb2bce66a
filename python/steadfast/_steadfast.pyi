"""Type stubs of the native module (python/src). The public API is steadfast.torch."""
from os import PathLike
from typing import Optional, Sequence, Tuple, TypedDict, Union

_Path = Union[str, PathLike[str]]
# (name, role, dtype, shape, little-endian bytes)
_TensorIn = Tuple[str, str, str, Sequence[int], Union[bytes, bytearray]]
_TensorOut = Tuple[str, str, str, list[int], bytearray]

FORMAT_VERSION: int

class CheckpointError(OSError): ...

class _Loaded(TypedDict):
    dir: str
    step: int
    tree: Optional[str]
    tensors: list[_TensorOut]
    skipped: list[Tuple[str, str]]

def save(
    root: _Path, step: int, tensors: Sequence[_TensorIn], tree: str, keep_last: Optional[int] = None, shards: int = 2
) -> str: ...
def load(path: _Path) -> _Loaded: ...
def verify(path: _Path) -> list[Tuple[str, Optional[str], str]]: ...
def steps(root: _Path) -> list[int]: ...
def data_order(seed: int, examples: int, epoch: int) -> bytearray: ...

class Saver:
    def __init__(self, root: _Path, keep_last: Optional[int] = None, shards: int = 2) -> None: ...
    def submit(self, step: int, tensors: Sequence[_TensorIn], tree: str) -> Optional[str]: ...
    def wait(self) -> Optional[str]: ...
    def busy(self) -> bool: ...

class InjectError(Exception): ...

def inject(
    path: _Path,
    *,
    out: Optional[_Path] = None,
    target: Optional[str] = None,
    role: Optional[str] = None,
    bits: str = "any",
    count: Optional[int] = None,
    rate: Optional[float] = None,
    burst: int = 1,
    seed: int = 0,
    keep_checksums: bool = False,
    allow_corrupt_input: bool = False,
    log: Optional[_Path] = None,
) -> str: ...
def replay(path: _Path, log: str, *, out: Optional[_Path] = None, log_out: Optional[_Path] = None) -> str: ...
def undo(path: _Path, log: str, *, out: Optional[_Path] = None) -> None: ...
def tensors_in(path: _Path) -> list[Tuple[str, str, str, list[int]]]: ...
