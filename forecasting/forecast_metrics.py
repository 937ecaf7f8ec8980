"""Forecast quality metrics: pure numpy functions over samples and realised values.

Faro plans for the distribution of the next window (paper section 3.5.2), and what matters
for SLOs is whether the *window maximum* is covered, so besides point errors we measure
interval coverage per point and coverage of the realised window maximum.

Shapes: ``samples`` is ``(..., n_samples, horizon)`` and ``actual`` is ``(..., horizon)``
with the same leading dimensions (e.g. ``(origins, models)``). Units are the caller's.
"""

from __future__ import annotations

from typing import cast

import numpy as np


def _check(samples: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(samples, dtype=float)
    a = np.asarray(actual, dtype=float)
    if s.ndim < 2 or s.shape[:-2] + s.shape[-1:] != a.shape:
        raise ValueError(
            f"samples {s.shape} must be (..., n_samples, horizon) matching actual (..., horizon) {a.shape}"
        )
    return s, a


def rmse(point: np.ndarray, actual: np.ndarray) -> float:
    """Root mean squared error of a point forecast (same shape as ``actual``)."""
    d = np.asarray(point, dtype=float) - np.asarray(actual, dtype=float)
    return float(np.sqrt(np.mean(d * d)))


def mae(point: np.ndarray, actual: np.ndarray) -> float:
    """Mean absolute error of a point forecast (same shape as ``actual``)."""
    return float(np.mean(np.abs(np.asarray(point, dtype=float) - np.asarray(actual, dtype=float))))


def central_interval(samples: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds ``(..., horizon)`` of the central ``level`` interval (0-1)."""
    if not 0 < level < 1:
        raise ValueError(f"interval level must be in (0, 1), got {level}")
    s = np.asarray(samples, dtype=float)
    lo, hi = np.quantile(s, [(1 - level) / 2, (1 + level) / 2], axis=-2)
    return lo, hi


def interval_coverage(samples: np.ndarray, actual: np.ndarray, level: float) -> float:
    """Share of realised points inside the central ``level`` interval of the samples.

    A well calibrated forecaster scores close to ``level``; a point forecast (all samples
    equal) scores about 0 because its interval is degenerate.
    """
    s, a = _check(samples, actual)
    lo, hi = central_interval(s, level)
    return float(np.mean((a >= lo) & (a <= hi)))


def window_max_quantile(samples: np.ndarray, q: float = 0.9) -> np.ndarray:
    """``q``-quantile over samples of each sample's maximum over the horizon: ``(...)``.

    This is the load an autoscaler must provision for to survive the whole window with
    probability ``q`` (section 3.5.2: plan for the *maximum expected* arrival rate).
    """
    s = np.asarray(samples, dtype=float)
    return cast(np.ndarray, np.quantile(s.max(axis=-1), q, axis=-1))


def max_window_coverage(samples: np.ndarray, actual: np.ndarray, q: float = 0.9) -> float:
    """Share of windows whose realised maximum is at most :func:`window_max_quantile`."""
    s, a = _check(samples, actual)
    return float(np.mean(a.max(axis=-1) <= window_max_quantile(s, q)))


def summarise(samples: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """All metrics of ``forecast eval``: errors of the sample mean and the coverages."""
    s, a = _check(samples, actual)
    mean = s.mean(axis=-2)
    return {
        "rmse": rmse(mean, a),
        "mae": mae(mean, a),
        "coverage_80": interval_coverage(s, a, 0.8),
        "coverage_90": interval_coverage(s, a, 0.9),
        "max_window_coverage_90": max_window_coverage(s, a, 0.9),
    }
