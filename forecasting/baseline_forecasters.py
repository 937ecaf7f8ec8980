"""Simple point baselines with the :class:`forecasting.base.Forecaster` interface.

They are what Faro's probabilistic N-HiTS is compared against (paper section 3.5): the last
value, the moving mean and the moving maximum of the recent ``input_size`` minutes. Each
forecasts one constant rate over the horizon, so its "samples" are that value repeated and
its prediction interval is degenerate (zero width); coverage figures for them only say how
often the realised load happens to stay below the point.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .base import Forecast
from .history_check import check_history


class PointBaseline:
    """Forecasts ``statistic(last input_size counts) / 60`` requests/s for every step."""

    name = "baseline"

    def __init__(self, input_size: int = 15, horizon: int = 7):
        if input_size < 1 or horizon < 1:
            raise ValueError(f"input_size and horizon must be >= 1 (got {input_size}, {horizon})")
        self.input_size = int(input_size)
        self.horizon = int(horizon)

    def statistic(self, window: np.ndarray) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def predict(self, history: Mapping[str, np.ndarray], n_samples: int = 100, seed: int | None = None) -> Forecast:
        hist = check_history(history)
        names = list(hist)
        out = np.zeros((len(names), n_samples, self.horizon))
        predictor = {}
        for i, name in enumerate(names):
            window = hist[name][-self.input_size :]
            if window.size == 0:  # nothing observed yet: forecast no load
                predictor[name] = "fallback"
                continue
            out[i] = self.statistic(window) / 60.0
            predictor[name] = self.name
        return Forecast(names, out, predictor)


class LastValueForecaster(PointBaseline):
    """The naive forecast: the next minutes look like the last one."""

    name = "last"

    def statistic(self, window: np.ndarray) -> float:
        return float(window[-1])


class MovingMeanForecaster(PointBaseline):
    """Mean of the recent window (what a reactive autoscaler averaging load would use)."""

    name = "mean"

    def statistic(self, window: np.ndarray) -> float:
        return float(window.mean())


class MovingMaxForecaster(PointBaseline):
    """Maximum of the recent window: a conservative, over-provisioning point forecast."""

    name = "max"

    def statistic(self, window: np.ndarray) -> float:
        return float(window.max())


BASELINES = {c.name: c for c in (LastValueForecaster, MovingMeanForecaster, MovingMaxForecaster)}


def make_baseline(name: str, input_size: int = 15, horizon: int = 7) -> PointBaseline:
    """A baseline by name: ``last``, ``mean`` or ``max``."""
    try:
        return BASELINES[name](input_size, horizon)
    except KeyError:
        raise ValueError(f"unknown baseline {name!r} (choose from {', '.join(BASELINES)})") from None
