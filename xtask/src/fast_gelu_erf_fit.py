"""How the coefficients of the CUDA erf-GELU (`gelu_erf` in shaders/cuda/common.cuh) were fitted.

Run by hand, never by the build or the tests (tilekit does not depend on numpy, scipy or
mpmath): `python3 xtask/src/fast_gelu_erf_fit.py` with numpy 2.4, scipy 1.17 and mpmath 1.3
printed the eight f32 coefficients that common.cuh and xtask/src/fast_gelu_erf.rs spell.

The kernel computes q = Phi(-a) = 2^y for a = min(|x|, 13.3) with y = -1 + N(a)/D(a), N of
degree 5 with N(0) = 0, D of degree 3 with D(0) = 1. This fits y against log2(erfc(a/sqrt 2)/2)
from mpmath (40 digits) on about 3000 points of [0, 13.3] (Chebyshev-clustered and uniform), in
the weighted minimax sense: weight 1/tol(a), tol(a) = (5e-7 (1 + a^2) - 3.6e-7) / ln 2, the
relative GELU bound less what the SFU (2^-22 for ex2.approx) and the final roundings may take,
as an error in log2; beyond a = 11.4 (|gelu| < 1e-30 from 11.67 on) only 0.1. The rational
minimax is found by Loeb's linearisation: repeatedly minimise max w |N - (y + 1) D| / D_old as a
linear programme (scipy's HiGHS), with D >= 0.05 on the grid, then the coefficients are rounded
to f32. The weighted error of the f64 fit is about 0.09; the f32 model in fast_gelu_erf.rs is the
proof, this is only where the numbers came from.
"""

import mpmath as mp
import numpy as np
from scipy.optimize import linprog

mp.mp.dps = 40
A, DEG_N, DEG_D, REL_CUT, POINTS = 13.3, 5, 3, 11.4, 1500


def target(a):
    return float(mp.log(mp.erfc(mp.mpf(a) / mp.sqrt(2)) / 2, 2))


def main():
    k = np.arange(POINTS)
    cheb = (1 - np.cos(np.pi * (k + 0.5) / POINTS)) / 2 * A
    a = np.unique(np.concatenate([cheb, np.linspace(0, A, POINTS), [0.0, A]]))
    t = np.array([target(v) for v in a]) + 1
    tol = np.where(a <= REL_CUT, (5e-7 * (1 + a * a) - 3.6e-7) / np.log(2), 1e-1)
    w = 1 / tol
    u = a / A  # the fit runs in a / A for conditioning
    m = len(a)
    powers_n = np.stack([u**j for j in range(1, DEG_N + 1)], axis=1)
    powers_d = np.stack([u**j for j in range(1, DEG_D + 1)], axis=1)
    d_old = np.ones(m)
    for _ in range(12):
        lhs = np.hstack([powers_n, -t[:, None] * powers_d]) * (w / d_old)[:, None]
        rhs = t * w / d_old
        ones = np.ones((m, 1))
        a_ub = np.vstack([
            np.hstack([lhs, -ones]),
            np.hstack([-lhs, -ones]),
            np.hstack([np.zeros((m, DEG_N)), -powers_d, np.zeros((m, 1))]),
        ])
        b_ub = np.concatenate([rhs, -rhs, np.full(m, 1 - 0.05)])
        cost = np.zeros(DEG_N + DEG_D + 1)
        cost[-1] = 1
        res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=[(None, None)] * len(cost), method="highs")
        n_u, d_u = res.x[:DEG_N], res.x[DEG_N:DEG_N + DEG_D]
        n_val, d_val = powers_n @ n_u, 1 + powers_d @ d_u
        d_old = d_val
    print("weighted error of the f64 fit:", np.max(np.abs(n_val / d_val - t) * w))
    n_a = n_u / A ** np.arange(1, DEG_N + 1)
    d_a = d_u / A ** np.arange(1, DEG_D + 1)
    for name, coefs in (("N", n_a), ("D", d_a)):
        for j, c in enumerate(coefs, start=1):
            c32 = np.float32(c)
            print(f"{name}{j} = {float(c32):.9g}f ({float(c32).hex()})")


if __name__ == "__main__":
    main()
