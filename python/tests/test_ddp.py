"""Reproducible DDP on gloo with real processes: the final weights of the same job on 1, 2
and 4 processes are the same bits; the hook's arithmetic is the fixed-point sum's; a
backward pass it cannot account for raises on every rank instead of making the step's
gradient silently wrong."""
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from steadfast import _steadfast
from steadfast.ddp import DEFAULT_HEADROOM, _reachable

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "reproducible_ddp.py"


def run(world, data, *args):
    out = subprocess.run([sys.executable, str(EXAMPLE), "--data", str(data), "--world", str(world), "--steps", "12",
                          "--batch", "64", "--micro-batches", "4", "--width", "64", *args],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_the_final_weights_are_the_same_bits_on_1_2_and_4_processes(fashion_mnist):
    # By default (transport="auto") the sums run on Steadfast's mesh, as all of these
    # processes share a host; two processes on the process group's gloo all-reduces
    # instead: the same function, so the same bits.
    wide = [run(1, fashion_mnist), run(2, fashion_mnist, "--transport", "gloo"), run(4, fashion_mnist)]
    assert len({r["weights_sha256"] for r in wide}) == 1, wide
    # The 32-bit lanes too, with other bits than the 64-bit sum's.
    narrow = [run(1, fashion_mnist, "--lanes", "32"), run(2, fashion_mnist, "--lanes", "32", "--transport", "gloo"),
              run(4, fashion_mnist, "--lanes", "32")]
    assert len({r["weights_sha256"] for r in narrow}) == 1, narrow
    assert narrow[0]["weights_sha256"] != wide[0]["weights_sha256"]
    # DDP's own hook (micro-batches accumulated in float, then a float all-reduce) does
    # not give the 1-process bits on 4 processes.
    default = [run(world, fashion_mnist, "--hook", "default")["weights_sha256"] for world in (1, 4)]
    assert default[0] != default[1]


def test_auto_takes_the_mesh_unless_ranks_on_other_hosts_lack_an_address():
    assert _reachable([("a", False), ("a", False)])          # one host: the loopback address serves
    assert _reachable([("a", True), ("b", True)])            # every rank knows where it is reached
    assert not _reachable([("a", True), ("b", False)])       # the second rank would give 127.0.0.1: gloo


def _at(t):
    return (t.data_ptr(), t.numel() * t.element_size())


def sum_in_one_go(terms, divisor):
    n = terms[0].numel()
    exps = torch.empty(_steadfast.fixed_scales(n), dtype=torch.uint8)
    acc, out = torch.empty(n, dtype=torch.int64), torch.empty(n)
    _steadfast.fixed_exponents([[_at(t)] for t in terms], n, _at(exps))
    _steadfast.fixed_add([[_at(t)] for t in terms], _at(exps), _at(acc), DEFAULT_HEADROOM)
    _steadfast.fixed_finish(_at(acc), _at(exps), DEFAULT_HEADROOM, float(divisor), _at(out))
    return out


def test_the_sum_is_the_same_bits_in_any_order_and_grouping():
    g = torch.Generator().manual_seed(1)
    terms = [torch.randn(1000, generator=g) * 10 ** torch.randint(-6, 6, (1000,), generator=g) for _ in range(8)]
    whole = sum_in_one_go(terms, 8)
    assert torch.equal(whole, sum_in_one_go(terms[::-1], 8))
    # Two groups summed apart, as two ranks would, then their integers added.
    n = 1000
    exps = [torch.empty(_steadfast.fixed_scales(n), dtype=torch.uint8) for _ in range(2)]
    for e, part in zip(exps, (terms[:3], terms[3:])):
        _steadfast.fixed_exponents([[_at(t)] for t in part], n, _at(e))
    top = torch.maximum(exps[0], exps[1])
    accs = [torch.empty(n, dtype=torch.int64) for _ in range(2)]
    for a, part in zip(accs, (terms[:3], terms[3:])):
        _steadfast.fixed_add([[_at(t)] for t in part], _at(top), _at(a), DEFAULT_HEADROOM)
    out, total = torch.empty(n), accs[0] + accs[1]     # (held: the call reads it by address)
    _steadfast.fixed_finish(_at(total), _at(top), DEFAULT_HEADROOM, 8.0, _at(out))
    assert torch.equal(out, whole)
    # Terms in pieces laid end to end (a bucket's parameters) sum to the same bits.
    pieces = [[_at(t[:300]), _at(t[300:])] for t in terms]
    exps = torch.empty(_steadfast.fixed_scales(n), dtype=torch.uint8)
    acc, out = torch.empty(n, dtype=torch.int64), torch.empty(n)
    _steadfast.fixed_exponents(pieces, n, _at(exps))
    _steadfast.fixed_add(pieces, _at(exps), _at(acc), DEFAULT_HEADROOM)
    _steadfast.fixed_finish(_at(acc), _at(exps), DEFAULT_HEADROOM, 8.0, _at(out))
    assert torch.equal(out, whole)
    # 32-bit lanes, written and summed the same way, in pieces or whole.
    narrow = []
    for pieces_of in ([[_at(t)] for t in terms], pieces):
        exps = torch.empty(_steadfast.fixed_scales(n), dtype=torch.uint8)
        acc32, out32 = torch.empty(n, dtype=torch.int32), torch.empty(n)
        _steadfast.fixed_exponents(pieces_of, n, _at(exps))
        _steadfast.fixed_add(pieces_of, _at(exps), _at(acc32), 3, 32)
        _steadfast.fixed_finish(_at(acc32), _at(exps), 3, 8.0, _at(out32), 32)
        narrow.append(out32)
    assert torch.equal(narrow[0], narrow[1]) and not torch.equal(narrow[0], whole)
    with pytest.raises(ValueError, match="headroom at most 7 in 32-bit lanes"):
        _steadfast.fixed_add(pieces, _at(exps), _at(acc32), 8, 32)
    with pytest.raises(ValueError, match="lanes=16"):
        _steadfast.fixed_add(pieces, _at(exps), _at(acc32), 3, 16)
    # Within the documented bound of the float64 mean: 8 terms, each truncated at 2^-46 of
    # the largest magnitude in its block of 64 elements, and the final rounding.
    stacked = torch.stack([t.double() for t in terms])
    exact = stacked.sum(0) / 8
    block_max = stacked.abs().amax(0)
    block_max = torch.nn.functional.pad(block_max, (0, (-n) % 64)).reshape(-1, 64).amax(1).repeat_interleave(64)[:n]
    bound = 8 * 2.0**-46 * block_max / 8 + 2.0**-24 * whole.double().abs()
    assert bool(((whole.double() - exact).abs() <= bound).all())
    # Where an element is within 2^-22 of its block's largest, every bit a float could keep.
    near = stacked.abs().amax(0) >= block_max * 2.0**-22
    assert torch.allclose(whole.double()[near], exact[near], rtol=1e-6, atol=0)


def test_bad_tensors_are_errors_not_crashes():
    f = torch.zeros(4)
    exps = torch.empty(1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="of 4 elements in a sum of 3"):
        _steadfast.fixed_exponents([[_at(f)]], 3, _at(exps))
    with pytest.raises(ValueError, match="2 scale bytes for a sum of 4 elements"):
        _steadfast.fixed_exponents([[_at(f)]], 4, _at(torch.empty(2, dtype=torch.uint8)))
    with pytest.raises(ValueError, match="float32"):
        _steadfast.fixed_exponents([[(f.data_ptr(), 7)]], 4, _at(exps))
    with pytest.raises(ValueError, match="headroom"):
        _steadfast.fixed_add([[_at(f)]] * 3, _at(torch.zeros(1, dtype=torch.uint8)), _at(torch.empty(4, dtype=torch.int64)), 1)


def test_the_helper_refuses_what_it_cannot_make_reproducible(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from steadfast.ddp import ReproducibleGradients

    with pytest.raises(TypeError, match="DistributedDataParallel"):
        ReproducibleGradients(torch.nn.Linear(2, 2), 4)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        model = DDP(torch.nn.Linear(3, 1))
        grads = ReproducibleGradients(model, 2)
        with pytest.raises(ValueError, match="does not split into 2"):
            grads.split(torch.arange(5))
        with pytest.raises(ValueError, match="out of turn"):
            with grads.micro_batch(1):
                pass
    finally:
        dist.destroy_process_group()


def test_what_the_hook_cannot_sum_is_refused_before_it_runs_or_named_after(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from steadfast.ddp import ReproducibleGradients

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        with pytest.raises(TypeError, match="float32"):
            ReproducibleGradients(DDP(torch.nn.Linear(3, 1).double()), 2)
        with pytest.raises(ValueError, match="headroom 40"):
            ReproducibleGradients(DDP(torch.nn.Linear(3, 1)), 2, headroom=40)
        with pytest.raises(ValueError, match="lanes=16"):
            ReproducibleGradients(DDP(torch.nn.Linear(3, 1)), 2, lanes=16)
        with pytest.raises(ValueError, match="129 micro-batches do not fit 32-bit lanes"):
            ReproducibleGradients(DDP(torch.nn.Linear(3, 1)), 129, lanes=32)
        # One host: the mesh by default (a mesh of one sends nothing).
        assert ReproducibleGradients(DDP(torch.nn.Linear(3, 1)), 2).transport == "steadfast"
        assert ReproducibleGradients(DDP(torch.nn.Linear(3, 1)), 2, transport="gloo").transport == "gloo"
        with pytest.raises(ValueError, match="transport='nccl'"):
            ReproducibleGradients(DDP(torch.nn.Linear(3, 1)), 2, transport="nccl")
        with pytest.raises(RuntimeError, match="cannot listen on 203.0.113.7"):
            ReproducibleGradients(DDP(torch.nn.Linear(3, 1)), 2, transport="steadfast", address="203.0.113.7")

        class Unused(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.used, self.spare = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)

            def forward(self, x):
                return self.used(x)

        grads = ReproducibleGradients(DDP(Unused()), 2)
        x = torch.ones(4, 3)
        with grads.micro_batch(0):
            grads.module(x[:2]).sum().backward()
        with pytest.raises(RuntimeError, match="find_unused_parameters=True"):
            with grads.micro_batch(1):
                grads.module(x[2:]).sum().backward()
    finally:
        dist.destroy_process_group()


# Each case runs on a fresh DDP module on every rank; a case whose backward the hook cannot
# account for must raise on every rank (and then the next case's collectives still meet).
MISUSE = r'''
import json, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from steadfast.ddp import ReproducibleGradients

rank, world, rendezvous, micro_batches = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
g = torch.Generator().manual_seed(0)
x, y, batch = torch.randn(32, 5, generator=g), torch.randn(32, 1, generator=g), torch.arange(32)


def loss(model, part):
    return ((model(x[part]) - y[part]) ** 2).mean()


def steps(grads, model, last_twice=False):
    parts = grads.split(batch)
    for k, (i, part) in enumerate(parts):
        with grads.micro_batch(i):
            loss(model, part).backward()
            if last_twice and k == len(parts) - 1:
                loss(model, part).backward()


def backward_before_any_micro_batch(grads, model):
    loss(model, batch).backward()


def backward_between_micro_batches(grads, model):
    (i, part), *_ = grads.split(batch)
    with grads.micro_batch(i):
        loss(model, part).backward()
    loss(model, part).backward()


def backward_after_the_context(grads, model):
    (i, part), *_ = grads.split(batch)
    with grads.micro_batch(i):
        out = loss(model, part)
    out.backward()


def forward_before_the_context(grads, model):
    (i, part), *_ = grads.split(batch)
    out = loss(model, part)
    with grads.micro_batch(i):
        out.backward()


def second_backward_in_a_micro_batch(grads, model):
    (i, part), *_ = grads.split(batch)
    with grads.micro_batch(i):
        loss(model, part[:4]).backward()
        loss(model, part[4:]).backward()


def second_backward_in_the_last_micro_batch(grads, model):
    steps(grads, model, last_twice=True)


def no_zero_grad_between_steps(grads, model):
    steps(grads, model)
    steps(grads, model)


def correct(grads, model):
    steps(grads, model)


out = {}
for case in (backward_before_any_micro_batch, backward_between_micro_batches, backward_after_the_context,
             forward_before_the_context, second_backward_in_a_micro_batch, second_backward_in_the_last_micro_batch, no_zero_grad_between_steps,
             correct):
    torch.manual_seed(1)
    model = DDP(torch.nn.Linear(5, 1))
    grads = ReproducibleGradients(model, micro_batches)
    try:
        case(grads, model)
        out[case.__name__] = {"grad": [p.grad.tolist() for p in model.parameters()]}
    except RuntimeError as e:
        out[case.__name__] = {"error": str(e)}
print(json.dumps(out))
dist.barrier()
dist.destroy_process_group()
'''


def misuse(tmp_path, world, micro_batches):
    script = tmp_path / "misuse.py"
    script.write_text(MISUSE)
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), str(world), str(tmp_path / "rdv"),
                               str(micro_batches)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    outs = []
    for p in ranks:
        try:
            stdout, stderr = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in ranks:
                q.kill()
            raise AssertionError("a rank hung: the ranks did not fail at the same point")
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout.splitlines()[-1]))
    return outs


