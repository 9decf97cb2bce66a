"""Type stubs of the native module (python/src). The public API is steadfast.torch."""
from os import PathLike
from typing import Optional, Sequence, Tuple, TypedDict, Union

_Path = Union[str, PathLike[str]]
# (name, role, dtype, shape, address of the little-endian bytes in host memory, their length)
_TensorAt = Tuple[str, str, str, Sequence[int], int, int]
_TensorOut = Tuple[str, str, str, list[int], bytearray]

FORMAT_VERSION: int

class CheckpointError(OSError): ...

class _Loaded(TypedDict):
    dir: str
    step: int
    tree: Optional[str]
    tensors: list[_TensorOut]
    skipped: list[Tuple[str, str]]

__version__: str

def save(
    root: _Path, step: int, tensors: Sequence[_TensorAt], tree: str, keep_last: Optional[int] = None, shards: int = 2,
    overwrite: bool = False,
) -> str: ...
def load(path: _Path, *, torch_layout: bool = False) -> _Loaded: ...
def verify(path: _Path) -> list[Tuple[str, Optional[str], str]]: ...
def steps(root: _Path) -> list[int]: ...
def data_order(seed: int, examples: int, epoch: int) -> bytearray: ...

class Opened:
    dir: str
    step: int
    tree: Optional[str]
    in_root: bool
    skipped: list[Tuple[str, str]]
    tensors: list[Tuple[str, str, str, list[int], int]]
    def read_into(self, buffers: Sequence[Tuple[int, int]]) -> None: ...

def open_checkpoint(path: _Path, below: Optional[int] = None) -> Opened: ...

class Saver:
    def __init__(self, root: _Path, keep_last: Optional[int] = None, shards: int = 2, overwrite: bool = False) -> None: ...
    def snapshot(self, step: int, tensors: Sequence[_TensorAt], tree: str) -> Optional[str]: ...
    def prepare(self, lengths: Sequence[int]) -> Optional[str]: ...
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
def inject_memory(
    tensors: Sequence[_TensorAt],
    *,
    target: Optional[str] = None,
    role: Optional[str] = None,
    bits: str = "any",
    count: Optional[int] = None,
    rate: Optional[float] = None,
    burst: int = 1,
    seed: int = 0,
) -> str: ...
def replay_memory(tensors: Sequence[_TensorAt], log: str) -> str: ...
def undo_memory(tensors: Sequence[_TensorAt], log: str) -> None: ...

# (address, bytes) of a contiguous host tensor
_At = Tuple[int, int]

# a term of a sum: its pieces, laid end to end
def fixed_exponents(terms: Sequence[Sequence[_At]], out: _At) -> None: ...
def fixed_add(terms: Sequence[Sequence[_At]], exps: _At, out: _At, headroom: int) -> None: ...
def fixed_finish(acc: _At, exps: _At, headroom: int, divisor: float, out: _At) -> None: ...

def array_metrics(nd: bytes, d: bytes, dtype: str) -> Tuple[float, float, float]: ...
def scalar_variability(nd: float, d: float) -> float: ...
def distinct_outputs(outputs: Sequence[bytes]) -> int: ...
