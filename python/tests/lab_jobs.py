"""Training jobs for the SDC lab's tests: small enough that a campaign of a few dozen
trials takes seconds. Worker processes import this file by path and call these functions."""
import random

import torch

import steadfast.lab as lab


def _data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2500, 32, generator=g)
    teacher = torch.randn(32, 4, generator=g)
    y = (x @ teacher).argmax(1)
    return x[:2000], y[:2000], x[2000:], y[2000:]


def _model():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def small_job():
    """A 32-64-4 MLP learning a linear teacher's labels with AdamW, batch 32."""
    x, y, xt, yt = _data()
    return lab.Job(model=_model, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
                   batch=lambda step: (x[step * 32 % 1968:][:32], y[step * 32 % 1968:][:32]),
                   evaluate=lambda m: lab.accuracy(m, xt, yt), name="small-mlp", data="teacher")


def unseeded_job():
    """The same, but each batch drawn from an unseeded generator: not a function of the step."""
    x, y, xt, yt = _data()
    rng = random.Random()

    def batch(step):
        i = rng.randrange(1968)
        return x[i:i + 32], y[i:i + 32]

    return lab.Job(model=_model, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), batch=batch,
                   evaluate=lambda m: lab.accuracy(m, xt, yt), name="unseeded")
