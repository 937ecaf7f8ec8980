"""The overload guard (autoscaler/faro/guard.py): under heavy overload a long-term plan may not cut
a model below what its observed rate needs; the plan's increases give the replicas back."""

import numpy as np

from autoscaler import ModelObservation, Observation, make_policy
from autoscaler.contract.policy import Decision
from autoscaler.driving.explain import explain
from autoscaler.faro.guard import guard_cuts, observed_need
from faro_serve.config import ClusterSpec, ModelSLO

MODELS = {n: ModelSLO(name=n, slo_ms=720, processing_ms=154) for n in "abc"}


def _obs(rates: dict, targets: dict, cpus: float) -> Observation:
    return Observation(
        0.0,
        cpus,
        None,
        {
            n: ModelObservation(n, targets[n], targets[n], np.full(20, rates[n] * 60.0), arrival_rate=rates[n])
            for n in rates
        },
    )


def test_under_heavy_overload_a_cut_below_the_observed_need_is_taken_back_from_an_increase():
    cluster = ClusterSpec(cpus=6)
    rates = {"a": 18.0, "b": 18.0, "c": 18.0}  # ~19/s at 154 ms: 4 replicas each for 720 ms p99
    obs = _obs(rates, {"a": 3, "b": 1, "c": 2}, 6)
    need = observed_need(obs, MODELS, cluster)
    assert need == {"a": 4, "b": 4, "c": 4}  # 12 replicas against 6: heavy overload
    plan = Decision({"a": 1, "b": 3, "c": 2}, info={})  # the plan cuts a (meeting more now) for b
    got = guard_cuts(plan, obs, MODELS, cluster)
    assert got.replicas["a"] == 3  # kept at what it has (its need, 4, is more than it has)
    assert got.replicas["b"] == 1 and got.replicas["c"] == 2  # b's increase gave them back
    assert sum(got.replicas.values()) <= 6
    assert got.info["overload_guard"]["kept"] == ["a"]


def test_without_heavy_overload_or_switched_off_the_plan_is_left_alone():
    rates = {"a": 18.0, "b": 2.0, "c": 2.0}  # needs 4 + 1 + 1 = 6 < 1.25 x 6
    obs = _obs(rates, {"a": 3, "b": 1, "c": 2}, 6)
    plan = Decision({"a": 1, "b": 3, "c": 2}, info={})
    assert guard_cuts(plan, obs, MODELS, ClusterSpec(cpus=6)).replicas == {"a": 1, "b": 3, "c": 2}
    heavy = _obs({"a": 18.0, "b": 18.0, "c": 18.0}, {"a": 3, "b": 1, "c": 2}, 6)
    off = ClusterSpec(cpus=6, overload_guard=None)
    assert guard_cuts(Decision({"a": 1, "b": 3, "c": 2}, info={}), heavy, MODELS, off).replicas == {
        "a": 1,
        "b": 3,
        "c": 2,
    }


def test_a_cut_the_observed_rate_allows_stands():
    cluster = ClusterSpec(cpus=6)
    obs = _obs({"a": 2.0, "b": 30.0, "c": 30.0}, {"a": 3, "b": 2, "c": 1}, 6)  # a needs 1
    got = guard_cuts(Decision({"a": 1, "b": 3, "c": 2}, info={}), obs, MODELS, cluster)
    assert got.replicas == {"a": 1, "b": 3, "c": 2} and "overload_guard" not in got.info


def test_faro_keeps_a_served_model_under_heavy_overload_and_stays_within_capacity():
    """Through Faro-FairSum's own plan: models a and b are served at 3 replicas each now;
    c and d, far over what any share serves, would take replicas from them."""
    models = [ModelSLO(name=n, slo_ms=720, processing_ms=154) for n in "abcd"]
    rates = {"a": 12.0, "b": 12.0, "c": 60.0, "d": 60.0}
    obs = Observation(
        0.0,
        8,
        None,
        {
            n: ModelObservation(n, t, t, np.full(20, rates[n] * 60.0), arrival_rate=rates[n])
            for n, t in {"a": 3, "b": 3, "c": 1, "d": 1}.items()
        },
    )
    on = make_policy("faro-fairsum", models, ClusterSpec(cpus=8)).decide(obs)
    off = make_policy("faro-fairsum", models, ClusterSpec(cpus=8, overload_guard=None)).decide(obs)
    assert sum(on.replicas.values()) <= 8 and sum(off.replicas.values()) <= 8
    # FairSum alone levels down: a and b (served now) to 1 each, for c and d, which no share serves
    assert off.replicas["a"] == off.replicas["b"] == 1 and "overload_guard" not in off.info
    assert on.replicas["a"] == on.replicas["b"] == 3  # the guard keeps them served
    assert on.info["overload_guard"]["kept"] == ["a", "b"]
    lines = explain([{"t": 0.0, "decision": {"kind": on.kind, "replicas": dict(on.replicas), "info": on.info}}])
    assert any(
        line.startswith("  overload guard: the observed rates need 26") and "kept a, b" in line for line in lines
    )


def test_the_sum_objective_is_left_alone():
    """Sum keeps what it can serve already (with the guard it lost more on day 10 at 16)."""
    heavy = _obs({"a": 18.0, "b": 18.0, "c": 18.0}, {"a": 3, "b": 1, "c": 2}, 6)
    for objective in ("sum", "penalty_sum"):
        got = guard_cuts(
            Decision({"a": 1, "b": 3, "c": 2}, info={}), heavy, MODELS, ClusterSpec(cpus=6, objective=objective)
        )
        assert got.replicas == {"a": 1, "b": 3, "c": 2}


def test_the_replicas_given_back_fit_every_resource_not_only_cpus():
    """b's replicas take 4 GiB each, the cluster 12 GiB: a keeps 3 replicas (1 GiB each), and
    b gives back until the memory fits too, though the CPUs would fit sooner."""
    models = {
        "a": ModelSLO(name="a", slo_ms=720, processing_ms=154, memory_gb=1.0),
        "b": ModelSLO(name="b", slo_ms=720, processing_ms=154, memory_gb=4.0),
        "c": ModelSLO(name="c", slo_ms=720, processing_ms=154, memory_gb=1.0),
    }
    cluster = ClusterSpec(cpus=8, memory_gb=12)
    obs = Observation(
        0.0,
        8,
        12,
        {
            n: ModelObservation(n, t, t, np.full(20, 18.0 * 60), arrival_rate=18.0)
            for n, t in {"a": 3, "b": 1, "c": 3}.items()
        },
    )
    got = guard_cuts(Decision({"a": 1, "b": 3, "c": 3}, info={}), obs, models, cluster)
    assert got.replicas["a"] == 3
    mem = sum(got.replicas[n] * models[n].memory_gb for n in models)
    assert mem <= 12 and sum(got.replicas.values()) <= 8
    assert got.replicas["b"] == 1  # 3 + 4 x 2 + 3 = 14 GiB would not fit; 3 + 4 + 3 = 10 does
