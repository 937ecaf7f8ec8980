"""Rolling-origin evaluation of a forecaster, the way the autoscaler uses it.

Every ``step`` minutes (5 by default, Faro's planning period) the forecaster gets the
history before the origin for all jobs at once and forecasts the next ``horizon`` minutes;
the samples are compared with what happened (:mod:`forecasting.forecast_metrics`). The first origin
is at ``input_size``, so the evaluated days need no context before them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import forecast_metrics as metrics
from .base import Forecaster


@dataclass
class Evaluation:
    """Samples and truth of every origin, in requests per MINUTE, plus call timings."""

    names: list[str]
    origins: list[int]
    samples: np.ndarray  # (origins, jobs, samples, horizon)
    actual: np.ndarray  # (origins, jobs, horizon)
    predict_seconds: list[float] = field(default_factory=list)
    predictors: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The ``forecast eval`` figures: errors (requests/min), coverages, median predict ms."""
        out: dict[str, Any] = dict(metrics.summarise(self.samples, self.actual))
        out["predict_ms"] = float(np.median(self.predict_seconds) * 1e3) if self.predict_seconds else None
        out.update(unit="requests per minute", origins=len(self.origins), jobs=len(self.names))
        return out

    def per_job(self) -> dict[str, dict[str, float]]:
        return {n: metrics.summarise(self.samples[:, j], self.actual[:, j]) for j, n in enumerate(self.names)}


def forecast_origins(minutes: int, input_size: int, horizon: int, step: int = 5) -> list[int]:
    """Origins ``t`` (forecasting minutes ``t .. t+horizon-1`` from minutes ``< t``)."""
    if step < 1:
        raise ValueError(f"origin step must be >= 1 (got {step})")
    if minutes < input_size + horizon:
        raise ValueError(
            f"too little history to evaluate: {minutes} minutes per job, need at least "
            f"input_size + horizon = {input_size} + {horizon} = {input_size + horizon}"
        )
    return list(range(input_size, minutes - horizon + 1, step))


def rolling_evaluation(
    forecaster: Forecaster, names: list[str], counts: np.ndarray, step: int = 5, n_samples: int = 100, seed: int = 0
) -> Evaluation:
    """Forecast from every origin; ``counts`` is ``(jobs, minutes)`` requests per minute."""
    counts = np.asarray(counts, dtype=float)
    if counts.ndim != 2 or counts.shape[0] != len(names):
        raise ValueError(f"counts must be (jobs, minutes) for {len(names)} jobs, got {counts.shape}")
    h = forecaster.horizon
    origins = forecast_origins(counts.shape[1], forecaster.input_size, h, step)
    forecaster.predict({n: counts[j, : origins[0]] for j, n in enumerate(names)}, n_samples, seed)  # warm-up
    samples = np.empty((len(origins), len(names), n_samples, h))
    actual = np.empty((len(origins), len(names), h))
    times: list[float] = []
    predictors: dict[str, str] = {}
    for k, t in enumerate(origins):
        history = {n: counts[j, :t] for j, n in enumerate(names)}
        t0 = time.perf_counter()
        fc = forecaster.predict(history, n_samples=n_samples, seed=seed + k)
        times.append(time.perf_counter() - t0)
        samples[k] = fc.samples * 60.0
        actual[k] = counts[:, t : t + h]
        for n, p in fc.predictor.items():
            predictors.setdefault(n, p)
    return Evaluation(list(names), origins, samples, actual, times, predictors)
