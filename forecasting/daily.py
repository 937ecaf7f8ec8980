"""Daily context for a forecast (issue 32, item 5: a better forecaster than the paper's).

The paper's N-HiTS sees the last 15 minutes only (section 3.5). Production inference load
repeats daily, and the same minutes yesterday, scaled to today's level, say what the next
minutes hold that the last 15 cannot (a rise that starts every day at 9:00). With a day of
history, each step's forecast mean moves towards yesterday's same minute scaled by the
ratio of the last ``level_minutes`` today to the same minutes yesterday:

    mean' = (1 - weight) * mean + weight * yesterday[t + h] * level_today / level_yesterday

and the step's samples are scaled by ``mean' / mean``: the spread keeps its shape relative
to the mean and stays non-negative, and the weight bounds how far a glitch yesterday can
move today's forecast. A model with less than a day and ``level_minutes`` of history keeps
its forecast. :class:`~forecasting.nhits.NHitsForecaster` applies it (``daily_period``,
``daily_weight``, set by ``autoscaler.driving.forecasters.set_daily``); :class:`DailyContext` gives
it to any other forecaster. The weight, 0.25,
was chosen on training days only (``bench/daily_context.py``; docs/forecasting.md, "Daily
context"). Ray-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import numpy as np

from .base import Forecast, Forecaster, check_fraction

DAY_MINUTES = 1440  # live: a day of wall-clock minutes; a replayed trace has its own day length
DEFAULT_WEIGHT = 0.25
LABEL = " + daily"


def check_daily(period: int, weight: float) -> None:
    """A ValueError naming what is wrong with a daily context's period or weight."""
    if int(period) < 2:
        raise ValueError(f"daily context: period must be at least 2 minutes (got {period})")
    check_fraction(weight, "daily context: weight")


def yesterday_means(history: np.ndarray, period: int, level_minutes: int, horizon: int) -> np.ndarray | None:
    """Per-minute counts for the next ``horizon`` minutes from the same minutes a ``period``
    earlier, scaled to today's level; None with less than ``period + level_minutes`` minutes."""
    h = np.asarray(history, float)
    t, p, k = h.size, int(period), int(level_minutes)
    if t < p + k:
        return None
    same = h[t - p : t - p + horizon]
    if same.size < horizon:  # a period shorter than the horizon: repeat what there is
        same = np.resize(same, horizon)
    return cast(np.ndarray, same * (h[t - k :].mean() / max(h[t - p - k : t - p].mean(), 1.0)))


def add_daily(
    fc: Forecast, history: Mapping[str, np.ndarray], period: int, weight: float, level_minutes: int
) -> Forecast:
    """``fc`` with every model that has a day of ``history`` moved towards yesterday (module
    doc); its predictor label gains `` + daily``. ``weight`` 0 returns ``fc`` unchanged."""
    if weight <= 0.0:
        return fc
    samples = np.array(fc.samples, dtype=float)
    predictor = dict(fc.predictor)
    horizon = samples.shape[2]
    for i, name in enumerate(fc.names):
        ydays = yesterday_means(history[name], period, level_minutes, horizon)
        if ydays is None:
            continue
        mean = samples[i].mean(axis=0)  # requests/s per step
        target = (1.0 - weight) * mean + weight * ydays / 60.0
        some = mean > 1e-9
        samples[i][:, some] *= (target[some] / mean[some])[None, :]
        samples[i][:, ~some] = target[~some][None, :]  # a forecast of nothing: yesterday's share
        predictor[name] = predictor.get(name, "") + LABEL
    return Forecast(fc.names, samples, predictor)


class DailyContext:
    """``base``'s forecasts with daily context (module doc), for a forecaster that has none.

    ``period``: minutes in a day of the series (1440 live; a replayed trace's points per day
    in the simulator, e.g. 360 for the Faro workload). ``weight`` 0 is ``base`` itself."""

    def __init__(
        self,
        base: Forecaster,
        period: int = DAY_MINUTES,
        weight: float = DEFAULT_WEIGHT,
        level_minutes: int | None = None,
    ):
        check_daily(period, weight)
        self.base = base
        self.period = int(period)
        self.weight = float(weight)
        self.level_minutes = int(level_minutes or base.input_size)
        self.input_size = base.input_size
        self.horizon = base.horizon
        self.name = getattr(base, "name", type(base).__name__) + LABEL

    def yesterday_means(self, history: np.ndarray) -> np.ndarray | None:
        return yesterday_means(history, self.period, self.level_minutes, self.horizon)

    def predict(self, history: Mapping[str, np.ndarray], n_samples: int = 100, seed: int | None = None) -> Forecast:
        fc = self.base.predict(history, n_samples=n_samples, seed=seed)
        return add_daily(fc, history, self.period, self.weight, self.level_minutes)
