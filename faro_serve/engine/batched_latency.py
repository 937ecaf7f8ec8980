"""Latency of replicas that serve dynamic batches, for the planner (issue 20, beyond the paper).

Faro's estimators (``latency.py``, paper section 3.3) assume a replica serves one request at
a time. A replica that batches takes up to ``B`` queued requests when it frees and serves
them together in ``l(k) = p (s k + 1 - s)``: ``p`` is one request's processing time and
``s`` the share of it that grows with the batch (Sponge's profile at the replica's cores,
:func:`batch_shape`; ``s = 1``: batching gains nothing). Per request a batch of ``k`` costs
``l(k) / k``, so the larger the batches, the more a replica serves, and the longer each
request takes.

The estimate (checked against the batched numba kernel, tests/test_batched_planning.py):

1. The typical batch ``k``: a replica that frees finds a queue of ``Q`` requests; in M/D/c
   (the paper's approximation, half the M/M/c wait) ``Q`` is about geometric with mean
   ``Lq``, and the replica takes ``min(max(Q, 1), B)``. Its mean is a fixed point in ``k``
   (the per-request work ``l(k) / k`` sets the load, the load sets ``Lq``), found by a damped
   iteration.
2. The wait: the M/D/c ``q`` percentile wait at per-request work ``l(k) / k`` (the paper's
   relaxed form beyond ``rho_max``, so the optimiser sees no plateau at infinity).
3. The latency: the wait plus the mean of ``l(k)`` and ``l(k_q)``, ``k_q`` the batch at the
   queue's ``q`` quantile (a request that waits long is served in a large batch).

With ``B = 1`` this is exactly the paper's M/D/c estimate.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .latency import EST_UPPER, latency, latency_row

BATCH_CHOICES = (1, 2, 4, 8, 16, 32)  # the maximum batch sizes the planner weighs


@njit(cache=True)
def _typical_batch(lam: float, c: int, p: float, s: float, bmax: int) -> float:
    """Mean batch a freed replica takes (step 1 of the module docstring); ``bmax`` + 1 when
    even batches of ``bmax`` cannot keep up."""
    k = 1.0
    for _ in range(40):
        a = lam * p * (s + (1.0 - s) / k)
        if a >= c:
            if k >= bmax:
                return bmax + 1.0
            k = min(float(bmax), 1.5 * k + 1.0)
            continue
        lq = _queue_mean(c, a)
        g = lq / (1.0 + lq)
        knew = (1.0 - g) + g * (1.0 - g ** bmax) / (1.0 - g)  # E[min(max(Q, 1), B)]
        knew = min(max(knew, 1.0), float(bmax))
        if abs(knew - k) < 1e-4:
            return knew
        k = 0.5 * (k + knew)
    return k


@njit(cache=True)
def _queue_mean(c: int, a: float) -> float:
    """M/D/c mean queue length: half of M/M/c's ``C a / (c - a)``."""
    b = 1.0
    for n in range(1, c + 1):
        b = a * b / (n + a * b)
    pw = b / (1.0 - (a / c) * (1.0 - b))
    return 0.5 * pw * a / (c - a)


@njit(cache=True)
def latency_batched(c: int, lam: float, p: float, q: float, rho_max: float, estimator: int,
                    s: float, bmax: int) -> float:
    """Estimated ``q`` percentile latency of ``c`` replicas serving batches of at most ``bmax``
    (module docstring); ``estimator`` as in :func:`faro_serve.engine.latency.latency`."""
    if c <= 0:
        return np.inf
    if bmax <= 1 or lam <= 0.0:
        return latency(c, lam, p, q, rho_max, estimator)
    k = _typical_batch(lam, c, p, s, bmax)
    if k > bmax:  # even full batches fall behind: the relaxed form at full batches
        k = float(bmax)
    pv = p * (s + (1.0 - s) / k)
    lk = p * (s * k + 1.0 - s)
    if estimator == EST_UPPER:
        return max(lk, pv * lam / c + lk - pv)
    w = latency(c, lam, pv, q, rho_max, estimator)
    if not np.isfinite(w):
        return np.inf
    w -= pv
    a = lam * pv
    kq = 1.0
    if a < c:
        lq = _queue_mean(c, a)
        g = lq / (1.0 + lq)
        if g > 0.0:
            kq = min(float(bmax), max(1.0, math.ceil(math.log(1.0 - q) / math.log(g))))
    else:
        kq = float(bmax)
    lq_batch = p * (s * kq + 1.0 - s)
    return w + 0.5 * (lk + lq_batch)


@njit(cache=True)
def latency_row_batched(lam: float, p: float, q: float, rho_max: float, estimator: int,
                        factors: np.ndarray, s: float, bmax: int, out: np.ndarray) -> None:
    """``out[c]`` for c = 0..len(out)-1 (as :func:`latency_row`, which it is at ``bmax`` 1)."""
    if bmax <= 1:
        latency_row(lam, p, q, rho_max, estimator, factors, out)
        return
    out[0] = np.inf
    for c in range(1, out.shape[0]):
        out[c] = latency_batched(c, lam, p, q, rho_max, estimator, s, bmax)
