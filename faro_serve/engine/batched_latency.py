"""Latency of replicas that serve dynamic batches, for the planner (issues 20, 47; beyond the
paper).

Faro's estimators (``latency.py``, paper section 3.3) assume a replica serves one request at
a time. A replica that batches takes up to ``B`` queued requests when it frees and serves
them together in ``l(k) = p f(k)``: ``p`` is one request's processing time and ``f`` the
batch curve's shape (``faro_serve/batch_curve.py``: ``f(1) = 1``; on a CPU about ``s k + 1 - s``, on a
GPU nearly flat up to a batch of 16-32). Such a queue (bulk service with a batch-dependent
time, ``M/G^(1,B)/c``) has no closed form, and the closed-form approximations tried here
missed the simulator by up to 2.4x on the H200 curves: how far replicas' batches
synchronise (all freeing at once and splitting the queue, or taking it in turn) depends on
the curve's shape and the load, and decides the tail (docs/batching.md, "The estimator").

So, as InferLine's planner estimates with a discrete-event simulation of its pipeline
(SoCC '20, section 4.2), the estimate here is the queue itself, simulated once per batch
curve and percentile on a grid and looked up: in units of ``p`` the latency depends only on
the number of replicas ``c``, the largest batch ``B`` and the load
``rho = lam p f(B) / (c B)`` (the share of what ``c`` replicas serve in full batches).
:func:`queue_quantile` simulates Poisson arrivals on ``c`` replicas that each take up to
``B`` queued requests when they free (the simulator's kernel's rule,
``faro_serve/sim/kernels.py``: a free replica takes a lone arrival at once); a table holds
its percentile at every grid point (``C_GRID`` x ``RHO_GRID``, non-decreasing in the load),
built once per curve (about a second) and cached; :func:`latency_table` interpolates it
(bilinear; at zero load one request alone, ``p``; past ``rho_max`` the paper's relaxation,
so the optimiser sees no plateau; beyond 64 replicas the 64-replica row). With ``B = 1``
it is exactly the paper's M/D/c estimate, not a table.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from numba import njit

from .latency import EST_MDC_EXACT, EST_UPPER, latency, latency_row

BATCH_CHOICES = (1, 2, 4, 8, 16, 32, 64)  # the largest batches the planner weighs
C_GRID = np.array([1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64], dtype=np.float64)
RHO_GRID = np.array([0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98])
N_REQUESTS = 20_000  # simulated per grid point, 3x from load 0.9 (a tenth warms it up)
SEED = 47


@njit(cache=True)
def curve_at(shape: np.ndarray, k: float) -> float:
    """``f(k)`` of a batch curve's shape (``shape[b]`` for whole ``b``), interpolated between
    whole batches, held at 1 below one and at the last batch beyond it."""
    last = shape.shape[0] - 1
    if k <= 1.0:
        first: float = shape[1]
        return first
    if k >= last:
        at_last: float = shape[last]
        return at_last
    lo = int(np.floor(k))
    w = k - lo
    between: float = (1.0 - w) * shape[lo] + w * shape[lo + 1]
    return between


@njit(cache=True)
def queue_quantile(shape: np.ndarray, bmax: int, c: int, lam: float, q: float, n: int, seed: int) -> float:
    """The ``q`` quantile of the latency (in units of one request's time) of Poisson
    arrivals at ``lam`` per unit on ``c`` replicas that each take up to ``bmax`` queued
    requests when they free and serve a batch of ``b`` in ``shape[b]``."""
    np.random.seed(seed)
    arr = np.cumsum(np.random.exponential(1.0 / lam, n))
    lat = np.empty(n)
    free = np.zeros(c)
    h = 0
    while h < n:
        k = 0
        for j in range(1, c):
            if free[j] < free[k]:
                k = j
        s = max(free[k], arr[h])
        j = h + 1
        while j < n and j - h < bmax and arr[j] <= s:
            j += 1
        end = s + shape[j - h]
        for m in range(h, j):
            lat[m] = end - arr[m]
        free[k] = end
        h = j
    return np.quantile(lat[n // 10 :], q)


@njit(cache=True)
def fill_table(
    shape: np.ndarray, bmax: int, q: float, c_grid: np.ndarray, rho_grid: np.ndarray, n: int, seed: int
) -> np.ndarray:
    """``out[i, j]``: :func:`queue_quantile` at ``c_grid[i]`` replicas and load
    ``rho_grid[j]``, made non-decreasing in the load (the simulation's noise must not tell
    the optimiser that more load is faster)."""
    out = np.empty((c_grid.shape[0], rho_grid.shape[0]))
    for i in range(c_grid.shape[0]):
        c = int(c_grid[i])
        for j in range(rho_grid.shape[0]):
            lam = rho_grid[j] * c * bmax / shape[bmax]
            m = n if rho_grid[j] < 0.9 else 3 * n  # near full load the queue settles slowly
            v = queue_quantile(shape, bmax, c, lam, q, m, seed + 1000 * i + j)
            out[i, j] = v if j == 0 else max(v, out[i, j - 1])
    return out


# (shape, B, q) -> table, the most recently used last
_TABLES: OrderedDict[tuple[bytes, int, float], np.ndarray] = OrderedDict()
TABLES_KEPT = 256  # tables a process keeps (about 1.6 KB each)


def batch_table(shape: np.ndarray, bmax: int, q: float) -> np.ndarray:
    """The (cached) table of a batch curve's shape, largest batch ``bmax`` and quantile."""
    f = np.ascontiguousarray(np.round(np.asarray(shape, dtype=np.float64)[: bmax + 1], 6))
    if f.shape[0] < bmax + 1:
        raise ValueError(f"a batch curve's shape must reach batch {bmax} (it has {f.shape[0] - 1})")
    key = (f.tobytes(), int(bmax), round(float(q), 9))
    tab = _TABLES.get(key)
    if tab is None:
        tab = fill_table(f, int(bmax), float(q), C_GRID, RHO_GRID, N_REQUESTS, SEED)
        _TABLES[key] = tab
        while len(_TABLES) > TABLES_KEPT:
            _TABLES.popitem(last=False)
    _TABLES.move_to_end(key)
    return tab


@njit(cache=True)
def _bracket(grid: np.ndarray, x: float) -> tuple[int, float]:
    """Index ``i`` and weight ``w`` with ``x = (1 - w) grid[i] + w grid[i + 1]`` (clamped)."""
    last = grid.shape[0] - 1
    if x <= grid[0]:
        return 0, 0.0
    if x >= grid[last]:
        return last - 1, 1.0
    i = 0
    while grid[i + 1] < x:
        i += 1
    return i, (x - grid[i]) / (grid[i + 1] - grid[i])


@njit(cache=True)
def _lookup(table: np.ndarray, c: float, rho: float) -> float:
    """The table at ``c`` replicas and load ``rho`` (both interpolated; 1 at zero load)."""
    ci, cw = _bracket(C_GRID, c)
    if rho < RHO_GRID[0]:  # toward one request alone at zero load
        a = (1.0 - cw) * table[ci, 0] + cw * table[ci + 1, 0]
        near_zero: float = 1.0 + (a - 1.0) * rho / RHO_GRID[0]
        return near_zero
    ri, rw = _bracket(RHO_GRID, rho)
    lo: float = (1.0 - rw) * table[ci, ri] + rw * table[ci, ri + 1]
    hi: float = (1.0 - rw) * table[ci + 1, ri] + rw * table[ci + 1, ri + 1]
    return (1.0 - cw) * lo + cw * hi


@njit(cache=True)
def latency_table(
    c: int, lam: float, p: float, rho_max: float, estimator: int, table: np.ndarray, f_b: float, b: int
) -> float:
    """Estimated latency of ``c`` replicas serving batches of at most ``b`` (``f_b`` =
    ``f(b)``) at ``lam`` requests/s of one-alone time ``p``, from ``table`` (``batch_table``
    of the curve at ``b``); ``estimator`` as in :func:`faro_serve.engine.latency.latency`."""
    if c <= 0:
        return np.inf
    if lam <= 0.0:
        return p
    if estimator == EST_UPPER:  # a second's requests at once, in full batches
        return max(p, lam / (c * b) * p * f_b)
    rho = lam * p * f_b / (c * b)
    top: float = RHO_GRID[RHO_GRID.shape[0] - 1]
    if estimator == EST_MDC_EXACT:
        if rho >= 1.0:
            return np.inf
        if rho > top:  # diverging toward full load
            return p * _lookup(table, c, top) * (1.0 - top) / (1.0 - rho)
        return p * _lookup(table, c, rho)
    if rho > rho_max:  # the paper's relaxation: scaled by the load beyond rho_max
        return rho / rho_max * p * _lookup(table, c, rho_max)
    return p * _lookup(table, c, rho)


@njit(cache=True)
def latency_row_batched(
    lam: float,
    p: float,
    q: float,
    rho_max: float,
    estimator: int,
    factors: np.ndarray,
    table: np.ndarray,
    f_b: float,
    bmax: int,
    out: np.ndarray,
) -> None:
    """``out[c]`` for c = 0..len(out)-1 (as :func:`latency_row`, which it is at ``bmax`` 1)."""
    if bmax <= 1:
        latency_row(lam, p, q, rho_max, estimator, factors, out)
        return
    out[0] = np.inf
    for c in range(1, out.shape[0]):
        out[c] = latency_table(c, lam, p, rho_max, estimator, table, f_b, bmax)


NO_TABLE = np.ones((1, 1))  # what a model that does not batch passes


def latency_batched(
    c: int, lam: float, p: float, q: float, rho_max: float, estimator: int, shape: np.ndarray | None, bmax: int
) -> float:
    """Estimated ``q`` percentile latency (s) of ``c`` replicas serving batches of at most
    ``bmax`` along ``shape`` (module docstring); the paper's estimate at ``bmax`` 1."""
    if bmax <= 1 or shape is None:
        return latency(c, lam, p, q, rho_max, estimator)
    return latency_table(
        int(c),
        float(lam),
        float(p),
        float(rho_max),
        int(estimator),
        batch_table(shape, bmax, q),
        float(shape[bmax]),
        int(bmax),
    )


def max_rate_batched(
    c: int,
    p: float,
    slo: float,
    q: float,
    estimator: int,
    rho_max: float,
    shape: np.ndarray,
    bmax: int,
    tol: float = 1e-4,
) -> float:
    """The largest rate (requests/s) at which ``c`` batching replicas meet ``slo`` (s), by
    bisection; 0 when even one request alone does not."""
    if c < 1 or slo < p:
        return 0.0
    est = EST_MDC_EXACT if estimator != EST_UPPER else estimator
    lo, hi = 0.0, c * bmax / (p * float(shape[bmax]))  # the load of full batches
    while hi - lo > tol * max(hi, 1.0):
        mid = 0.5 * (lo + hi)
        if latency_batched(c, mid, p, q, rho_max, est, shape, bmax) <= slo:
            lo = mid
        else:
            hi = mid
    return lo
