"""The forecasting interface the autoscaler and the simulator rely on (paper section 3.5).

A forecaster turns per-minute request counts (one history per model, oldest first) into
samples of the next window's arrival rates in requests/s: ``(models, samples, horizon)``.
Faro plans for that distribution, not for a single number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable

import numpy as np


@dataclass
class Forecast:
    """Samples of future arrival rates (requests/s) for several models."""

    names: list[str]
    samples: np.ndarray  # (models, samples, horizon), requests/s, never negative
    predictor: dict[str, str] = field(default_factory=dict)  # which predictor served each model

    def __post_init__(self) -> None:
        self.samples = np.maximum(np.asarray(self.samples, dtype=float), 0.0)
        if self.samples.ndim != 3 or self.samples.shape[0] != len(self.names):
            raise ValueError(
                f"forecast samples must be (models, samples, horizon) for "
                f"{len(self.names)} models, got shape {self.samples.shape}"
            )

    def by_model(self) -> dict[str, np.ndarray]:
        """``{name: (samples, horizon)}``, the form ``plan(...)`` takes."""
        return {n: self.samples[i] for i, n in enumerate(self.names)}

    def quantiles(self, qs: Sequence[float] = (0.1, 0.5, 0.9)) -> np.ndarray:
        """``(len(qs), models, horizon)`` quantiles over the samples."""
        return cast(np.ndarray, np.quantile(self.samples, qs, axis=1))


def check_fraction(value: float, what: str) -> None:
    """The one rule for a share or weight in 0..1 (the daily context's weight, the recurring
    peaks' share), whether a flag, the args or a forecaster sets it: a ValueError naming
    ``what`` and the value as given (15 digits: 1.0000001 is not shown as 1)."""
    v = float(value)
    if not 0.0 <= v <= 1.0:  # nan too
        raise ValueError(f"{what} must be within 0..1 (got {v:.15g})")


@runtime_checkable
class Forecaster(Protocol):
    """Anything that forecasts the next ``horizon`` minutes from per-minute counts."""

    input_size: int
    horizon: int

    def predict(self, history: Mapping[str, np.ndarray], n_samples: int = 100, seed: int | None = None) -> Forecast:
        """``history``: per model, per-minute request counts (oldest first)."""
        ...


class FallbackForecaster:
    """A simple forecaster with a spread, used when no trained model exists or a model has
    too little history: samples uniform between the recent mean and the recent maximum
    rate (the last ``input_size`` minutes), constant over the horizon. With no history at
    all it forecasts 0 requests/s. ``reason`` (why it serves) is added to the predictor's
    name: ``fallback: no trained forecaster``.
    """

    name = "fallback"

    def __init__(self, input_size: int = 15, horizon: int = 7, reason: str | None = None):
        self.input_size = input_size
        self.horizon = horizon
        self.reason = reason

    def predict(self, history: Mapping[str, np.ndarray], n_samples: int = 100, seed: int | None = None) -> Forecast:
        rng = np.random.default_rng(seed)
        names = list(history)
        out = np.zeros((len(names), n_samples, self.horizon))
        for i, name in enumerate(names):
            h = np.asarray(history[name], dtype=float)[-self.input_size :] / 60.0
            if h.size == 0:
                continue
            lo, hi = float(h.mean()), float(h.max())
            out[i] = rng.uniform(lo, hi, size=(n_samples, 1)) if hi > lo else lo
        label = f"{self.name}: {self.reason}" if self.reason else self.name
        return Forecast(names, out, {n: label for n in names})
