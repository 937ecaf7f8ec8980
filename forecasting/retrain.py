"""Learning from the cluster's own traffic (issue 32 item 4): retrain N-HiTS on the recorded
per-minute arrivals and keep the new network only if it forecasts better what it never saw.

The most recent ``holdout`` minutes of every model are held back; a candidate is trained on
what came before and both it and the current forecaster forecast the held-back minutes the
way the planner uses them (every 5 minutes, from the history before; paper section 3.5).
Two figures judge them, both about the window maximum the planner provisions for (section
3.5.2: plan for the maximum expected rate of the window):

* the *planner loss*: the pinball loss at ``q`` = 0.9 of the forecast window-max quantile
  against the realised window maximum, per model divided by that model's mean realised
  maximum, so that a model of 5 requests a minute counts as much as one of 1,500; too little
  costs ``q``, too much ``1 - q`` (under-provisioning breaks the SLO; over-provisioning only
  takes a replica from someone else);
* the window-max *coverage*: how often the realised maximum stayed within the forecast's
  0.9 quantile (a calibrated forecaster: 0.9).

The candidate replaces the current one only if its planner loss is lower by ``min_gain``
(a share) and its coverage is not further from ``q`` by more than ``coverage_slack``. Pure
and Ray-free: :mod:`autoscaler.driving.retrainer` runs it off the control loop, ``faro-serve
forecast train --from`` by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import Forecaster
from .evaluate import rolling_evaluation
from .forecast_metrics import window_max_quantile

if TYPE_CHECKING:
    from .train import TrainConfig

Q = 0.9


@dataclass(frozen=True)
class Score:
    """How a forecaster did on the held-back minutes."""

    planner_loss: float
    coverage: float
    origins: int
    models: int

    def as_dict(self) -> dict[str, float]:
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Verdict:
    """The evidence of one retrain: ``swap`` says whether the candidate should serve."""

    swap: bool
    reason: str
    current: Score
    candidate: Score
    trained_minutes: int
    holdout_minutes: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "swap": self.swap,
            "reason": self.reason,
            "current": self.current.as_dict(),
            "candidate": self.candidate.as_dict(),
            "trained_minutes": self.trained_minutes,
            "holdout_minutes": self.holdout_minutes,
            "seconds": round(self.seconds, 1),
        }


def planner_loss(samples: np.ndarray, actual: np.ndarray, q: float = Q) -> float:
    """Mean over models of the pinball loss (at ``q``) of the forecast window-max quantile
    against the realised window maximum, each model's divided by its mean realised maximum.
    ``samples``: (origins, models, samples, horizon); ``actual``: (origins, models, horizon)."""
    s, a = np.asarray(samples, float), np.asarray(actual, float)
    if s.ndim != 4 or a.shape != s.shape[:2] + s.shape[3:]:
        raise ValueError(
            f"samples (origins, models, samples, horizon) and actual (origins, models, "
            f"horizon) do not match: {s.shape} and {a.shape}"
        )
    want = window_max_quantile(s, q)  # (origins, models)
    real = a.max(axis=-1)  # (origins, models)
    err = real - want
    pinball = np.where(err > 0, q * err, (q - 1.0) * err)
    scale = np.maximum(real.mean(axis=0), 1.0)  # a model of ~0 requests: per request
    return float(np.mean(pinball.mean(axis=0) / scale))


def held_back(
    history: Mapping[str, np.ndarray], holdout: int, input_size: int
) -> tuple[dict[str, np.ndarray], list[str], np.ndarray]:
    """Split: the minutes before the last ``holdout`` of every model (to train on), and the
    models with ``input_size`` minutes of context before their held-back minutes with those
    ``input_size + holdout`` minutes as a ``(models, minutes)`` array (to judge on)."""
    if holdout < 1:
        raise ValueError(f"holdout must be >= 1 minute (got {holdout})")
    train, names, rows = {}, [], []
    for n, h in history.items():
        h = np.asarray(h, float)
        if h.size > holdout:
            train[n] = h[:-holdout]
        if h.size >= holdout + input_size:
            names.append(n)
            rows.append(h[-(holdout + input_size) :])
    return train, names, (np.stack(rows) if rows else np.zeros((0, holdout + input_size)))


def score(
    forecaster: Forecaster, names: list[str], counts: np.ndarray, step: int = 5, n_samples: int = 100, seed: int = 0
) -> Score:
    """``forecaster`` on ``counts`` ((models, input_size + holdout) requests per minute),
    forecasting from every ``step``-th minute after the first ``input_size`` (its context)."""
    ev = rolling_evaluation(forecaster, names, counts, step=step, n_samples=n_samples, seed=seed)
    cover = float(np.mean(ev.actual.max(axis=-1) <= window_max_quantile(ev.samples, Q)))
    return Score(planner_loss(ev.samples, ev.actual), cover, len(ev.origins), len(names))


def judge(current: Score, candidate: Score, min_gain: float = 0.02, coverage_slack: float = 0.05) -> tuple[bool, str]:
    """Swap only for a planner loss lower by ``min_gain`` at a coverage not further from
    the target by more than ``coverage_slack``: the reason names the deciding figures."""
    gain = 1.0 - candidate.planner_loss / current.planner_loss if current.planner_loss > 0 else 0.0
    off_now, off_new = abs(current.coverage - Q), abs(candidate.coverage - Q)
    figures = (
        f"planner loss {candidate.planner_loss:.4f} against {current.planner_loss:.4f} "
        f"({gain:+.1%}), window-max coverage {candidate.coverage:.2f} against "
        f"{current.coverage:.2f} (target {Q})"
    )
    if gain < min_gain:
        return False, f"not better: {figures}; a swap needs {min_gain:.0%} lower loss"
    if off_new > off_now + coverage_slack:
        return False, f"less calibrated: {figures}"
    return True, f"better: {figures}"


def candidate_config(current: Forecaster, seed: int = 0, **overrides: Any) -> TrainConfig:
    """The :class:`forecasting.train.TrainConfig` of a candidate to replace ``current``: its
    input, horizon and ensemble size (a plug-in without ``n_members``: one network), 400
    steps, seed ``seed + 1``; ``overrides`` change any field (e.g. ``threads=1``)."""
    from .train import TrainConfig

    fields = dict(
        input_size=current.input_size,
        horizon=current.horizon,
        max_steps=400,
        seed=seed + 1,
        members=getattr(current, "n_members", 1),
    )
    return TrainConfig(**{**fields, **overrides})


def retrain(
    history: Mapping[str, np.ndarray],
    current: Forecaster,
    holdout: int = 120,
    config: TrainConfig | None = None,
    train: Callable[[dict[str, np.ndarray], TrainConfig], Forecaster] | None = None,
    min_gain: float = 0.02,
    seed: int = 0,
) -> tuple[Forecaster | None, Verdict]:
    """Train a candidate on ``history`` (per model, per-minute counts, oldest first) without
    its last ``holdout`` minutes and judge it against ``current`` on them. Returns the
    candidate (None when it did not train) and the verdict. ``config``: a
    :class:`forecasting.train.TrainConfig` (default: :func:`candidate_config`); ``train``:
    the training function (default :func:`forecasting.train.train_forecaster`)."""
    t0 = time.perf_counter()
    config = config or candidate_config(current, seed)
    if train is None:
        from .train import train_forecaster

        train = train_forecaster
    if (config.input_size, config.horizon) != (current.input_size, current.horizon):
        raise ValueError(
            f"the candidate's input and horizon ({config.input_size}, {config.horizon}) "
            f"must match the current forecaster's ({current.input_size}, {current.horizon})"
        )
    train_part, names, counts = held_back(history, holdout, config.input_size)
    if not names:
        raise ValueError(
            f"no model has {holdout + config.input_size} minutes of history "
            f"({holdout} held back + {config.input_size} of context); nothing to judge on"
        )
    need = config.input_size + config.horizon
    train_part = {n: h for n, h in train_part.items() if h.size >= need}
    if not train_part:
        raise ValueError(f"no model has {need} minutes before its {holdout} held-back minutes to train on")
    candidate = train(train_part, config)
    for attr in ("short_history", "daily_period", "daily_weight", "recurrence_share"):  # as it would serve
        if hasattr(current, attr) and hasattr(candidate, attr):
            setattr(candidate, attr, getattr(current, attr))
    now = score(current, names, counts, seed=seed)
    new = score(candidate, names, counts, seed=seed)
    swap, reason = judge(now, new, min_gain)
    return candidate, Verdict(
        swap, reason, now, new, int(sum(h.size for h in train_part.values())), holdout, time.perf_counter() - t0
    )
