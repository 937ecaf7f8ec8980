"""Daily context for any forecaster (issue 32, item 5: a better forecaster than the paper's).

The paper's N-HiTS sees the last 15 minutes only (section 3.5). Production inference load
repeats daily, and the same minutes yesterday, scaled to today's level, say what the next
minutes hold that the last 15 cannot (a rise that starts every day at 9:00). With a day of
history, :class:`DailyContext` moves the base forecaster's mean for each step towards
yesterday's same minutes scaled by the ratio of the last ``level_minutes`` today to the
same minutes yesterday:

    mean' = (1 - weight) * mean + weight * yesterday[t + h] * level_today / level_yesterday

and scales the samples of that step by ``mean' / mean`` (the spread keeps its shape
relative to the mean, and stays non-negative; the weight bounds how far a glitch yesterday
can move today's forecast). A model with less than a day and
``level_minutes`` of history gets the base forecast unchanged. The weight was fitted on
training days only (docs/forecasting.md, "Daily context"). Ray-free.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .base import Forecast

DAY_MINUTES = 1440
DEFAULT_WEIGHT = 0.25


class DailyContext:
    """``base``'s forecasts moved towards yesterday's same minutes (see the module doc).

    ``period``: minutes in a day of the series (1440 live; a replayed trace's points per day
    in the simulator, e.g. 360 for the Faro workload). ``weight`` 0 is ``base`` itself."""

    def __init__(self, base, period: int = DAY_MINUTES, weight: float = DEFAULT_WEIGHT,
                 level_minutes: int | None = None):
        if int(period) < 2:
            raise ValueError(f"daily context: period must be at least 2 minutes (got {period})")
        if not 0.0 <= float(weight) <= 1.0:
            raise ValueError(f"daily context: weight must be within 0..1 (got {weight})")
        self.base = base
        self.period = int(period)
        self.weight = float(weight)
        self.level_minutes = int(level_minutes or base.input_size)
        self.input_size = base.input_size
        self.horizon = base.horizon
        self.name = f"{getattr(base, 'name', type(base).__name__)} + daily"

    def __getattr__(self, attr):  # short_history, path, ...: the base forecaster's
        if attr == "base":
            raise AttributeError(attr)
        return getattr(self.base, attr)

    def needs(self) -> int:
        """Minutes of history a model needs for the daily context."""
        return self.period + self.level_minutes

    def yesterday_means(self, history: np.ndarray) -> np.ndarray | None:
        """Per-minute counts for the next ``horizon`` minutes from yesterday, scaled to
        today's level; None with too little history."""
        h = np.asarray(history, float)
        if h.size < self.needs() or self.weight == 0.0:
            return None
        t, p, k = h.size, self.period, self.level_minutes
        same = h[t - p:t - p + self.horizon]
        if same.size < self.horizon:  # period shorter than the horizon: yesterday's tail is today
            same = np.concatenate([same, h[t - p + same.size:][:self.horizon - same.size]])
        level_now = h[t - k:].mean()
        level_then = h[t - p - k:t - p].mean()
        return same * (level_now / max(level_then, 1.0))

    def predict(self, history: Mapping[str, np.ndarray], n_samples: int = 100,
                seed: int | None = None) -> Forecast:
        fc = self.base.predict(history, n_samples=n_samples, seed=seed)
        samples = np.array(fc.samples, dtype=float)
        for i, name in enumerate(fc.names):
            ydays = self.yesterday_means(history[name])
            if ydays is None:
                continue
            mean = samples[i].mean(axis=0)  # requests/s per step
            target = (1.0 - self.weight) * mean + self.weight * ydays / 60.0
            some = mean > 1e-9
            samples[i][:, some] *= (target[some] / mean[some])[None, :]
            samples[i][:, ~some] = target[~some][None, :]  # a base forecast of nothing: yesterday's share
            label = fc.predictor.get(name, self.name)
            fc.predictor[name] = f"{label} + daily"
        return Forecast(fc.names, samples, fc.predictor)
