"""How long a replica takes to serve a batch: one curve for CPUs and GPUs (issue 47).

A replica that serves ``b`` requests together takes ``l(b)`` seconds. On a CPU the time
grows about linearly with the batch (Sponge's affine model, ``batching.py``: a batch saves a
share of the per-batch work). On a GPU it is nearly flat up to a batch of 16-32 and then
linear (measured on an H200, ``shared/profiles``: ResNet50 3.3 ms at 1, 4.3 ms at 16, 9.5 ms
at 64), so one replica that batches serves 10-25x the requests of one that does not.

:class:`BatchCurve` holds ``l(b)`` as breakpoints, ``(batch, seconds)``, joined linearly,
flat before the first and extended along the last segment beyond the last: the shape the
data has, whatever the hardware. Three sources make one:

* measured points (a profile's medians per batch size, :meth:`BatchCurve.from_points`),
  made non-decreasing by isotonic regression (a larger batch never takes less time; the
  GPU's timings at small batches are noisy: ResNet50's batch of 2 took 4.6 ms, of 4 3.6 ms);
* Sponge's affine model at a number of cores (:meth:`BatchCurve.affine`);
* a fit of the hinge ``l(b) = base + slope * max(b - knee, 0)`` (:func:`fit_hinge`), flat
  then linear, three numbers: what a replica's own few, noisy batch timings support (the
  live measurement, ``autoscaler/policies/service.py``) and the summary docs/batching.md reports of
  how well that shape fits the H200 and the 16-core CPU profiles.

The planner and the simulator use the curve's shape, ``f(b) = l(b) / l(1)`` (:meth:`shape`),
scaled by the measured time of one request alone: a profile taken on another machine still
says what a batch costs relative to one request. Pure numpy/scipy, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import isotonic_regression, nnls

MAX_BATCH = 64  # the largest batch a model may declare (ModelSLO.batching.max_batch_size)


@dataclass(frozen=True)
class BatchCurve:
    """``l(b)`` in seconds, by breakpoints (module docstring); how well it fits the
    measurements it came from, where it came from measurements."""

    points: tuple[tuple[float, float], ...]  # (batch >= 1, seconds), batches increasing
    r2: float = math.nan  # of the per-batch medians it was made from (NaN: not measured)
    max_rel_err: float = math.nan  # largest |fit - median| / median over those batches
    measured: int = 0  # measurements behind it

    def __post_init__(self) -> None:
        pts = tuple((float(b), float(t)) for b, t in self.points)
        if not pts:
            raise ValueError("a batch curve needs at least one (batch, seconds) point")
        bs = [b for b, _ in pts]
        ts = [t for _, t in pts]
        if not all(math.isfinite(b) and b >= 1 for b in bs) or any(b2 <= b1 for b1, b2 in zip(bs, bs[1:])):
            raise ValueError(f"a batch curve's batch sizes must be >= 1 and increasing: {bs}")
        if not all(math.isfinite(t) and t > 0 for t in ts) or any(t2 < t1 for t1, t2 in zip(ts, ts[1:])):
            raise ValueError(f"a batch curve's times must be > 0 and not fall as the batch grows: {ts}")
        object.__setattr__(self, "points", pts)

    # -- construction ----------------------------------------------------------------
    @classmethod
    def affine(cls, per_request_s: float, per_batch_s: float) -> "BatchCurve":
        """``l(b) = per_request_s * b + per_batch_s`` (Sponge's model at given cores)."""
        if not (per_request_s >= 0 and per_batch_s >= 0 and per_request_s + per_batch_s > 0):
            raise ValueError(
                f"an affine batch curve needs times >= 0, not both 0 (got {per_request_s!r}, {per_batch_s!r})"
            )
        one = per_request_s + per_batch_s
        return cls(((1.0, one), (2.0, one + per_request_s)))

    @classmethod
    def from_points(cls, batch, seconds) -> "BatchCurve":
        """Breakpoints through the median time of each batch size, made non-decreasing
        (isotonic regression, each batch size weighted by its measurements)."""
        b, t = _check(batch, seconds)
        sizes, med, counts = _medians(b, t)
        iso = isotonic_regression(med, weights=counts.astype(float), increasing=True).x
        curve = cls(tuple(zip(sizes.tolist(), iso.tolist())))
        return curve.scored(b, t)

    def scored(self, batch, seconds) -> "BatchCurve":
        """This curve with its fit to measurements: R² and the largest relative error of
        the per-batch medians."""
        b, t = _check(batch, seconds)
        sizes, med, _ = _medians(b, t)
        fit = self.latency(sizes)
        total = float(np.sum((med - med.mean()) ** 2))
        r2 = 1.0 - float(np.sum((med - fit) ** 2)) / total if total > 0 else 1.0
        return BatchCurve(self.points, r2=r2, max_rel_err=float(np.max(np.abs(fit - med) / med)), measured=int(b.size))

    # -- what it says ----------------------------------------------------------------
    def latency(self, b):
        """Seconds to serve a batch of ``b`` (arrays broadcast; fractional batches
        interpolate)."""
        bs = np.array([p[0] for p in self.points])
        ts = np.array([p[1] for p in self.points])
        x = np.asarray(b, dtype=float)
        out = np.interp(x, bs, ts)
        if bs.size >= 2:  # beyond the last point: the last segment goes on
            slope = (ts[-1] - ts[-2]) / (bs[-1] - bs[-2])
            out = np.where(x > bs[-1], ts[-1] + slope * (x - bs[-1]), out)
        return out

    def throughput(self, b):
        """Requests per second of one replica serving batches of ``b``: ``b / l(b)``."""
        return np.asarray(b, dtype=float) / self.latency(b)

    def shape(self, bmax: int = MAX_BATCH) -> np.ndarray:
        """``f[b] = l(b) / l(1)`` for ``b = 0 .. bmax`` (``f[0] = 0``): what the planner and
        the simulator scale one request's measured time by (module docstring)."""
        f = np.zeros(int(bmax) + 1)
        f[1:] = self.latency(np.arange(1, int(bmax) + 1)) / float(self.latency(1.0))
        return f

    def to_dict(self) -> dict:
        return {
            "points": [[b, t] for b, t in self.points],
            "r2": _num(self.r2),
            "max_rel_err": _num(self.max_rel_err),
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "BatchCurve":
        try:
            return cls(
                tuple((float(b), float(t)) for b, t in d["points"]),
                float(d.get("r2") if d.get("r2") is not None else math.nan),
                float(d.get("max_rel_err") if d.get("max_rel_err") is not None else math.nan),
                int(d.get("measured", 0)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a batch curve ({err}): {d!r}") from None


def linear_shape(bmax: int = MAX_BATCH) -> np.ndarray:
    """``f(b) = b``: a batch saves nothing (a model whose batches have not been measured
    yet is planned so: the most replicas, never fewer than it needs)."""
    return np.arange(int(bmax) + 1, dtype=float)


def fit_hinge(batch, seconds) -> BatchCurve:
    """The flat-then-linear curve ``base + slope * max(b - knee, 0)`` closest to the
    measurements in relative terms (each point weighted by 1 / its time squared, so a
    GPU's 3 ms and 18 ms batches count alike): for every knee on a quarter-batch grid the
    best non-negative ``base`` and ``slope`` (``scipy.optimize.nnls``), the best knee kept.
    A knee at or below 1 is an affine curve (a CPU's). Scored against the per-batch
    medians (:meth:`BatchCurve.scored`)."""
    b, t = _check(batch, seconds)
    if np.unique(b).size < 2:
        raise ValueError(f"fitting a batch curve needs at least 2 batch sizes (got {sorted(set(b.tolist()))})")
    w = 1.0 / t
    best = None
    for knee in np.arange(0.0, float(b.max()) + 0.25, 0.25):
        x = np.column_stack([np.ones_like(b), np.maximum(b - knee, 0.0)])
        coef, resid = nnls(x * w[:, None], t * w)
        if best is None or resid < best[0] - 1e-15:
            best = (resid, knee, coef)
    _, knee, (base, slope) = best
    if base <= 0:  # all of it per request: a line through the origin
        base = 1e-9
    top = max(float(b.max()), knee + 1.0, 2.0)
    pts = [(1.0, base + slope * max(1.0 - knee, 0.0))]
    if knee > 1.0:
        pts.append((knee, base))
    pts.append((top, base + slope * (top - knee)))
    return BatchCurve(tuple(pts)).scored(b, t)


def _check(batch, seconds) -> tuple[np.ndarray, np.ndarray]:
    b = np.asarray(batch, dtype=float).ravel()
    t = np.asarray(seconds, dtype=float).ravel()
    if b.size != t.size or b.size == 0:
        raise ValueError(f"batch sizes and times must be non-empty and of one length (got {b.size}, {t.size})")
    if not (np.all(np.isfinite(b)) and np.all(b >= 1)):
        raise ValueError("batch sizes must be >= 1")
    if not (np.all(np.isfinite(t)) and np.all(t > 0)):
        raise ValueError("batch times must be finite and > 0")
    return b, t


def _medians(b: np.ndarray, t: np.ndarray):
    sizes = np.unique(b)
    med = np.array([np.median(t[b == s]) for s in sizes])
    counts = np.array([np.count_nonzero(b == s) for s in sizes])
    return sizes, med, counts


def _num(x: float):
    return None if not math.isfinite(x) else round(x, 6)
