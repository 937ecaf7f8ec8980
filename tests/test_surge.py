"""Faro's surge response (ours, after Knative's panic mode) and the recovery metrics.

The rule on hand-made observations, then the same policy object in the simulator on a step
trace (against the rule switched off) and on a flat trace (it never fires, nothing
oscillates).
"""

import numpy as np
import pytest

from autoscaler import ModelObservation, Observation, make_policy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import max_rate_for_slo, min_replicas_for_slo
from faro_serve.recovery import recovery_time, surge_damage, surge_report, window_percentiles
from faro_serve.sim.runner import SimConfig, simulate

MODELS = [ModelSLO(name="a", slo_ms=720, processing_ms=154), ModelSLO(name="b", slo_ms=720, processing_ms=154)]
R1 = max_rate_for_slo(1, 0.154, 0.72, 0.99)  # what one replica serves within the SLO


def observe(now, rate_a, target_a=1, queue_a=0.0, cap=12, before_a=0.8 * R1):
    return Observation(
        now=now,
        capacity_cpus=cap,
        capacity_memory_gb=None,
        models={
            "a": ModelObservation(
                "a", target_a, target_a, np.full(20, before_a * 60), arrival_rate=rate_a, queue_length=queue_a
            ),
            "b": ModelObservation("b", 1, 1, np.full(20, 60.0), arrival_rate=1.0),
        },
    )


def test_max_rate_inverts_min_replicas():
    for c in (1, 2, 5, 12):
        r = max_rate_for_slo(c, 0.154, 0.72, 0.99)
        assert min_replicas_for_slo(r * 0.999, 0.154, 0.72, 0.99)[0] <= c
        assert min_replicas_for_slo(r * 1.01, 0.154, 0.72, 0.99)[0] > c
    assert max_rate_for_slo(1, 0.8, 0.72, 0.99) == 0.0  # the SLO is below the processing time


def test_surge_adds_what_the_short_window_rate_needs_at_once():
    pol = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12))
    pol.decide(observe(0.0, 0.8 * R1))  # the first long-term plan
    d = pol.decide(observe(10.0, 5 * R1))
    need = min_replicas_for_slo(5 * R1, 0.154, 0.72, 0.99)[0]
    assert d is not None and d.kind == "surge" and d.replicas == {"a": need}
    assert d.info["surge"]["a"]["from"] == 1 and d.info["surge"]["a"]["to"] == need
    # the queue behind the surge asks for more: drained within one more tick
    q = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12))
    q.decide(observe(0.0, 0.8 * R1))
    assert q.decide(observe(10.0, 5 * R1, queue_a=50)).replicas["a"] > need


def test_surge_has_hysteresis_and_respects_capacity_and_the_switch():
    pol = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12))
    pol.decide(observe(0.0, 0.8 * R1))
    assert pol.decide(observe(10.0, 1.9 * R1)) is None  # below 2x what one replica serves
    need = pol.decide(observe(20.0, 5 * R1)).replicas["a"]
    # at the new target the same rate is no surge, nor is a rate below 2x what it serves
    assert pol.decide(observe(30.0, 5 * R1, target_a=need)) is None
    assert pol.decide(observe(40.0, 1.9 * max_rate_for_slo(need, 0.154, 0.72, 0.99), target_a=need)) is None
    # only free capacity: 2 CPUs, both models at their minimum of 1
    tight = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=3))
    tight.decide(observe(0.0, 0.8 * R1, cap=3))
    assert tight.decide(observe(10.0, 5 * R1, cap=3)).replicas == {"a": 2}
    # a model an overloaded plan keeps short on purpose: its rate was already there
    steady = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12))
    steady.decide(observe(0.0, 0.8 * R1))
    assert steady.decide(observe(10.0, 5 * R1, before_a=4 * R1)) is None
    assert steady.decide(observe(20.0, 9 * R1, before_a=4 * R1)).kind == "surge"  # but doubling is
    off = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12, surge=False))
    off.decide(observe(0.0, 0.8 * R1))
    assert off.decide(observe(10.0, 5 * R1)) is None


def test_surge_joins_a_long_term_plan_made_the_same_tick():
    pol = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12))
    d = pol.decide(observe(0.0, 5 * R1))  # the history knows nothing of the surge yet
    assert d.kind == "long_term" and "surge" in d.info
    assert d.replicas["a"] >= min_replicas_for_slo(5 * R1, 0.154, 0.72, 0.99)[0]
    assert sum(d.replicas.values()) <= 12


