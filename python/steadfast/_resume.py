"""What an exact restart needs beyond the state dicts: the random generators a loop draws
from (:func:`rng_state`, :func:`set_rng_state`) and where it is in its data
(:class:`ResumableSampler`, and :class:`ResumableLoader` for a loader with worker
processes). ``steadfast.torch`` re-exports all four."""
from __future__ import annotations

import operator
import random
import sys
import warnings
import weakref
from typing import Any, Callable, Iterator, Optional, Sized, Union

import numpy as np
import torch

from . import _steadfast


def rng_state() -> dict[str, Any]:
    """Every random generator a PyTorch loop draws from: torch's (CPU, and CUDA's when
    present), NumPy's global one and Python's ``random``. Save it with the state dicts;
    :func:`set_rng_state` puts it back."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_AHEAD = ("a DataLoader with worker processes draws indices from this ResumableSampler ahead of the batches "
          "the loop has taken, so the sampler's state_dict() counts examples the loop has not seen yet and a "
          "resumed run skips them; build the loader as steadfast.torch.ResumableLoader(dataset, batch_size, "
          "sampler=sampler, num_workers=...), which counts the batches it delivers")


def _drawn_ahead() -> bool:
    """Whether the DataLoader iterator asking for this sampler's indices is one with worker
    processes (it draws them ahead of the loop). Looks at the few callers above
    ``ResumableSampler.__iter__``: the loader's batch sampler, then its iterator."""
    ahead = getattr(getattr(torch.utils.data, "dataloader", None), "_MultiProcessingDataLoaderIter", None)
    if ahead is None:
        return False
    try:
        frame = sys._getframe(2)
    except ValueError:      # iterated from no Python frame at all
        return False
    for _ in range(4):
        if frame is None:
            return False
        if isinstance(frame.f_locals.get("self"), ahead):
            return True
        frame = frame.f_back
    return False


