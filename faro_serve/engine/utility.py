"""Per-job utilities, the drop penalty and the five cluster objectives (paper 3.1-3.2).

Pure numpy, no Ray. Latencies and SLOs share a unit (the engine uses seconds).
"""

from __future__ import annotations

from typing import cast

import numpy as np
import numpy.typing as npt

OBJECTIVES = ("sum", "fair", "fair_sum", "penalty_sum", "penalty_fair_sum")
PENALTY_OBJECTIVES = ("penalty_sum", "penalty_fair_sum")

# AWS-style service credits (paper Table 5): availability lower edges -> penalty.
PENALTY_STEPS = ((0.99, 0.0), (0.95, 0.25), (0.90, 0.50))
PENALTY_BELOW = 1.0

# Relaxed penalty: piecewise linear through the table's points, availability 99 % -> 25 %,
# 95 % -> 50 %, 90 % -> 100 % (and 100 % -> 0). It is never below the step function and has
# no plateau above 90 %, so every dropped request costs something: with the paper's metric a
# dropped request counts as infinite latency, so a "free" 1 % drop would cost a whole
# minute's utility. (Drawn through the lower corners instead, 1 % of drops would be free and
# the penalty objectives would drop them for nothing.)
_RELAXED_AVAIL = np.array([0.0, 0.90, 0.95, 0.99, 1.0])
_RELAXED_PENALTY = np.array([1.0, 1.0, 0.50, 0.25, 0.0])


def utility_step(latency: npt.ArrayLike, slo: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """U_original: 1 when the latency meets the SLO, else 0 (infinite latency -> 0)."""
    return (np.asarray(latency, dtype=float) <= np.asarray(slo, dtype=float)).astype(float)


def utility_relaxed(latency: npt.ArrayLike, slo: npt.ArrayLike, alpha: float = 1.0) -> npt.NDArray[np.float64]:
    """Relaxed utility ``min((s / l) ** alpha, 1)`` (paper eq. 1); 0 for infinite latency."""
    lat = np.asarray(latency, dtype=float)
    slo = np.asarray(slo, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        u = np.where(np.isinf(lat), 0.0, np.minimum((slo / np.maximum(lat, 1e-300)) ** alpha, 1.0))
    return u


def penalty_step(availability: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Service-credit penalty for an availability (1 - drop rate), paper Table 5."""
    a = np.asarray(availability, dtype=float)
    out = np.full(a.shape, PENALTY_BELOW)
    for edge, pen in reversed(PENALTY_STEPS):
        out = np.where(a >= edge - 1e-12, pen, out)
    return out


def penalty_relaxed(availability: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """Piecewise-linear relaxation of :func:`penalty_step` (paper section 3.4)."""
    a = np.clip(np.asarray(availability, dtype=float), 0.0, 1.0)
    return cast("npt.NDArray[np.float64]", np.interp(a, _RELAXED_AVAIL, _RELAXED_PENALTY))


def phi(drop_rate: npt.ArrayLike, relaxed: bool = True) -> npt.NDArray[np.float64]:
    """Penalty multiplier ``phi(d) = 1 - penalty(1 - d)`` used by effective utility (eq. 2)."""
    avail = 1.0 - np.asarray(drop_rate, dtype=float)
    return 1.0 - (penalty_relaxed(avail) if relaxed else penalty_step(avail))


def effective_utility(
    utility: npt.ArrayLike, drop_rate: npt.ArrayLike, relaxed: bool = True
) -> npt.NDArray[np.float64]:
    """EU = phi(d) * U (paper eq. 2)."""
    return cast("npt.NDArray[np.float64]", phi(drop_rate, relaxed) * np.asarray(utility, dtype=float))


def cluster_objective(
    kind: str,
    utilities: npt.ArrayLike,
    priority: npt.ArrayLike | None = None,
    gamma: float | None = None,
    fair_tiebreak: float = 0.0,
) -> float:
    """Value (to maximise) of one of the five cluster objectives (paper section 3.2).

    ``utilities`` are U for sum/fair/fair_sum and EU for the penalty variants. ``fair`` is
    ``-(max U - min U)``; ``fair_tiebreak`` adds ``tiebreak * mean(U)`` so that among equally
    fair allocations the one with more utility wins (0 reproduces the paper exactly).
    """
    u = np.asarray(utilities, dtype=float)
    if u.size == 0:
        return 0.0
    pri = np.ones_like(u) if priority is None else np.asarray(priority, dtype=float)
    g = float(u.size) if gamma is None else float(gamma)
    spread = float(u.max() - u.min())
    if kind in ("sum", "penalty_sum"):
        return float(pri @ u)
    if kind == "fair":
        return -spread + fair_tiebreak * float(u.mean())
    if kind in ("fair_sum", "penalty_fair_sum"):
        return float(pri @ u) - g * spread
    raise ValueError(f"unknown objective {kind!r}; choose one of {', '.join(OBJECTIVES)}")
