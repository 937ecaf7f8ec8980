"""Batched service: Sponge's latency model, its fit, and its choice of cores and batch
(Sponge, EuroMLSys '24, section 3; issue 20).

A replica that serves ``b`` requests together on ``c`` cores takes

    l(b, c) = gamma * b / c + eps / c + delta * b + eta        (seconds)

(the work that parallelises, per request and per batch, plus the part that does not), so it
serves ``h(b, c) = b / l(b, c)`` requests per second. The model is linear in its four
parameters, so the fit is a non-negative least squares over the profiled grid
(``scipy.optimize.nnls``): no starting point, no local minimum, and no negative time.

Sponge's adaptation (every second): the fewest cores ``c``, then the smallest batch ``b``,
such that every queued request, taken in earliest-deadline-first order in batches of ``b``,
finishes within its remaining budget, and ``h(b, c)`` keeps up with the arrival rate. With
no feasible pair it takes the most cores and the batch with the highest throughput there
(the paper leaves this case open; seed-notes.md says "use c_max").

Pure and Ray-free: the simulator, the live policy and the profiler's report use it alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from scipy.optimize import nnls

from ..batch_curve import BatchCurve

B_MAX = 16  # the paper's bounds on batch size and cores (section 4)
C_MAX = 16
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class BatchProfile:
    """Sponge's four parameters (seconds), and how well they fit the profile they came from."""

    gamma: float  # per request, parallel (x b / c)
    eps: float  # per batch, parallel (/ c)
    delta: float  # per request, serial (x b)
    eta: float  # per batch, serial
    r2: float = math.nan  # coefficient of determination of the fit (NaN: not fitted)
    points: int = 0  # profiled (b, c) points behind the fit

    def __post_init__(self) -> None:
        p = (self.gamma, self.eps, self.delta, self.eta)
        if not all(math.isfinite(x) and x >= 0 for x in p) or sum(p) <= 0:
            raise ValueError(f"batch profile parameters must be finite, >= 0 and not all 0: {p}")

    def latency(self, b: npt.ArrayLike, c: npt.ArrayLike) -> FloatArray:
        """Seconds to serve a batch of ``b`` on ``c`` cores (arrays broadcast)."""
        b = np.asarray(b, dtype=float)
        c = np.asarray(c, dtype=float)
        return cast(FloatArray, self.gamma * b / c + self.eps / c + self.delta * b + self.eta)

    def throughput(self, b: npt.ArrayLike, c: npt.ArrayLike) -> FloatArray:
        """Requests per second at batch ``b`` on ``c`` cores: ``b / l(b, c)``."""
        return np.asarray(b, dtype=float) / self.latency(b, c)

    def to_dict(self) -> dict[str, float]:
        return {
            "gamma": self.gamma,
            "eps": self.eps,
            "delta": self.delta,
            "eta": self.eta,
            "r2": self.r2,
            "points": self.points,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BatchProfile":
        try:
            return cls(
                float(d["gamma"]),
                float(d["eps"]),
                float(d["delta"]),
                float(d["eta"]),
                float(d.get("r2", math.nan)),
                int(d.get("points", 0)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a batch profile ({err}): {d!r}") from None


@dataclass(frozen=True)
class CurveProfile:
    """A batch latency curve with no cores in it (a GPU's, ``faro_serve/batch_curve.py``),
    as Sponge's choice reads a profile: ``l(b, c) = l(b)`` whatever ``c``."""

    curve: BatchCurve

    def latency(self, b: npt.ArrayLike, c: npt.ArrayLike) -> FloatArray:
        curve: Any = self.curve  # BatchCurve.latency is not annotated
        return cast(FloatArray, curve.latency(np.asarray(b, dtype=float)) + 0.0 * np.asarray(c, dtype=float))

    def throughput(self, b: npt.ArrayLike, c: npt.ArrayLike) -> FloatArray:
        return np.asarray(b, dtype=float) / self.latency(b, c)


# What Sponge's choice reads of a profile: l(b, c) and h(b, c), fitted or from a curve
SpongeProfile = BatchProfile | CurveProfile


def fit_profile(batch: npt.ArrayLike, cores: npt.ArrayLike, latency_s: npt.ArrayLike) -> BatchProfile:
    """Fit ``l(b, c)`` to measured latencies (seconds) at (batch, cores) points.

    Needs at least two batch sizes and two core counts (else the parallel and serial parts
    cannot be told apart) and positive finite latencies; raises ``ValueError`` naming what
    is wrong otherwise."""
    b, c, y = (np.asarray(x, dtype=float).ravel() for x in (batch, cores, latency_s))
    if not (b.size == c.size == y.size):
        raise ValueError(f"batch, cores and latency differ in length: {b.size}, {c.size}, {y.size}")
    if not (np.all(np.isfinite(y)) and np.all(y > 0)):
        raise ValueError("latencies must be finite and > 0")
    if not (np.all(b >= 1) and np.all(c > 0)):
        raise ValueError("batch sizes must be >= 1 and cores > 0")
    if np.unique(b).size < 2 or np.unique(c).size < 2:
        raise ValueError(
            f"profile at least 2 batch sizes and 2 core counts (got batch "
            f"{sorted(set(b.tolist()))}, cores {sorted(set(c.tolist()))})"
        )
    x = np.column_stack([b / c, 1.0 / c, b, np.ones_like(b)])
    coef, _ = nnls(x, y)
    resid = y - x @ coef
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / total if total > 0 else 1.0
    gamma, eps, delta, eta = (float(v) for v in coef)
    return BatchProfile(gamma, eps, delta, eta, r2=r2, points=int(y.size))


def edf_order(deadlines: npt.ArrayLike) -> npt.NDArray[np.intp]:
    """Indices of queued requests in earliest-deadline-first order (ties: first come first)."""
    return np.argsort(np.asarray(deadlines, dtype=float), kind="stable")


def meets_budgets(profile: SpongeProfile, b: int, c: float, budgets_s: npt.ArrayLike) -> bool:
    """Whether every queued request, served EDF in batches of ``b`` on ``c`` cores, ends
    within its remaining budget: the ``k``-th (from 1) ends after ``ceil(k / b) l(b, c)``."""
    return _fits(float(profile.latency(b, c)), b, np.sort(np.asarray(budgets_s, dtype=float)))


def _fits(lat: float, b: int, sorted_budgets: np.ndarray) -> bool:
    k = np.arange(1, sorted_budgets.size + 1)
    return bool(np.all(np.ceil(k / b) * lat <= sorted_budgets))


@dataclass(frozen=True)
class SpongeChoice:
    cores: int
    batch: int
    feasible: bool  # False: no pair met every budget and the rate (the fallback was taken)


def sponge_choice(
    profile: SpongeProfile,
    budgets_s: npt.ArrayLike,
    rate: float,
    c_max: int = C_MAX,
    b_max: int = B_MAX,
    c_min: int = 1,
) -> SpongeChoice:
    """Sponge's adaptation step: the fewest cores (from ``c_min``), then the smallest batch,
    that meet every queued budget (EDF) and the arrival ``rate``; else ``c_max`` with its
    best throughput."""
    if not 1 <= c_min <= c_max or b_max < 1:
        raise ValueError(f"need 1 <= c_min <= c_max and b_max >= 1 (got {c_min}, {c_max}, {b_max})")
    budgets = np.sort(np.asarray(budgets_s, dtype=float))  # once, not per (c, b) pair
    for c in range(c_min, c_max + 1):
        for b in range(1, b_max + 1):
            lat = float(profile.latency(b, c))
            if b / lat >= rate and _fits(lat, b, budgets):
                return SpongeChoice(c, b, True)
    bs = np.arange(1, b_max + 1)
    return SpongeChoice(c_max, int(bs[np.argmax(profile.throughput(bs, c_max))]), False)