class ResumableSampler(torch.utils.data.Sampler):
    """A shuffling sampler that knows where it is, so that a restarted loop visits the
    remaining examples of the epoch in the same order.

    Epoch ``e`` visits the permutation of ``range(n)`` that is a pure function of
    ``(seed, e)``: the order ``steadfast train`` uses for the same seed, so a PyTorch
    loop can see the data exactly as Steadfast's trainer does. ``state_dict()`` records
    the epoch and how many of its indices were taken; a new sampler given it continues from
    there. Iterating past the end of an epoch moves to the next one.

    Under a ``DataLoader`` with ``num_workers=0`` the indices taken are those of the
    batches the loop has received. A plain ``DataLoader`` with worker processes draws
    indices ahead of the loop (``prefetch_factor`` batches per worker), so the count runs
    ahead of the loop and a resume would skip examples; such a loader is warned about. Use
    :class:`ResumableLoader` instead: it counts the batches it delivers and the sampler
    reports that count. :attr:`epoch` and :attr:`position` are the place as of the last
    batch the loop received.
    """

    def __init__(self, data_source: Union[int, Sized], *, seed: int = 0, shuffle: bool = True) -> None:
        self.n = len(data_source) if hasattr(data_source, "__len__") else operator.index(data_source)
        if self.n < 0:
            raise ValueError(f"a sampler over {self.n} examples")
        self.seed, self.shuffle = operator.index(seed), bool(shuffle)
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed {self.seed}: give an integer from 0 to 2**64 - 1")
        self.epoch, self.position = 0, 0
        self._loader: Optional[Callable[[], Any]] = None   # a weak reference to the ResumableLoader counting

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_loader"] = None
        return state

    def _counter(self):
        """The ResumableLoader that counts this sampler's place, if one lives."""
        return None if self._loader is None else self._loader()

    def order(self, epoch: int) -> torch.Tensor:
        """The permutation of ``range(n)`` that epoch ``epoch`` visits (int64)."""
        if not self.shuffle:
            return torch.arange(self.n)
        raw = _steadfast.data_order(self.seed, self.n, int(epoch))
        return torch.from_numpy(np.frombuffer(raw, dtype="<u4").astype(np.int64))

    def __iter__(self) -> Iterator[int]:
        counted = self._counter() is not None
        if not counted and _drawn_ahead():
            warnings.warn(_AHEAD, stacklevel=2)
        return self._indices(self.epoch, self.position, counted)

    def _indices(self, epoch, position, counted):
        # Counted by a ResumableLoader, the place moves as the loader delivers batches,
        # not as indices are drawn.
        order = self.order(epoch).tolist()
        while position < self.n:
            i = order[position]
            position += 1
            if not counted:
                self.position = position
            yield i
        if not counted:
            self.epoch, self.position = epoch + 1, 0

    def __len__(self) -> int:
        return self.n - self.position

    def batches(self, batch_size: int) -> Iterator[torch.Tensor]:
        """Endless batches of ``batch_size`` indices (int64 tensors), epoch after epoch;
        an epoch's last, short batch is dropped. The sampler's position advances by each
        batch as it is handed out, so ``state_dict()`` taken between batches resumes at the
        next one. Every process that iterates a sampler of the same seed sees the same
        batches: the global batches a data-parallel job splits into micro-batches."""
        if batch_size < 1 or batch_size > self.n:
            raise ValueError(f"a batch of {batch_size} from {self.n} examples")
        while True:
            order = self.order(self.epoch)
            while self.position + batch_size <= self.n:
                batch = order[self.position:self.position + batch_size]
                self.position += batch_size
                yield batch
            self.epoch, self.position = self.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        """Moves to the start of epoch ``epoch``; a sampler already in that epoch keeps its
        place, so that a loop which calls ``set_epoch(epoch)`` at the top of each epoch
        still resumes mid-epoch after ``load_state_dict``."""
        self._moved()
        if int(epoch) != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def state_dict(self, position: Optional[int] = None) -> dict[str, Any]:
        """Where the sampler is. ``position`` overrides how many indices of the epoch were
        taken (for a loop that counts its own; :class:`ResumableLoader` does the counting,
        the epoch included, for a loader with worker processes)."""
        return {"seed": self.seed, "n": self.n, "epoch": self.epoch,
                "position": self.position if position is None else int(position), "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from what :meth:`state_dict` returned, for the same seed and size."""
        if (state["seed"], state["n"], state["shuffle"]) != (self.seed, self.n, self.shuffle):
            raise ValueError(f"a sampler of seed {state['seed']} over {state['n']} examples cannot resume one of "
                             f"seed {self.seed} over {self.n}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.n:
            raise ValueError(f"epoch {epoch}, position {position}: not a place in an epoch of {self.n} examples")
        self._moved()
        self.epoch, self.position = epoch, position

    def _moved(self):
        # A place set from outside ends the iteration the loader is counting.
        loader = self._counter()
        if loader is not None:
            loader._live = None


class ResumableLoader(torch.utils.data.DataLoader):
    """A ``DataLoader`` over a :class:`ResumableSampler` whose saved place is what the loop
    has consumed, with or without worker processes.

    Worker processes are handed indices ahead of the loop; this loader instead counts the
    batches it has delivered in the current iteration and keeps the sampler's
    :attr:`~ResumableSampler.epoch` and :attr:`~ResumableSampler.position` at the place
    after the last of them (``batch_size`` examples a batch; the epoch's last, short one
    up to its end; with ``drop_last`` the tail stays unvisited). So ``sampler.state_dict()``
    and :meth:`state_dict` taken in the loop's body resume at the next batch the loop
    would have received, even when the workers have already drawn the whole epoch.
    Iteration ends where the plain loader's does, and the place moves to the next epoch
    only then. A new ``iter(loader)``, after the loop broke out of an epoch, continues
    from the last delivered batch, never from what was prefetched; with
    ``persistent_workers`` too. An older iterator of this loader stops working once a
    newer one is started (or the sampler is moved with ``load_state_dict``/``set_epoch``).

    Arguments are ``DataLoader``'s, except that ``sampler`` (a :class:`ResumableSampler`)
    is required and ``batch_sampler``, ``shuffle`` and ``in_order=False`` are refused.
    Without a ``generator``, the loader has its own, seeded with the sampler's seed, so
    that starting an iteration (which draws the workers' base seed) never draws from
    torch's global generator: a restarted loop's dropout stream is not shifted.
    :meth:`state_dict` holds the sampler's place and the generator as of the start of the
    iteration in progress, so that a resumed loop's workers get the same base seeds; the
    workers' own random draws (augmentation) are not saved: derive them from the example's
    index and epoch for an exact restart.
    """

    def __init__(self, dataset: Any, batch_size: Optional[int] = 1, *, sampler: ResumableSampler,
                 drop_last: bool = False, **options: Any) -> None:
        if not isinstance(sampler, ResumableSampler):
            raise TypeError(f"a ResumableLoader counts the place of a ResumableSampler, not of {type(sampler).__name__}")
        for name in ("batch_sampler", "shuffle"):
            if options.get(name) not in (None, False):
                raise ValueError(f"a ResumableLoader batches its ResumableSampler itself; {name} is not for it")
        if options.get("in_order", True) is False:
            raise ValueError("in_order=False delivers batches out of order, and then the batches the loop has "
                             "taken are not the first ones of the epoch: a ResumableLoader cannot count them")
        if sampler._counter() is not None:
            raise ValueError("this ResumableSampler is counted by another ResumableLoader already: give each "
                             "loader a sampler of its own")
        if options.get("generator") is None:
            options["generator"] = torch.Generator().manual_seed(sampler.seed)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **options)
        sampler._loader = weakref.ref(self)
        # The iteration being counted, weakly: a loop that drops its iterator ends it (and
        # its worker processes) as with a plain DataLoader.
        self._live: Optional[Callable[[], Optional[_Delivered]]] = None
        self._generator_at: Optional[torch.Tensor] = None   # the generator as that iteration started

    def __iter__(self) -> Iterator[Any]:
        sampler = self.sampler
        start_state = self.generator.get_state()
        delivered = _Delivered(self, sampler.epoch, sampler.position)
        sampler._moved()
        # The batches start at the sampler's place: the last one the loop took.
        delivered._batches = super().__iter__()
        self._live, self._generator_at = weakref.ref(delivered), start_state
        return delivered

    def state_dict(self) -> dict[str, Any]:
        """The place of the loop in its data: the sampler's ``state_dict()`` (as of the last
        batch delivered) and the loader's generator as of the start of the iteration in
        progress (its present state between iterations)."""
        at = self._generator_at if self._live is not None and self._live() is not None else None
        return {"sampler": self.sampler.state_dict(), "generator": self.generator.get_state() if at is None else at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from what :meth:`state_dict` returned (or a sampler's ``state_dict()``
        alone): the next ``iter(loader)`` delivers the batch after the last one the saved
        loop received."""
        self.sampler.load_state_dict(state["sampler"] if "sampler" in state else state)
        if state.get("generator") is not None:
            self.generator.set_state(state["generator"])


class _Delivered:
    """One iteration of a ResumableLoader: the plain loader's batches, counted."""

    def __init__(self, loader, epoch, position):
        self._loader, self._epoch, self._start = loader, epoch, position
        self._step = loader.batch_size or 1
        self._count = 0
        self._ended = False
        self._batches = None

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._batches)

    def __next__(self):
        loader = self._loader
        if self._ended:
            raise StopIteration
        if loader._live is None or loader._live() is not self:
            raise RuntimeError("this iterator of a ResumableLoader was superseded: a newer iter(loader), or "
                               "load_state_dict or set_epoch on its sampler, moved the place it counts; iterate "
                               "the newest iter(loader)")
        sampler = loader.sampler
        try:
            batch = next(self._batches)
        except StopIteration:
            self._ended, loader._live = True, None
            sampler.epoch, sampler.position = self._epoch + 1, 0
            raise
        self._count += 1
        sampler.epoch, sampler.position = self._epoch, min(self._start + self._count * self._step, sampler.n)
        return batch
