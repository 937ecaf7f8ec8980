"""Latency estimators (Faro paper section 3.3 and the relaxation of section 3.4).

All functions are Numba-compiled and Ray-free. Times are in seconds, rates in requests/s.

* Upper bound: ``kappa = lambda * 1 s`` requests arriving at once on ``N`` replicas finish
  after ``p * kappa / N``; a request never finishes faster than its own processing time, so
  the estimate is ``max(p, p * lambda / N)``.
* M/D/c: the k-th percentile latency is ``p + W_k / 2`` where ``W_k`` is the k-th percentile
  of the M/M/c (Erlang C) waiting time, the engineering approximation the paper cites
  (Tijms 2006). Unstable queues (rho >= 1) have infinite latency.
* Relaxed M/D/c: beyond ``rho_max`` the latency is ``lambda / lambda_rho_max`` times the
  latency at ``lambda_rho_max = rho_max * N / p``, which removes the plateau at infinity.

The row kernel walks replica counts ``c = 0..cmax`` with the Erlang-B recursion, so one
pass gives the latency of every count for one arrival rate (O(cmax) instead of O(cmax^2)).

Every function here counts *servers*: one request at a time each, ``p`` seconds per request.
A replica of concurrency ``k`` (ModelSLO.concurrency) is ``k`` servers, so ``c`` replicas
are ``c k`` servers (docs/concurrency.md); the replica-facing helpers below
(:func:`min_replicas_for_slo`, :func:`max_rate_for_slo`) take ``concurrency`` and convert.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

EST_MDC = 0  # relaxed M/D/c (the paper's default)
EST_UPPER = 1  # upper-bound estimator
EST_MDC_EXACT = 2  # M/D/c without the rho_max relaxation (infinite when unstable)

ESTIMATORS = {"mdc": EST_MDC, "upper": EST_UPPER, "mdc-exact": EST_MDC_EXACT}


@njit(cache=True)
def erlang_b(c: int, a: float) -> float:
    """Erlang-B blocking probability for ``c`` servers and offered load ``a`` (stable recursion)."""
    b = 1.0
    for n in range(1, c + 1):
        b = a * b / (n + a * b)
    return b


@njit(cache=True)
def erlang_c(c: int, a: float) -> float:
    """Erlang-C probability that an arrival waits in M/M/c; 1 when the queue is unstable."""
    if c <= 0 or a >= c:
        return 1.0
    if a <= 0.0:
        return 0.0
    b = erlang_b(c, a)
    return b / (1.0 - (a / c) * (1.0 - b))


@njit(cache=True)
def _wait_quantile_from_c(prob_wait: float, c: int, a: float, p: float, q: float) -> float:
    """k-th percentile of the M/M/c waiting time: P(W > t) = C exp(-(c - a) t / p)."""
    tail = 1.0 - q
    if prob_wait <= tail:
        return 0.0
    return math.log(prob_wait / tail) * p / (c - a)


@njit(cache=True)
def mmc_wait_quantile(c: int, lam: float, p: float, q: float) -> float:
    """k-th percentile (``q`` in (0,1)) of the M/M/c waiting time in seconds; inf if unstable."""
    a = lam * p
    if c <= 0 or a >= c:
        return np.inf
    return _wait_quantile_from_c(erlang_c(c, a), c, a, p, q)


@njit(cache=True)
def latency_mdc(c: int, lam: float, p: float, q: float) -> float:
    """M/D/c k-th percentile latency ~ p + W_k(M/M/c) / 2; inf when rho >= 1."""
    w = mmc_wait_quantile(c, lam, p, q)
    if np.isinf(w):
        return np.inf
    return p + 0.5 * w


@njit(cache=True)
def latency_upper(c: int, lam: float, p: float) -> float:
    """Upper-bound estimator ``max(p, p * lambda * 1 s / N)``."""
    if c <= 0:
        return np.inf
    return max(p, p * lam / c)


@njit(cache=True)
def rho_max_factors(cmax: int, q: float, rho_max: float) -> np.ndarray:
    """``F[c]`` with latency_mdc(c, lambda_rho_max, p, q) = p * F[c] (independent of p).

    At rho_max the offered load is ``a = rho_max * c`` for every ``p``, so the Erlang-C
    probability and hence the waiting time in units of ``p`` depend only on ``c``.
    """
    f = np.full(cmax + 1, np.inf)
    for c in range(1, cmax + 1):
        a = rho_max * c
        pw = erlang_c(c, a)
        tail = 1.0 - q
        w = 0.0
        if pw > tail:
            w = math.log(pw / tail) / (c - a)
        f[c] = 1.0 + 0.5 * w
    return f


@njit(cache=True)
def latency_relaxed(c: int, lam: float, p: float, q: float, rho_max: float) -> float:
    """Relaxed M/D/c (paper section 3.4): scaled latency at rho_max when rho > rho_max."""
    if c <= 0:
        return np.inf
    if lam * p / c <= rho_max:
        return latency_mdc(c, lam, p, q)
    lam_r = rho_max * c / p
    return lam / lam_r * latency_mdc(c, lam_r, p, q)


@njit(cache=True)
def latency_row(
    lam: float, p: float, q: float, rho_max: float, estimator: int, factors: np.ndarray, out: np.ndarray
) -> None:
    """Fill ``out[c]`` (c = 0..len(out)-1) with the estimated latency for arrival rate ``lam``.

    ``factors`` is :func:`rho_max_factors` for the same ``q`` and ``rho_max``.
    """
    cmax = out.shape[0] - 1
    out[0] = np.inf
    if estimator == EST_UPPER:
        for c in range(1, cmax + 1):
            out[c] = max(p, p * lam / c)
        return
    a = lam * p
    b = 1.0  # Erlang B for c - 1 servers
    for c in range(1, cmax + 1):
        b = a * b / (c + a * b)
        if a < c and (estimator == EST_MDC_EXACT or a / c <= rho_max):
            if a <= 0.0:
                out[c] = p
            else:
                pw = b / (1.0 - (a / c) * (1.0 - b))
                out[c] = p + 0.5 * _wait_quantile_from_c(pw, c, a, p, q)
        elif estimator == EST_MDC_EXACT:
            out[c] = np.inf
        else:
            # lam / lam_r * p * F[c] with lam_r = rho_max * c / p
            out[c] = lam * p * p * factors[c] / (rho_max * c)


@njit(cache=True)
def latency(c: int, lam: float, p: float, q: float, rho_max: float, estimator: int) -> float:
    """Scalar front door: the chosen estimator's latency for ``c`` replicas."""
    if estimator == EST_UPPER:
        return latency_upper(c, lam, p)
    if estimator == EST_MDC_EXACT:
        return latency_mdc(c, lam, p, q)
    return latency_relaxed(c, lam, p, q, rho_max)


