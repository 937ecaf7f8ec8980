"""What several policies share, in one place: processing times and one replica's rate,
"condition held since" timers, first-come-first-served grants, forecasts that fall back to
the fallback predictor when a trained model fails, and Faro's policy names."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from autoscaler.contract.policy import Decision, Observation, grant_in_order
from faro_serve.config import ModelSLO
from faro_serve.engine.latency import latency_mdc, min_replicas_for_slo
from forecasting.base import FallbackForecaster, Forecast, Forecaster

log = logging.getLogger(__name__)


def faro_policy_name(objective: str) -> str:
    """The Faro policy of a cluster objective: ``fair_sum`` -> ``faro-fairsum``."""
    return "faro-" + objective.replace("_", "")


def processing_s(model: ModelSLO, measured_ms: float | None) -> float:
    """Measured mean processing time, else the model's prior, else the engine default (s),
    for the policies that serve one request at a time (Faro's mechanisms ask
    ``service.service_of``, which also reads a batching replica's batches)."""
    return model.planning_ms(measured_ms) / 1e3


def saturation_rate(model: ModelSLO, measured_ms: float | None) -> float:
    """Requests/s one replica serves flat out: ``concurrency / processing time`` (a replica
    of concurrency k is k servers of the processing time, docs/concurrency.md)."""
    return model.concurrency / processing_s(model, measured_ms)


def max_rate_one_replica(p: float, slo: float, q: float, concurrency: int = 1) -> float:
    """Largest Poisson rate (requests/s) one replica serves with its ``q`` latency within
    ``slo`` under the engine's M/D/c estimator (c = ``concurrency`` servers, one replica);
    bisection on ``latency_mdc``."""
    if latency_mdc(concurrency, 0.0, p, q) > slo:
        return 0.0
    lo, hi = 0.0, concurrency / p
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if latency_mdc(concurrency, mid, p, q) <= slo:
            lo = mid
        else:
            hi = mid
    return lo


def replicas_for_slo(lam: float, p: float, slo: float, q: float, m: ModelSLO) -> int:
    """Fewest replicas meeting the SLO at ``lam`` (engine M/D/c), clamped to the model's bounds
    (Swayam's n_B, InferLine's single-model plan)."""
    if slo <= p or lam * p >= m.max_replicas * m.concurrency:
        return m.max_replicas
    try:
        n, _ = min_replicas_for_slo(max(lam, 0.0), p, slo, q, "mdc", limit=m.max_replicas, concurrency=m.concurrency)
    except ValueError:
        return m.max_replicas
    return m.clamp(n)


class Timers:
    """Per-model "condition true since" clocks (the paper's overload/underload triggers)."""

    state_fields = ("since",)

    def __init__(self) -> None:
        self.since: dict[str, float] = {}

    def update(self, name: str, condition: bool, now: float) -> None:
        if condition:
            self.since.setdefault(name, now)
        else:
            self.since.pop(name, None)

    def held(self, name: str, now: float, hold_s: float) -> bool:
        t0 = self.since.get(name)
        return t0 is not None and now - t0 >= hold_s - 1e-9

    def restart(self, name: str, now: float) -> None:
        if name in self.since:
            self.since[name] = now


def fcfs_decision(
    models: Sequence[ModelSLO],
    obs: Observation,
    wanted: dict[str, int],
    order: list[str],
    kind: str,
    info: dict[str, Any] | None = None,
    interleave: bool = False,
) -> Decision | None:
    """Grant ``wanted`` (decreases at once, increases in ``order`` while capacity lasts,
    ``interleave``d or not: ``grant_in_order``); None when nothing changes."""
    current = {n: o.target_replicas for n, o in obs.models.items()}
    granted = grant_in_order(wanted, current, models, obs.capacity, order=order, interleave=interleave)
    changed = {n: granted[n] for n in wanted if granted[n] != current[n]}
    if not changed:
        return None
    return Decision(changed, {}, kind, info or {})


def fallback_for(forecaster: Forecaster | None, horizon: int) -> tuple[Forecaster, FallbackForecaster]:
    """The forecaster to use (the fallback predictor when none is given) and the fallback
    predictor of the same input size and horizon that stands in when it fails."""
    if isinstance(forecaster, FallbackForecaster):  # chosen, or standing in for one that failed
        forecaster = FallbackForecaster(forecaster.input_size, horizon, forecaster.reason)
    fc = forecaster or FallbackForecaster(horizon=horizon, reason="no trained forecaster")
    return fc, FallbackForecaster(input_size=fc.input_size, horizon=fc.horizon)


def forecast_or_fallback(
    forecaster: Forecaster, fallback: Forecaster, obs: Observation, n_samples: int, seed: int
) -> Forecast:
    """Sampled forecasts of every model's arrivals; a broken model must not stop autoscaling."""
    history = {n: np.asarray(m.arrivals_per_min, float) for n, m in obs.models.items()}
    try:
        return forecaster.predict(history, n_samples=n_samples, seed=seed)
    except Exception as err:
        log.warning("forecaster failed (%s); using the fallback predictor", err)
        fc = fallback.predict(history, n_samples=n_samples, seed=seed)
        fc.predictor = {n: f"fallback: forecaster failed ({type(err).__name__})" for n in fc.names}
        return fc
