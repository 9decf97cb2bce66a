"""Fits the polynomial of `erfcx` in crates/kernels/src/gelu.rs.

erfcx(z) = exp(z^2) erfc(z) is smooth and slowly varying on [0, 11]. With
t = 3 / (3 + z) and u = (28/11) t - 17/11 (which maps z in [0, 11] onto u in [-1, 1]),
a degree-12 polynomial in u, fitted by least squares on Chebyshev nodes and rewritten in
powers of u, has a relative error below 1e-11 on [0, 11].

Needs numpy and mpmath (both are in bench/.venv):

    bench/.venv/bin/python crates/kernels/tools/fit_erfcx.py
"""

import mpmath as mp
import numpy as np

mp.mp.dps = 40
Z_MAX, A, DEGREE = 11.0, 3.0, 14


def erfcx(z):
    z = mp.mpf(z)
    return float(mp.exp(z * z) * mp.erfc(z))


low = A / (A + Z_MAX)
scale, offset = 28 / 11, -17 / 11  # 2 / (1 - low), -low * scale - 1
nodes = np.cos(np.pi * (np.arange(600) + 0.5) / 600)
z = A / ((nodes - offset) / scale) - A
fit = np.polynomial.chebyshev.chebfit(nodes, [erfcx(v) for v in z], DEGREE)
powers = np.polynomial.chebyshev.cheb2poly(fit)

check = np.linspace(0.0, Z_MAX, 20001)
u = (A / (A + check)) * scale + offset
p = np.full_like(u, powers[-1])
for c in powers[-2::-1]:
    p = p * u + c
error = np.max(np.abs(p / np.array([erfcx(v) for v in check]) - 1))
print(f"const ERFCX: [f64; {DEGREE + 1}] = [")
for c in powers:
    print(f"    {float(c)!r},")
print("];")
print(f"// largest relative error on [0, {Z_MAX}]: {error:.2e}")