REFUSED = {
    "backward_before_any_micro_batch": r"outside grads\.micro_batch\(i\)",
    "backward_between_micro_batches": r"outside grads\.micro_batch\(i\)",
    "backward_after_the_context": r"micro-batch \d+ ran no backward pass inside its context",
    "forward_before_the_context": r"outside the step's last micro-batch",
    "second_backward_in_a_micro_batch": r"a second backward pass in micro-batch \d+",
    "second_backward_in_the_last_micro_batch": r"a second backward pass in micro-batch \d+",
    "no_zero_grad_between_steps": r"not zero as the step starts.*opt\.zero_grad\(\)",
}


def check_misuse(outs, micro_batches):
    import re

    for rank, out in enumerate(outs):
        for case, pattern in REFUSED.items():
            assert "error" in out[case], f"rank {rank}, {case}: no error, gradient {out[case]}"
            assert re.search(pattern, out[case]["error"]), (case, out[case]["error"])
            if "second" not in pattern and "zero" not in pattern:
                assert "inside `with grads.micro_batch(i):`" in out[case]["error"]
        assert "error" not in out["correct"], out["correct"]
    # The step done right is the same bits on every rank and the mean of the micro-batches'
    # gradients.
    assert all(out["correct"] == outs[0]["correct"] for out in outs)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 5, generator=g), torch.randn(32, 1, generator=g)
    torch.manual_seed(1)
    net = torch.nn.Linear(5, 1).double()
    for part in torch.arange(32).chunk(micro_batches):
        (((net(x[part].double()) - y[part].double()) ** 2).mean() / micro_batches).backward()
    for got, want in zip(outs[0]["correct"]["grad"], (p.grad for p in net.parameters())):
        assert torch.allclose(torch.tensor(got, dtype=torch.float64), want, rtol=1e-5, atol=1e-7)