def test_a_plan_whose_forecast_lags_does_not_undo_a_surge():
    """The next long-term plan comes while the minute history still shows the old rate (a
    deployment's first minute, seen live in bench.pipeline_live: a plan cut a surging stage
    from 2 replicas to 1 at 7 queries/s). Judged at the plan's targets, the surge keeps what
    the rate seen now needs."""
    pol = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12))
    pol.decide(observe(0.0, 0.8 * R1))
    need = pol.decide(observe(10.0, 5 * R1)).replicas["a"]
    d = pol.decide(observe(300.0, 5 * R1, target_a=need))  # history: 0.8 x R1 per minute
    assert d.kind == "long_term" and d.replicas["a"] >= need, d.replicas
    assert d.info["surge"]["a"]["to"] >= need
    # once the history holds the new rate, the plan itself provides for it
    d = pol.decide(observe(600.0, 5 * R1, target_a=need, before_a=5 * R1))
    assert d.kind == "long_term" and "surge" not in d.info and d.replicas["a"] >= need - 1


def _step_run(surge: bool, cold_start_s=10.0, step_min=10, minutes=16):
    counts = np.zeros((2, minutes))
    counts[0] = 0.8 * R1 * 60
    counts[0, step_min:] = 5 * R1 * 60  # a step to 5x what one replica serves
    counts[1] = R1 * 60
    pol = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12, cold_start_s=cold_start_s, surge=surge))
    res = simulate(
        counts,
        MODELS,
        pol,
        SimConfig(capacity_cpus=12, cold_start_s=cold_start_s, keep_records=True, seed=1),
        warmup_history=np.tile(counts[:, :1], (1, 30)),
    )
    r = res.records
    rep = surge_report(
        ["a", "b"], r["model"], r["arrival_s"], r["latency_s"], r["dropped"], 0.72, 99.0, 60.0 * step_min
    )
    return res, rep["models"]["a"]


def test_simulated_step_recovers_within_the_cold_start_plus_15_s(report):
    on_res, on = _step_run(True)
    off_res, off = _step_run(False)
    report(
        f"surge step (sim, cold start 10 s, 1 replica -> 5x its SLO rate): recovery "
        f"{on['recovery_s']} s with the surge rule, {off['recovery_s']} s without; requests "
        f"dropped or over the SLO in the first 2 min {on['bad']} vs {off['bad']} of {on['requests']}"
    )
    assert on_res.decisions.get("surge", 0) >= 1 and "surge" not in off_res.decisions
    assert on["recovery_s"] is not None and on["recovery_s"] <= 10.0 + 15.0
    assert off["recovery_s"] is None or off["recovery_s"] > on["recovery_s"]
    assert on["bad"] <= 0.5 * off["bad"]


@pytest.mark.parametrize("level", [0.9, 3.0])
def test_flat_trace_never_surges(level):
    """An hour of flat (Poisson-noisy) load: the rule never fires, so the targets are exactly
    those of the policy without it (whatever the paper's reactive step does near the edge
    of one replica's capacity, it does with the rule off too)."""
    counts = np.tile(np.array([[level * R1 * 60], [4 * R1 * 60]]), (1, 60))
    runs = []
    for surge in (True, False):
        pol = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=12, cold_start_s=10, surge=surge))
        runs.append(
            simulate(
                counts,
                MODELS,
                pol,
                SimConfig(capacity_cpus=12, cold_start_s=10, seed=3),
                warmup_history=np.tile(counts[:, :1], (1, 30)),
            )
        )
    assert "surge" not in runs[0].decisions
    assert np.array_equal(runs[0].targets, runs[1].targets)


# --- the metrics, on hand-made records -----------------------------------------------
def test_recovery_time_and_damage_on_hand_made_records():
    arrival = np.arange(0.0, 100.0, 0.1)  # 10 requests/s for 100 s
    latency = np.full(arrival.size, 0.2)
    dropped = np.zeros(arrival.size, bool)
    latency[(arrival >= 50) & (arrival < 62)] = 2.0  # slow for 12 s after a step at 50
    dropped[(arrival >= 50) & (arrival < 53)] = True
    assert recovery_time(arrival, latency, dropped, 0.72, 99, 50.0) == pytest.approx(12.0)
    assert recovery_time(arrival, latency, dropped, 0.72, 99, 70.0) == 0.0
    still = latency.copy()
    still[arrival >= 90] = 2.0
    assert recovery_time(arrival, still, dropped, 0.72, 99, 50.0) is None
    dmg = surge_damage(arrival, latency, dropped, 0.72, 50.0, span_s=20.0)
    assert dmg == {"requests": 200, "dropped": 30, "over_slo": 90, "bad": 120}
    p = window_percentiles(arrival, latency, dropped, 99, np.array([0.0, 50.0, 200.0]), 10.0)
    assert p[0] == pytest.approx(0.2) and np.isinf(p[1]) and np.isnan(p[2])
    with pytest.raises(ValueError, match="whole 10 s window"):
        recovery_time(arrival, latency, dropped, 0.72, 99, 95.0)
