"""Faro's hybrid policy and the oracle behind the shared Policy interface (paper 4.4)."""

import numpy as np
import pytest

from autoscaler import ModelObservation, Observation, grant_in_order, make_policy, policy_names
from faro_serve.config import ClusterSpec, ModelSLO
from forecasting.base import FallbackForecaster

MODELS = [ModelSLO(name="hot", slo_ms=720, processing_ms=154), ModelSLO(name="cold", slo_ms=720, processing_ms=154)]


def observe(now, hot_per_min=600.0, cold_per_min=30.0, latency=None, targets=(1, 1)):
    return Observation(
        now=now,
        capacity_cpus=8,
        capacity_memory_gb=None,
        models={
            "hot": ModelObservation("hot", targets[0], targets[0], np.full(20, hot_per_min), latency_ms=latency),
            "cold": ModelObservation("cold", targets[1], targets[1], np.full(20, cold_per_min)),
        },
    )


def test_long_term_decision_moves_replicas_to_the_loaded_model():
    policy = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=8))
    d = policy.decide(observe(0.0, targets=(1, 4)))
    assert d.kind == "long_term"
    assert d.replicas["hot"] > 1 and d.replicas["cold"] < 4
    assert sum(d.replicas.values()) <= 8
    assert d.info["models"]["hot"]["predictor"] == "fallback: no trained forecaster"
    assert d.info["models"]["hot"]["forecast_mean_rps"] == pytest.approx(10.0)


def test_reactive_adds_one_replica_after_30s_of_violation_within_capacity():
    policy = make_policy("faro-sum", MODELS, ClusterSpec(cpus=8))
    policy.decide(observe(0.0))
    assert policy.decide(observe(10.0, latency=900, targets=(3, 1))) is None
    assert policy.decide(observe(20.0, latency=900, targets=(3, 1))) is None
    assert policy.decide(observe(30.0, latency=900, targets=(3, 1))) is None
    d = policy.decide(observe(40.0, latency=900, targets=(3, 1)))
    assert d.kind == "reactive" and d.replicas == {"hot": 4}
    # the timer restarts, and a full cluster gets no more
    assert policy.decide(observe(50.0, latency=900, targets=(7, 1))) is None
    assert policy.decide(observe(80.0, latency=900, targets=(7, 1))) is None
    # recovery clears the violation
    assert policy.decide(observe(90.0, latency=100, targets=(4, 1))) is None


def test_long_term_runs_every_interval():
    policy = make_policy("faro-sum", MODELS, ClusterSpec(cpus=8, long_term_interval_s=300))
    assert policy.decide(observe(0.0)).kind == "long_term"
    assert policy.decide(observe(290.0)) is None
    assert policy.decide(observe(300.0)).kind == "long_term"


def test_oracle_plans_with_the_true_future():
    policy = make_policy("oracle", MODELS, ClusterSpec(cpus=8))
    obs = observe(0.0, hot_per_min=60.0)  # history says 1 req/s ...
    obs.future_arrivals_per_min = {"hot": np.full(7, 1200.0), "cold": np.full(7, 30.0)}  # ... future 20
    d = policy.decide(obs)
    blind = make_policy("faro-sum", MODELS, ClusterSpec(cpus=8)).decide(observe(0.0, hot_per_min=60.0))
    need = __import__("faro_serve.engine", fromlist=["x"]).min_replicas_for_slo(20.0, 0.154, 0.72, 0.99)[0]
    assert d.replicas["hot"] >= need > blind.replicas["hot"]
    assert d.info["models"]["hot"]["predictor"] == "oracle"
    with pytest.raises(ValueError, match="future"):
        make_policy("oracle", MODELS, ClusterSpec(cpus=8)).decide(observe(0.0))


def test_every_objective_is_a_named_policy():
    names = policy_names()
    for n in ("faro-sum", "faro-fair", "faro-fairsum", "faro-penaltysum", "faro-penaltyfairsum", "oracle"):
        assert n in names
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope", MODELS, ClusterSpec(cpus=8))


def test_grant_in_order_is_first_come_first_served():
    models = [ModelSLO(name=n, slo_ms=500) for n in "abc"]
    cur = {"a": 1, "b": 1, "c": 4}
    out = grant_in_order(
        {"a": 5, "b": 5, "c": 2}, cur, models, capacity_cpus=8, capacity_memory_gb=None, order=["b", "a", "c"]
    )
    assert out == {"a": 1, "b": 5, "c": 2}  # c's decrease frees room first; b asked first
    spread = grant_in_order(
        {"a": 5, "b": 5, "c": 2},
        cur,
        models,
        capacity_cpus=8,
        capacity_memory_gb=None,
        order=["b", "a", "c"],
        interleave=True,
    )
    assert spread == {"a": 3, "b": 3, "c": 2}  # one each in turn: b, a, b, a (b first)
    odd = grant_in_order(
        {"a": 9, "b": 2, "c": 9},
        {"a": 1, "b": 1, "c": 1},
        models,
        capacity_cpus=9,
        capacity_memory_gb=None,
        order=["c", "a", "b"],
        interleave=True,
    )
    assert odd == {"a": 3, "b": 2, "c": 4}  # b stops at its wish; the rest goes round, c first


def test_fallback_forecaster_spread_between_mean_and_max():
    fc = FallbackForecaster(input_size=5, horizon=7).predict(
        {"a": np.array([60, 120, 60, 120, 600.0]), "z": np.array([])}, n_samples=50, seed=1
    )
    s = fc.by_model()["a"]
    assert s.shape == (50, 7) and s.min() >= 192 / 60 - 1e-9 and s.max() <= 10.0
    assert np.all(fc.by_model()["z"] == 0)
