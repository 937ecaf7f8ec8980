"""Per-job window utility with cold start (paper section 4.1), as lookup tables.

For one job the planner needs ``W[d, c]``: the mean relaxed utility over the prediction
window's time steps and forecast samples when the job runs ``c`` replicas and drops a
fraction ``d`` of its requests. Replicas added now only serve after the cold start, so on
a scale-up the first ``cold_start`` seconds of the window still run the current count; a
step that straddles the cold start is time-weighted. Scale-downs act at once.

The replica count enters the relaxed objective only through integers, so the continuous
variable the optimiser moves is interpolated linearly between ``W[d, floor(x)]`` and
``W[d, ceil(x)]`` (and between drop-grid points). Building the tables is the only heavy
part; it is compiled with Numba and vectorised over (samples x steps x counts).
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np
from numba import njit

from .batched_latency import NO_TABLE, latency_row_batched
from .latency import latency_row, rho_max_factors

# Drop rates at which W is tabulated for jobs that may drop (penalty objectives).
DROP_GRID = np.array([0.0, 0.01, 0.02, 0.035, 0.05, 0.075, 0.10, 0.15, 0.20, 0.30, 0.40, 0.50, 0.65, 0.80, 1.0])
NO_DROP = np.array([0.0])


@njit(cache=True)
def _utility(lat: float, slo: float, alpha: float) -> float:
    if not np.isfinite(lat):
        return 0.0
    if lat <= slo:
        return 1.0
    u: float = (slo / lat) ** alpha
    return u


@njit(cache=True)
def step_utility_table(
    rates: np.ndarray,
    p: float,
    q: float,
    slo: float,
    alpha: float,
    rho_max: float,
    estimator: int,
    cmax: int,
    drop_grid: np.ndarray,
    table: np.ndarray = NO_TABLE,
    f_b: float = 1.0,
    bmax: int = 1,
    k: int = 1,
) -> np.ndarray:
    """``U[d, t, c]``: relaxed utility at step ``t`` averaged over the forecast samples.

    ``rates`` has shape (samples, steps) in requests/s. ``table``/``f_b``/``bmax``: replicas
    that serve batches of at most ``bmax`` (batched_latency.py: the batch curve's table at
    ``bmax`` and ``f(bmax)``); ``bmax`` 1: one request at a time.
    ``k``: each replica serves ``k`` requests at once, so ``c`` replicas are ``c k``
    servers of the estimator (docs/concurrency.md).
    """
    n_s, n_t = rates.shape
    n_d = drop_grid.shape[0]
    out = np.zeros((n_d, n_t, cmax + 1))
    factors = rho_max_factors(cmax * k, q, rho_max)
    row = np.empty(cmax * k + 1)
    for di in range(n_d):
        keep = 1.0 - drop_grid[di]
        for t in range(n_t):
            for s in range(n_s):
                lam = rates[s, t] * keep
                if lam < 0.0:
                    lam = 0.0
                latency_row_batched(lam, p, q, rho_max, estimator, factors, table, f_b, bmax, row)
                for c in range(cmax + 1):
                    out[di, t, c] += _utility(row[c * k], slo, alpha)
            for c in range(cmax + 1):
                out[di, t, c] /= n_s
    return out


@njit(cache=True)
def saturation_count(
    lam_max: float, p: float, q: float, slo: float, rho_max: float, estimator: int, cmax: int, k: int = 1
) -> int:
    """Fewest replicas (at most ``cmax``, of ``k`` servers each) whose latency at ``lam_max``
    meets the SLO.

    Latency falls with replicas and rises with the rate, so from this count on every
    forecast sample's step utility is exactly 1: a table needs no wider columns.
    """
    factors = rho_max_factors(cmax * k, q, rho_max)
    row = np.empty(cmax * k + 1)
    latency_row(lam_max, p, q, rho_max, estimator, factors, row)
    for c in range(cmax + 1):
        if row[c * k] <= slo:
            return c
    return cmax


@njit(cache=True)
def window_table(step_table: np.ndarray, current: int, new_fraction: np.ndarray) -> np.ndarray:
    """``W[d, c]``: window mean of ``step_table`` with the cold start applied to scale-ups.

    ``new_fraction[t]`` is the share of step ``t`` during which added replicas serve.
    """
    n_d, n_t, n_c = step_table.shape
    cur = min(max(current, 0), n_c - 1)
    out = np.zeros((n_d, n_c))
    for di in range(n_d):
        for c in range(n_c):
            acc = 0.0
            for t in range(n_t):
                if c <= cur:
                    acc += step_table[di, t, c]
                else:
                    f = new_fraction[t]
                    acc += (1.0 - f) * step_table[di, t, cur] + f * step_table[di, t, c]
            out[di, c] = acc / n_t
    return out


def cold_start_fractions(n_steps: int, window_s: float, cold_start_s: float) -> np.ndarray:
    """Share of each window step (of ``window_s / n_steps`` seconds) after the cold start."""
    dt = window_s / n_steps
    ends = dt * np.arange(1, n_steps + 1)
    return cast(np.ndarray, np.clip((ends - cold_start_s) / dt, 0.0, 1.0))


@njit(cache=True)
def interp_utilities(tables: np.ndarray, x: np.ndarray, d: np.ndarray, drop_grid: np.ndarray) -> np.ndarray:
    """Bilinear lookup of each job's window utility at continuous (replicas, drop rate).

    ``tables`` has shape (jobs, len(drop_grid), counts); jobs that never drop use row 0.
    """
    n = x.shape[0]
    n_d = tables.shape[1]
    n_c = tables.shape[2]
    out = np.empty(n)
    for i in range(n):
        xi = min(max(x[i], 0.0), n_c - 1.0)
        lo = int(math.floor(xi))
        if lo >= n_c - 1:
            lo = n_c - 2 if n_c > 1 else 0
        wx = xi - lo
        hi = min(lo + 1, n_c - 1)
        if n_d == 1:
            out[i] = (1.0 - wx) * tables[i, 0, lo] + wx * tables[i, 0, hi]
            continue
        di = min(max(d[i], 0.0), 1.0)
        k = 0
        while k < n_d - 2 and drop_grid[k + 1] <= di:
            k += 1
        span = drop_grid[k + 1] - drop_grid[k]
        wd = (di - drop_grid[k]) / span if span > 0 else 0.0
        if wd > 1.0:
            wd = 1.0
        a = (1.0 - wx) * tables[i, k, lo] + wx * tables[i, k, hi]
        b = (1.0 - wx) * tables[i, k + 1, lo] + wx * tables[i, k + 1, hi]
        out[i] = (1.0 - wd) * a + wd * b
    return out
