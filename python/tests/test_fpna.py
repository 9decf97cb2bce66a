"""The FPNA metrics on torch tensors: the study's definitions, on results that differ in
known ways, and on a real nondeterministic operation against its deterministic form."""
import math

import numpy as np
import pytest
import torch

import steadfast.fpna as fpna


def test_the_metrics_follow_their_definitions():
    d = torch.tensor([1.0, 2.5, 0.5, 0.0])
    nd = torch.tensor([1.0, 2.0, 0.5, 0.0])
    v = fpna.variability(nd, d)
    assert v["fraction_differing"] == 0.25
    assert math.isclose(v["mean_relative_difference"], 0.05)
    assert math.isclose(v["max_relative_difference"], 0.2)
    assert fpna.scalar_variability(2.0, 2.0) == 0.0
    assert math.isclose(fpna.scalar_variability(2.0 + 1e-6, 2.0), -5e-7, abs_tol=1e-12)
    assert fpna.scalar_variability(1.0, 0.0) == math.inf
    # float64 keeps differences below float32's resolution; bfloat16 is widened exactly.
    w = fpna.variability(torch.tensor([1.0 + 1e-12], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64))
    assert w["fraction_differing"] == 1.0
    assert fpna.variability(d.bfloat16(), d.bfloat16())["fraction_differing"] == 0.0
    # NumPy arrays too.
    assert fpna.variability(nd.numpy(), d.numpy()) == v


def test_distinct_outputs_compare_every_bit_of_any_dtype():
    a = torch.tensor([0.0, 1.0])
    b = torch.tensor([-0.0, 1.0])  # equal values, different bits
    assert fpna.distinct_outputs([a, a.clone(), b]) == 2
    assert fpna.distinct_outputs([torch.arange(3), torch.arange(3)]) == 1


def test_mismatched_inputs_are_errors():
    with pytest.raises(ValueError):
        fpna.variability(torch.zeros(3), torch.zeros(4))
    with pytest.raises(TypeError):
        fpna.variability(torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))


def test_a_sum_in_a_varying_order_varies_and_a_fixed_one_does_not():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(1 << 14, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (1 << 14,), generator=g))
    x = x.float().numpy()
    perms = [torch.randperm(len(x), generator=g).numpy() for _ in range(20)]
    it = iter(perms)
    # NumPy's cumsum adds one element at a time in float32: the order is the permutation's.
    shuffled = fpna.measure(lambda: torch.from_numpy(np.cumsum(x[next(it)])[-1:]).reshape(()), runs=20)
    fixed = fpna.measure(lambda: torch.from_numpy(np.cumsum(x)[-1:]).reshape(()), runs=20)
    assert fixed["distinct"] == 1 and fixed["max_abs_vs"] == 0.0
    assert shuffled["distinct"] > 1 and shuffled["max_abs_vs"] > 0.0
    arrays = fpna.measure(lambda: np.full(3, 1.0, dtype=np.float32), runs=3)
    assert arrays["distinct"] == 1 and arrays["max_fraction_differing"] == 0.0
