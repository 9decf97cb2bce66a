"""Reproducible DDP on gloo with real processes: the final weights of the same job on 1, 2
and 4 processes are the same bits; the hook's arithmetic is the fixed-point sum's."""
import json
import pathlib
import subprocess
import sys

import pytest
import torch

from steadfast import _steadfast
from steadfast.ddp import DEFAULT_HEADROOM

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "reproducible_ddp.py"


def run(world, data, *args):
    out = subprocess.run([sys.executable, str(EXAMPLE), "--data", str(data), "--world", str(world), "--steps", "12",
                          "--batch", "64", "--micro-batches", "4", "--width", "64", *args],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_the_final_weights_are_the_same_bits_on_1_2_and_4_processes(fashion_mnist):
    runs = [run(world, fashion_mnist) for world in (1, 2, 4)]
    assert len({r["weights_sha256"] for r in runs}) == 1, runs
    # DDP's own hook (micro-batches accumulated in float, then a float all-reduce) does
    # not give the 1-process bits on 4 processes.
    default = [run(world, fashion_mnist, "--hook", "default")["weights_sha256"] for world in (1, 4)]
    assert default[0] != default[1]


def _at(t):
    return (t.data_ptr(), t.numel() * t.element_size())


def sum_in_one_go(terms, divisor):
    n = terms[0].numel()
    exps, acc, out = torch.empty(n, dtype=torch.uint8), torch.empty(n, dtype=torch.int64), torch.empty(n)
    _steadfast.fixed_exponents([[_at(t)] for t in terms], _at(exps))
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
    exps = [torch.empty(n, dtype=torch.uint8) for _ in range(2)]
    for e, part in zip(exps, (terms[:3], terms[3:])):
        _steadfast.fixed_exponents([[_at(t)] for t in part], _at(e))
    top = torch.maximum(exps[0], exps[1])
    accs = [torch.empty(n, dtype=torch.int64) for _ in range(2)]
    for a, part in zip(accs, (terms[:3], terms[3:])):
        _steadfast.fixed_add([[_at(t)] for t in part], _at(top), _at(a), DEFAULT_HEADROOM)
    out, total = torch.empty(n), accs[0] + accs[1]     # (held: the call reads it by address)
    _steadfast.fixed_finish(_at(total), _at(top), DEFAULT_HEADROOM, 8.0, _at(out))
    assert torch.equal(out, whole)
    # Terms in pieces laid end to end (a bucket's parameters) sum to the same bits.
    pieces = [[_at(t[:300]), _at(t[300:])] for t in terms]
    exps, acc, out = torch.empty(n, dtype=torch.uint8), torch.empty(n, dtype=torch.int64), torch.empty(n)
    _steadfast.fixed_exponents(pieces, _at(exps))
    _steadfast.fixed_add(pieces, _at(exps), _at(acc), DEFAULT_HEADROOM)
    _steadfast.fixed_finish(_at(acc), _at(exps), DEFAULT_HEADROOM, 8.0, _at(out))
    assert torch.equal(out, whole)
    # Close to the float64 mean.
    exact = torch.stack([t.double() for t in terms]).sum(0) / 8
    assert torch.allclose(whole.double(), exact, rtol=1e-6, atol=0)


def test_bad_tensors_are_errors_not_crashes():
    f = torch.zeros(4)
    exps = torch.empty(3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="of 4 elements in a sum of 3"):
        _steadfast.fixed_exponents([[_at(f)]], _at(exps))
    with pytest.raises(ValueError, match="float32"):
        _steadfast.fixed_exponents([[(f.data_ptr(), 7)]], _at(torch.empty(1, dtype=torch.uint8)))
    with pytest.raises(ValueError, match="headroom"):
        _steadfast.fixed_add([[_at(f)]] * 3, _at(torch.zeros(4, dtype=torch.uint8)), _at(torch.empty(4, dtype=torch.int64)), 1)


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