def test_a_backward_the_hook_cannot_account_for_raises_on_both_ranks(tmp_path):
    # Before, a plain loss.backward() on 2 ranks with 4 micro-batches gave half the gradient.
    check_misuse(misuse(tmp_path, world=2, micro_batches=4), 4)


def test_a_backward_the_hook_cannot_account_for_raises_on_one_rank(tmp_path):
    check_misuse(misuse(tmp_path, world=1, micro_batches=2), 2)


LOSES_A_RANK = """
import os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from steadfast.ddp import ReproducibleGradients
rank = int(sys.argv[1])
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
torch.manual_seed(0)
model = DDP(torch.nn.Linear(20, 3))
grads = ReproducibleGradients(model, 2, transport="steadfast", timeout=float(sys.argv[3]))
x, y = torch.randn(8, 20), torch.randint(0, 3, (8,))
start = time.monotonic()
for step in range(100000):
    if rank == 1 and step == 20:
        os._exit(9)                  # gone mid-job, as a SIGKILL leaves it: no goodbye
    try:
        for i, part in grads.split(list(range(8))):
            with grads.micro_batch(i):
                torch.nn.functional.cross_entropy(model(x[part]), y[part]).backward()
    except RuntimeError as e:
        print(f"step {step} after {time.monotonic() - start:.1f} s: {e}", flush=True)
        sys.exit(3)
    model.zero_grad()
"""


def test_on_the_mesh_a_lost_rank_fails_the_survivors_step_with_its_name_not_a_hang(tmp_path):
    script = tmp_path / "loses_a_rank.py"
    script.write_text(LOSES_A_RANK)
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(tmp_path / "rdv"), "5"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[1].returncode == 9, outs[1]
    assert procs[0].returncode == 3, outs[0]
    assert "step 20 " in outs[0] and "the reproducible sum on the hook's mesh failed" in outs[0], outs[0]
    assert "rank 1" in outs[0], outs[0]
