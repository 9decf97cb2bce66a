"""Reproducible data-parallel training with PyTorch's DDP: the same final weights, to the
bit, on 1, 2, 4 or any number of processes.

DDP's default communication hook sums each gradient bucket with a floating-point
all-reduce and divides by the world size; the sum's rounding depends on how many ranks
there are and how the backend groups them, and a rank that accumulates several
micro-batches adds them in float first. So a job's weights change with its size.

:class:`ReproducibleGradients` fixes both. A step is a fixed global batch split into a
fixed number of micro-batches; micro-batch ``i`` runs on rank ``i % world``. Each
micro-batch's gradient is kept apart (never added in float), and the hook sums all of
them with Steadfast's order-independent fixed-point sum: the job agrees on each element's
largest exponent, one byte per block of 64 elements (an all-reduce of bytes with
``MAX``), every rank converts its terms to 64-bit integers at its block's scale and adds them, the job sums the integers (an all-reduce
with ``SUM``), and each rank converts back and divides by the number of micro-batches.
Integer addition does not care about order or grouping, so the mean gradient, and with it
every weight, has the same bits whichever ranks computed which micro-batches. The
conversions run in Rust (``steadfast._steadfast``). By default the whole sum runs on
Steadfast's own mesh (shared-memory rings between the ranks of one host, authenticated TCP
between hosts, met through the process group once): one call per bucket, the scales' round
and the integers' ring with the conversions done as the chunks pass (with one micro-batch
per rank, the floats summed at each chunk's owner instead, to the same bits). Where the ranks span
hosts and no address leads to them (no ``MASTER_ADDR``, no ``address=``), it runs on the
process group's all-reduces instead (gloo on CPU; two per bucket), as
``transport="gloo"`` asks. Both transports compute the same function and give the same bits.

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from steadfast.ddp import ReproducibleGradients

    model = DDP(net)                      # the same initial weights on every rank
    grads = ReproducibleGradients(model, micro_batches=8)
    for step in range(steps):
        batch = order[step * 256:(step + 1) * 256]       # the global batch, on every rank
        for i, part in grads.split(batch):               # this rank's micro-batches
            with grads.micro_batch(i):                   # forward and backward inside
                F.cross_entropy(model(x[part]), y[part]).backward()
        opt.step()
        opt.zero_grad()

What stays the caller's part of the contract: every rank starts from the same weights
(DDP broadcasts rank 0's), sees the same global batches (``steadfast.torch.ResumableSampler``
gives every rank the same order), and computes a micro-batch's loss and gradient with
arithmetic that does not depend on the process (fix ``torch.set_num_threads``; a
dropout mask drawn from a generator seeded by the step and micro-batch, not by the rank).
Gradients must be float32.

Every backward pass into the parameters must run inside a micro-batch's context, one per
micro-batch: the hook can only account for gradients it knows the micro-batch of. A
``loss.backward()`` outside ``grads.micro_batch(i)``, a micro-batch whose forward or
backward ran outside its context, a second backward in one micro-batch, and gradients
left in ``.grad`` from the previous step (no ``opt.zero_grad()``) would each make the
step's gradient silently wrong; they raise ``RuntimeError`` instead, saying what to do.
The error is raised on every rank at the same point, before any all-reduce, when the
ranks run the same code and the world size divides ``micro_batches``; with an uneven
split, a rank that fails before its last micro-batch leaves the others waiting in the
step's all-reduce until the process group's timeout.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from collections import defaultdict
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from . import _steadfast

__all__ = ["ReproducibleGradients", "DEFAULT_HEADROOM", "MAX_HEADROOM"]

#: Bits kept free above each element's largest term: up to 2**16 micro-batches per step.
DEFAULT_HEADROOM = 16
#: The most headroom a 64-bit sum of float32 terms has.
MAX_HEADROOM = 39
#: The most headroom a 32-bit sum of float32 terms has (up to 128 terms).
NARROW_MAX_HEADROOM = 7


def _at(t):
    return (t.data_ptr(), t.numel() * t.element_size())


class ReproducibleGradients:
    """Registers the reproducible communication hook on the DDP module ``module`` and runs
    the micro-batches of a step.

    ``micro_batches`` is the number of micro-batches per step over the whole job (at least
    the world size; each rank runs those whose index is its rank modulo the world size).
    The step's gradient is the mean of the micro-batches' gradients. ``profile=True``
    keeps the seconds spent in each phase of the hook in :attr:`profile`.

    ``lanes`` is the width of the integers the job sums: 64 (the default: 46 bits below
    each block's largest term, with ``headroom`` bits for up to ``2**headroom``
    micro-batches) or 32 (the bytes of DDP's own float all-reduce, for up to 128
    micro-batches: the headroom is the fewest bits that hold ``micro_batches`` terms, and a
    block's largest term keeps ``31 - headroom`` bits, about a float sum's accuracy for the
    block's largest elements, while an element ``2**-(31 - headroom)`` below its block's
    largest is lost). Either width gives the same bits on any number of ranks.

    ``transport`` is where the sums run: ``"steadfast"`` (Steadfast's mesh, set up here with
    one exchange of addresses over the process group; ``address`` is this rank's address
    that the others reach, found from ``MASTER_ADDR`` when not given; a lost rank makes the
    sum fail on the others within ``timeout`` seconds), ``"gloo"`` (two all-reduces of the
    process group per bucket), or ``"auto"`` (the default: the mesh, unless the ranks span
    hosts and neither ``address`` nor ``MASTER_ADDR`` gives this rank's address, then gloo;
    every rank decides alike). The same bits either way; the mesh's one call per bucket is
    the faster (``docs/benchmarks.md``). :attr:`transport` says which one runs.
    """

    def __init__(self, module: torch.nn.parallel.DistributedDataParallel, micro_batches: int, *, group: Any = None,
                 headroom: int = DEFAULT_HEADROOM, lanes: int = 64, profile: bool = False,
                 transport: str = "auto", address: str | None = None, timeout: float = 60.0) -> None:
        if not isinstance(module, torch.nn.parallel.DistributedDataParallel):
            raise TypeError("ReproducibleGradients needs a DistributedDataParallel module")
        self.module = module
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if micro_batches < self.world:
            raise ValueError(f"{micro_batches} micro-batches for {self.world} ranks: every rank needs at least one")
        if lanes not in (32, 64):
            raise ValueError(f"lanes={lanes}: the integer sum has 32- or 64-bit lanes")
        if transport not in ("auto", "gloo", "steadfast"):
            raise ValueError(f"transport={transport!r}: give 'steadfast' (Steadfast's mesh), 'gloo' (the process "
                             "group's all-reduces) or 'auto' (the mesh where the ranks can reach each other)")
        if lanes == 32:
            # The fewest bits that hold the step's terms: the rest keep the largest's bits.
            headroom = max(0, (micro_batches - 1).bit_length())
            if headroom > NARROW_MAX_HEADROOM:
                raise ValueError(f"{micro_batches} micro-batches do not fit 32-bit lanes (at most "
                                 f"{2 ** NARROW_MAX_HEADROOM}): use lanes=64")
        if not 0 <= headroom <= MAX_HEADROOM:
            raise ValueError(f"headroom {headroom}: give 0 to {MAX_HEADROOM} bits")
        if micro_batches > 2 ** headroom:
            raise ValueError(f"{micro_batches} micro-batches exceed the headroom of 2**{headroom} terms")
        odd = [(n, p.dtype, p.device.type) for n, p in module.module.named_parameters()
               if p.requires_grad and (p.dtype != torch.float32 or p.device.type != "cpu")]
        if odd:
            raise TypeError(f"the reproducible hook sums float32 gradients in host memory; {odd[0][0]} is "
                            f"{odd[0][1]} on {odd[0][2]}")
        self.micro_batches = micro_batches
        self.headroom = headroom
        self.lanes = lanes
        if transport == "auto":
            transport = "steadfast" if _mesh_reachable(group, address) else "gloo"
        #: Where the sums run: ``"steadfast"`` (the mesh) or ``"gloo"`` (the process group).
        self.transport = transport
        self.mesh = _join_mesh(group, self.rank, address, timeout) if transport == "steadfast" else None
        self.mine = list(range(self.rank, micro_batches, self.world))
        #: Seconds per phase of the hook, summed over its calls (with ``profile=True``).
        self.profile = defaultdict(float) if profile else None
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._index = {id(p): k for k, p in enumerate(self._params)}   # a parameter's place in a kept list
        self._kept = []          # per earlier micro-batch of this step: one gradient per parameter
        # The kept gradients live in one buffer per earlier micro-batch, reused every step,
        # laid out as the buckets lay out their parameters (once the hook has seen them), so
        # that a bucket's share of a kept micro-batch is one piece of memory, not one per
        # parameter: the sums read it where it lies.
        self._order = {}         # bucket index -> its parameters' places, as the hook last saw them
        self._layout = None      # the places in the kept buffers' order
        self._flat = []          # per kept slot: {place: a view of the slot's buffer}
        self._done = 0           # micro-batches of this step whose backward has run
        self._buffers = {}       # bucket index -> (exponents, integer sum), reused every step
        self._summed = set()     # ids of the parameters whose gradients the hook summed this step
        self._current = None     # the micro-batch whose context the loop is in
        self._last = False       # whether it is this rank's last of the step (the one that syncs)
        self._reached = set()    # ids of the parameters its backward has accumulated into
        module.register_comm_hook(self, _hook)
        # Every backward into a parameter passes here (after accumulating into .grad, and
        # before DDP's own hook sees the parameter ready), so none can go uncounted.
        self._handles = [p.register_post_accumulate_grad_hook(self._accumulated) for p in self._params]

    def _accumulated(self, p):
        if self._current is None:
            raise RuntimeError(_OUTSIDE)
        if id(p) in self._reached:
            raise RuntimeError(f"a second backward pass in micro-batch {self._current}: each micro-batch's gradient "
                               "is summed on its own, so a micro-batch runs one forward and one backward (for more "
                               "examples per step, give ReproducibleGradients more micro-batches)")
        self._reached.add(id(p))

    def split(self, batch: Sequence[int]) -> list[tuple[int, Sequence[int]]]:
        """This rank's micro-batches of the global batch ``batch`` (a sequence or tensor of
        example indices, the same on every rank), as ``(i, part)`` pairs: micro-batch
        ``i`` is the ``i``-th of ``micro_batches`` equal slices. The batch's length must be
        a multiple of ``micro_batches``."""
        if len(batch) % self.micro_batches:
            raise ValueError(f"a batch of {len(batch)} does not split into {self.micro_batches} equal micro-batches")
        size = len(batch) // self.micro_batches
        return [(i, batch[i * size:(i + 1) * size]) for i in self.mine]

    @contextlib.contextmanager
    def micro_batch(self, i: int) -> Iterator[None]:
        """The context of micro-batch ``i`` (one of this rank's, in order): run its forward
        and backward passes inside it, one backward. The last of this rank's micro-batches
        sends the step's gradients through the hook; the earlier ones run under DDP's
        ``no_sync`` (which takes effect from the forward pass on) and their gradients are
        kept apart, never added in float. An error inside abandons the step."""
        if self._current is not None:
            raise ValueError(f"micro-batch {i} inside micro-batch {self._current}: one micro-batch at a time")
        if self._done >= len(self.mine) or self.mine[self._done] != i:
            expected = self.mine[self._done] if self._done < len(self.mine) else "none (the step is complete)"
            raise ValueError(f"micro-batch {i} out of turn: rank {self.rank} expects {expected}")
        if self._done == 0:
            stale = [n for n, p in self.module.module.named_parameters()
                     if p.requires_grad and p.grad is not None and bool(p.grad.any())]
            if stale:
                raise RuntimeError(f"the gradients of {stale[:3]} are not zero as the step starts: a backward pass "
                                   "that ran before it (the previous step's, or one outside grads.micro_batch) "
                                   "would be added to this step's; call opt.zero_grad() after opt.step()")
        last = self._done == len(self.mine) - 1
        self._current, self._last, self._reached = i, last, set()
        if last:
            self._summed = set()
        finished = False
        try:
            with contextlib.nullcontext() if last else self.module.no_sync():
                yield
            finished = True
        finally:
            self._current, self._last = None, False
            if last or not finished:
                self._done, self._kept = 0, []
        if not self._reached:
            raise RuntimeError(f"micro-batch {i} ran no backward pass inside its context: {_WHAT_TO_DO}")
        if last:
            missed = [n for n, p in self.module.module.named_parameters()
                      if p.requires_grad and id(p) not in self._summed]
            if missed:
                # DDP skips the buckets of parameters that the loss did not use unless told
                # to look for them; their gradients would hold the last micro-batch's alone.
                raise RuntimeError(f"the hook did not sum the gradients of {missed[:3]}: a parameter the loss does "
                                   "not use needs DistributedDataParallel(..., find_unused_parameters=True)")
            return
        kept = self._slot(len(self._kept))
        for k, p in enumerate(self._params):
            if p.grad is None:
                kept[k].zero_()
            else:
                kept[k].copy_(p.grad)
                p.grad.zero_()
        self._kept.append(kept)
        self._done += 1

    def _slot(self, i):
        """The views of kept buffer ``i``, one per parameter, in the buckets' order once
        every parameter's bucket is known (the parameters' own order before)."""
        layout = [k for b in sorted(self._order) for k in self._order[b]]
        if sorted(layout) != list(range(len(self._params))):
            layout = list(range(len(self._params)))
        if layout != self._layout:
            self._layout, self._flat = layout, []
        while len(self._flat) <= i:
            buf = torch.empty(sum(p.numel() for p in self._params), dtype=torch.float32)
            views, at = {}, 0
            for k in layout:
                n = self._params[k].numel()
                views[k] = buf[at:at + n].view(self._params[k].shape)
                at += n
            self._flat.append(views)
        return self._flat[i]

    def _tick(self, phase, since):
        if self.profile is not None:
            now = time.perf_counter()
            self.profile[phase] += now - since
            return now
        return since


_WHAT_TO_DO = ("run the forward and the backward of each (i, part) of grads.split(batch) inside "
               "`with grads.micro_batch(i):`")
_OUTSIDE = ("a backward pass reached the parameters outside grads.micro_batch(i): ReproducibleGradients sums "
            "each micro-batch's gradient on its own and cannot account for this one, so the step's gradient "
            f"would be wrong; {_WHAT_TO_DO}")


def _reachable_address():
    """An address of this host that the job's other ranks reach: the one this host sends
    from toward ``MASTER_ADDR`` (no packet leaves: a UDP socket only picks its route)."""
    master = os.environ.get("MASTER_ADDR")
    if not master:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, int(os.environ.get("MASTER_PORT", "9"))))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _mesh_reachable(group, address):
    """Whether the mesh can connect the group's ranks: they share a host (the loopback
    address serves), or every rank knows an address of its own that the others reach.
    Decided from what every rank tells the group, so every rank decides alike."""
    known = address is not None or bool(os.environ.get("MASTER_ADDR"))
    told = [None] * dist.get_world_size(group)
    dist.all_gather_object(told, (socket.gethostname(), known), group=group)
    return _reachable(told)


def _reachable(told):
    """The rule of :func:`_mesh_reachable` over each rank's ``(host name, whether it knows
    its own reachable address)``."""
    return len({host for host, _ in told}) == 1 or all(known for _, known in told)


def _join_mesh(group, rank, address, timeout):
    """Steadfast's mesh among the process group's ranks: each listens, the addresses and
    a secret drawn by the group's first rank go round the group, and every rank connects."""
    mesh = _steadfast.Mesh(address or _reachable_address())
    addresses = [None] * dist.get_world_size(group)
    dist.all_gather_object(addresses, mesh.address(), group=group)
    secret = [os.urandom(16).hex() if rank == 0 else None]
    dist.broadcast_object_list(secret, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
    mesh.connect(rank, addresses, bytes.fromhex(secret[0]), timeout)
    return mesh


def _coalesced(pieces):
    """``(address, bytes)`` pieces with each run of adjacent ones joined into one."""
    out = []
    for at, size in pieces:
        if out and out[-1][0] + out[-1][1] == at:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((at, size))
    return out


def _hook(state, bucket):
    t = time.perf_counter()
    # Refused before any all-reduce: every rank that runs the same code refuses here too.
    if state._current is None or not state._last:
        raise RuntimeError("DDP summed the gradients outside the step's last micro-batch (DDP decides at the "
                           f"forward pass whether the backward sums across ranks): {_WHAT_TO_DO}")
    if any(id(p) in state._summed for p in bucket.parameters()):
        raise RuntimeError(f"a second backward pass in micro-batch {state._current}: a micro-batch runs one "
                           "forward and one backward")
    grads = bucket.buffer()
    if grads.dtype != torch.float32 or grads.device.type != "cpu":
        raise TypeError(f"the reproducible hook sums float32 gradients in host memory, not {grads.dtype} on {grads.device}")
    n = grads.numel()
    # The bucket holds the last micro-batch's gradients; the earlier ones were kept apart,
    # per parameter, and are laid out as the bucket lays out its parameters: one after
    # another, in the order of bucket.parameters().
    ks = [state._index[id(p)] for p in bucket.parameters()]
    state._summed.update(id(p) for p in bucket.parameters())
    at = 0
    for g in bucket.gradients():
        if g.data_ptr() != grads.data_ptr() + at * grads.element_size():
            raise RuntimeError("the bucket does not lay out its parameters' gradients one after another")
        at += g.numel()
    if at != n:
        raise RuntimeError(f"the bucket's gradients hold {at} of its {n} elements")
    # Each term is a list of pieces laid end to end: the bucket itself, then each kept
    # micro-batch's gradients in the bucket's parameter order (no copy into one buffer).
    state._order[bucket.index()] = ks
    terms = [[_at(grads)]] + [_coalesced([_at(kept[k]) for k in ks]) for kept in state._kept]
    if state.mesh is not None:
        t = state._tick("lay out the terms", t)
        # In the hook, on the backward pass's thread: a thread of its own let the backward
        # pass go on meanwhile, and was slower where the processes fill every core.
        # A lost rank raises here, out of the backward pass, on every survivor.
        state.mesh.mean(terms, _at(grads), state.lanes, state.headroom, float(state.micro_batches))
        state._tick("sum on Steadfast's mesh (Rust)", t)
        done = torch.futures.Future()
        done.set_result(grads)
        return done
    exps, acc = state._buffers.get(bucket.index(), (None, None))
    if acc is None or acc.numel() != n:
        lanes = torch.int64 if state.lanes == 64 else torch.int32
        exps, acc = torch.empty(_steadfast.fixed_scales(n), dtype=torch.uint8), torch.empty(n, dtype=lanes)
        state._buffers[bucket.index()] = (exps, acc)
    t = state._tick("lay out the terms", t)
    _steadfast.fixed_exponents(terms, n, _at(exps))
    t = state._tick("exponents (Rust)", t)
    dist.all_reduce(exps, op=dist.ReduceOp.MAX, group=state.group)
    t = state._tick("all-reduce MAX u8", t)
    _steadfast.fixed_add(terms, _at(exps), _at(acc), state.headroom, state.lanes)
    t = state._tick("to fixed point (Rust)", t)
    work = dist.all_reduce(acc, group=state.group, async_op=True)

    def finish(fut):
        start = time.perf_counter()
        _steadfast.fixed_finish(_at(acc), _at(exps), state.headroom, float(state.micro_batches), _at(grads),
                                state.lanes)
        if state.profile is not None:
            state.profile["from fixed point (Rust)"] += time.perf_counter() - start
        return grads

    if state.profile is not None:
        work.wait()
        state._tick(f"all-reduce SUM i{state.lanes}", t)
    return work.get_future().then(finish)
