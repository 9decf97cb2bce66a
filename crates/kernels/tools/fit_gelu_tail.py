"""Fits the polynomial `TAIL` in crates/kernels/src/gelu.rs.

g(a) = e^(a^2/2) Phi(-a), the normal distribution's tail with its Gaussian factor taken out,
is smooth and slowly varying on [0, 14.5] (from 1/2 down to about 1/(a sqrt(2 pi))). In
u = (4 - a) / (4 + a), which maps [0, 14.5] onto [-0.57, 1], a degree-10 polynomial fitted
by least squares of the relative error has a relative error near 4e-9 there, and below 2e-8
once its coefficients are f32 values: below f32's half unit in the last place (3e-8 and more).

The coefficients are rounded to f32 one at a time from the constant term, the later ones
fitted again after each rounding so that they absorb it. Needs numpy and mpmath (both are
in bench/.venv):

    bench/.venv/bin/python crates/kernels/tools/fit_gelu_tail.py
"""

import mpmath as mp
import numpy as np

mp.mp.dps = 40
A, END, DEGREE = 4.0, 14.5, 10


def tail(a):
    a = mp.mpf(a)
    return float(mp.exp(a * a / 2) * mp.ncdf(-a))


low = (A - END) / (A + END)
nodes = np.cos(np.pi * (np.arange(1000) + 0.5) / 1000)
u = low + (nodes + 1) / 2 * (1 - low)
values = np.array([tail(A * (1 - v) / (1 + v)) for v in u])
powers = np.vander(u, DEGREE + 1, increasing=True) / values[:, None]

rounded = []
for i in range(DEGREE + 1):
    rest, *_ = np.linalg.lstsq(powers[:, i:], 1 - powers[:, :i] @ np.array(rounded, dtype=float), rcond=None)
    rounded.append(float(np.float32(rest[0])))

check = np.linspace(0.0, END, 20001)
uc = (A - check) / (A + check)
p = np.polyval(np.array(rounded)[::-1], uc)
error = np.max(np.abs(p / np.array([tail(v) for v in check]) - 1))
print(f"const TAIL: [f32; {DEGREE + 1}] = [")
for c in rounded:
    print(f"    {c!r},")
print("];")
print(f"// largest relative error on [0, {END}], in exact arithmetic: {error:.2e}")
