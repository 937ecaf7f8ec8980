"""Recurring peaks (issue 32, item 5: a better forecaster than the paper's).

Many serverless functions fire on a cycle of their own: a timer every 30 minutes, a batch
job every hour. N-HiTS sees the last 15 minutes, so the next peak of such a cycle is a
surprise every time, and a peak that lasts a minute or two is over before a reactive
replica (60 s cold start) can help. The series' own history says when the next one is due.

Per model, :func:`detect_period` finds the cycle as the strongest local peak of the
autocorrelation of the recent per-minute counts, each widened to the largest within
``jitter`` minutes so that a cycle drifting by a minute or two still lines up (lags
``min_lag``..``max_lag``), that rises
at least ``dip`` above the autocorrelation at shorter lags (a smooth series decays without
such a peak and gets none). :func:`recurring_path` then reads, for every step of the
horizon, the largest count within ``jitter`` minutes of the same point one cycle back (a
cycle that drifts by a minute or two still lands in the window). A ``share`` of the
forecast's samples are raised to that path where it is higher: the forecast keeps its
centre and gains the recurring peak as an upside the planner weighs like any other sample
(so the peak is provisioned for where capacity allows, and traded off where it does not).
Ray-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .base import Forecast, check_fraction

LABEL = " + recurrence"
DEFAULT_SHARE = 0.25


def check_share(share: float) -> None:
    """A ValueError naming a share outside 0..1."""
    check_fraction(share, "recurrence: share")


@dataclass(frozen=True)
class Recurrence:
    """How recurring peaks are found and added (module doc); ``share`` 0: off."""

    share: float = DEFAULT_SHARE
    min_lag: int = 5
    max_lag: int = 180
    window: int = 720
    min_acf: float = 0.2
    dip: float = 0.1
    jitter: int = 3

    def __post_init__(self) -> None:
        check_share(self.share)
        if not 2 <= self.min_lag <= self.max_lag:
            raise ValueError(f"recurrence: need 2 <= min_lag <= max_lag (got {self.min_lag}, {self.max_lag})")
        if self.jitter < 0:
            raise ValueError(f"recurrence: jitter must be >= 0 (got {self.jitter})")


def autocorrelation(x: np.ndarray, max_lag: int) -> np.ndarray:
    """Sample autocorrelation at lags 0..max_lag (FFT; a constant series: zeros)."""
    x = np.asarray(x, float) - np.mean(x)
    denom = float(x @ x)
    if denom <= 0.0:
        return np.zeros(max_lag + 1)
    n = 1 << int(np.ceil(np.log2(2 * x.size)))
    f = np.fft.rfft(x, n)
    return np.fft.irfft(f * np.conj(f), n)[: max_lag + 1] / denom


def detect_period(history: np.ndarray, rc: Recurrence) -> int | None:
    """The cycle of ``history`` in minutes (module doc), or None. The series widened by the
    jitter is tried first (a drifting cycle), then as it is (a cycle too short to widen)."""
    x = np.asarray(history, float)[-rc.window :]
    max_lag = min(rc.max_lag, x.size // 3)
    if max_lag <= rc.min_lag:
        return None
    if rc.jitter > 0:  # each minute widened to its neighbourhood: a drifting cycle aligns
        wide = np.lib.stride_tricks.sliding_window_view(np.pad(x, rc.jitter, mode="edge"), 2 * rc.jitter + 1).max(
            axis=1
        )
        found = _strongest_peak(autocorrelation(wide, max_lag + 1), max_lag, rc)
        if found is not None:
            return found
    return _strongest_peak(autocorrelation(x, max_lag + 1), max_lag, rc)


def _strongest_peak(acf: np.ndarray, max_lag: int, rc: Recurrence) -> int | None:
    """The lag in ``min_lag..max_lag`` of the highest local peak of ``acf`` that reaches
    ``min_acf`` and rises ``dip`` above every shorter lag's; of equal peaks the longest lag.
    (Array-wise: it runs for every model at every plan, 180 lags each.)"""
    lags = np.arange(rc.min_lag, max_lag + 1)
    a = acf[lags]
    below = np.minimum.accumulate(acf[1 : max_lag + 1])  # below[j]: min(acf[1 : j + 2])
    ok = (a >= rc.min_acf) & (a >= acf[lags - 1]) & (a >= acf[lags + 1]) & (a - below[lags - 2] >= rc.dip)
    if not ok.any():
        return None
    peaks = a[ok]
    return int(lags[ok][np.flatnonzero(peaks == peaks.max())[-1]])


def recurring_path(history: np.ndarray, period: int, horizon: int, jitter: int) -> np.ndarray:
    """Per step of the horizon, the largest count within ``jitter`` minutes of the same point
    whole cycles back (the fewest whole cycles that reach only the past)."""
    h = np.asarray(history, float)
    t = h.size
    out = np.zeros(horizon)
    for s in range(horizon):
        k = -(-(s + jitter + 1) // period)  # ceil: t + s - k*period + jitter < t
        mid = t + s - k * period
        lo, hi = max(0, mid - jitter), min(t, mid + jitter + 1)
        out[s] = h[lo:hi].max() if hi > lo else 0.0
    return out


def add_recurrence(fc: Forecast, history: Mapping[str, np.ndarray], rc: Recurrence) -> Forecast:
    """``fc`` with a ``share`` of each cyclic model's samples raised to its recurring path
    (module doc); such a model's predictor label gains `` + recurrence``."""
    if rc.share <= 0.0:
        return fc
    samples = np.array(fc.samples, dtype=float)
    predictor = dict(fc.predictor)
    n_samples, horizon = samples.shape[1], samples.shape[2]
    k = int(round(rc.share * n_samples))
    if k == 0:
        return fc
    for i, name in enumerate(fc.names):
        h = history.get(name)
        if h is None:
            continue
        period = detect_period(h, rc)
        if period is None:
            continue
        path = recurring_path(h, period, horizon, rc.jitter) / 60.0  # requests/s
        samples[i][-k:] = np.maximum(samples[i][-k:], path[None, :])
        predictor[name] = predictor.get(name, "") + f"{LABEL} ({period} min)"
    return Forecast(fc.names, samples, predictor)