def min_replicas_for_slo(
    lam: float,
    p: float,
    slo: float,
    q: float,
    estimator: str = "mdc",
    rho_max: float = 0.95,
    limit: int = 100_000,
    concurrency: int = 1,
) -> tuple[int, float]:
    """Fewest replicas whose estimated k-th percentile latency meets ``slo`` (seconds).

    A replica is ``concurrency`` servers (module docstring). Returns ``(replicas,
    latency)``. Raises ValueError when even ``limit`` replicas do not meet it (the SLO is
    below the processing time).
    """
    if slo < p:
        raise ValueError(f"SLO {slo * 1e3:g} ms is below the processing time {p * 1e3:g} ms: no replica count meets it")
    est = ESTIMATORS[estimator]
    # For the M/D/c family use the exact (unrelaxed) queue: the relaxation only matters
    # inside the optimiser and never makes an unstable count look feasible anyway.
    if est == EST_MDC:
        est = EST_MDC_EXACT
    # Server counts at or below the offered load are unstable for M/D/c; start just below it.
    c = 1 if est == EST_UPPER else max(1, int(math.floor(lam * p)) // concurrency)
    while c <= limit:
        lat = latency(c * concurrency, lam, p, q, rho_max, est)
        if lat <= slo * (1 + 1e-12):
            return c, float(lat)
        c += 1
    raise ValueError(f"no replica count up to {limit} meets the SLO")


def max_rate_for_slo(
    c: int,
    p: float,
    slo: float,
    q: float,
    estimator: str = "mdc",
    rho_max: float = 0.95,
    tol: float = 1e-4,
    concurrency: int = 1,
) -> float:
    """Largest arrival rate (requests/s) at which ``c`` replicas (of ``concurrency`` servers
    each) still meet ``slo``: the inverse of :func:`min_replicas_for_slo`, by bisection
    (latency rises with the rate)."""
    if c < 1 or slo < p:
        return 0.0
    c = c * concurrency
    est = ESTIMATORS[estimator]
    if est == EST_MDC:
        est = EST_MDC_EXACT
    lo, hi = 0.0, c / p  # at c / p the queue is unstable
    while hi - lo > tol * max(hi, 1.0):
        mid = 0.5 * (lo + hi)
        if latency(c, mid, p, q, rho_max, est) <= slo:
            lo = mid
        else:
            hi = mid
    return lo
