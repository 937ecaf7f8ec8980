"""The surge plan and a new deployment's first surge (autoscaler.faro.surge, issue 31 item 4).

Hand-made observations first (pure, Ray-free), then the same policy in the simulator on a
real trace slice that starts as ``faro-serve compare`` does: every model new, at one replica.
"""

import numpy as np

from autoscaler import ModelObservation, Observation, make_policy
from autoscaler.driving.explain import explain
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import max_rate_for_slo, min_replicas_for_slo

NAMES = ("a", "b", "c", "d")
MODELS = [ModelSLO(name=n, slo_ms=720, processing_ms=154) for n in NAMES]
R1 = max_rate_for_slo(1, 0.154, 0.72, 0.99)  # what one replica serves within the SLO
R3 = max_rate_for_slo(3, 0.154, 0.72, 0.99)
R7 = max_rate_for_slo(7, 0.154, 0.72, 0.99)


def observe(now, rates, targets=None, history=None, cap=10, future=None):
    """``history``: per-minute counts per model (None: a new deployment, no minute yet)."""
    targets = targets or {n: 1 for n in rates}
    return Observation(
        now=now,
        capacity_cpus=cap,
        capacity_memory_gb=None,
        models={
            n: ModelObservation(
                n,
                targets[n],
                targets[n],
                np.zeros(0) if history is None else np.full(20, history[n] * 60.0),
                arrival_rate=r,
            )
            for n, r in rates.items()
        },
        future_arrivals_per_min=future,
    )


def test_a_new_deployment_that_cannot_all_surge_shares_the_cluster_by_a_plan():
    rates = {n: 0.95 * R3 for n in NAMES}  # each needs 3 replicas: 12 against 10 CPUs
    assert min_replicas_for_slo(rates["a"], 0.154, 0.72, 0.99)[0] == 3
    plan = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=10))
    greedy = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=10, surge_plan=False))
    for pol in (plan, greedy):
        first = pol.decide(observe(0.0, {n: 0.0 for n in NAMES}))  # nothing seen yet
        assert first.kind == "long_term" and set(first.replicas.values()) == {1}
    d = plan.decide(observe(10.0, rates))
    assert d.kind == "surge-plan"
    assert set(d.info["models"]) == set(NAMES)  # the whole cluster, by the engine
    assert sum(d.replicas.values()) <= 10 and min(d.replicas.values()) >= 2
    assert all("re-levelled" in d.info["models"][n]["predictor"] for n in NAMES)
    text = "\n".join(explain([{"t": 10.0, "decision": {"kind": d.kind, "replicas": dict(d.replicas), "info": d.info}}]))
    assert "surge plan: the surging models' needs did not fit" in text and "new, no minute" in text
    g = greedy.decide(observe(10.0, rates))
    assert g.kind == "surge" and min(g.replicas.get(n, 1) for n in NAMES) == 1  # the last: nothing


def test_a_new_model_surges_past_what_it_has_not_twice_it():
    rates = {"a": 1.5 * R1, "b": 0.5, "c": 0.5, "d": 0.5}  # over one replica, under twice it
    on = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=8))
    off = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=8, surge_new=False))
    for pol in (on, off):
        pol.decide(observe(0.0, {n: 0.0 for n in NAMES}))
    d = on.decide(observe(10.0, rates))
    assert d is not None and d.replicas["a"] == min_replicas_for_slo(1.5 * R1, 0.154, 0.72, 0.99)[0]
    assert off.decide(observe(10.0, rates)) is None
    # with a minute of history the factor is 2 again: the same rate is no surge
    hist = {"a": 1.5 * R1, "b": 0.5, "c": 0.5, "d": 0.5}
    seasoned = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=8))
    seasoned.decide(observe(0.0, hist, history=hist))
    assert seasoned.decide(observe(10.0, rates, targets=None, history=hist)) is None


def test_surge_plans_keep_their_gap():
    hist = {"a": 0.5, "b": 0.5, "c": 0.5}
    models = MODELS[:3]
    pol = make_policy("faro-fairsum", models, ClusterSpec(cpus=8, replan=False))
    pol.decide(observe(0.0, hist, history=hist, cap=8))
    big = {"a": 0.95 * R7, "b": 0.5, "c": 0.5}  # needs 7 + 1 + 1: more than is free
    # within replan_gap_s (60 s) of the long-term plan: the greedy grant
    g = pol.decide(observe(10.0, big, history=hist, cap=8))
    assert g.kind == "surge" and g.replicas == {"a": 6}
    d = pol.decide(observe(70.0, big, targets={"a": 3, "b": 1, "c": 1}, history=hist, cap=8))
    assert d.kind == "surge-plan"
    # under heavy overload (needing 1.25 x the cluster or more): the greedy grant again
    h = pol.decide(observe(140.0, {**big, "a": 5 * R7}, targets={"a": 3, "b": 1, "c": 1}, history=hist, cap=8))
    assert h.kind == "surge"


def test_the_oracle_never_surge_plans():
    rates = {n: 0.95 * R3 for n in NAMES}
    fut = {n: [rates[n] * 60.0] * 10 for n in NAMES}
    pol = make_policy("oracle", MODELS, ClusterSpec(cpus=8))
    pol.decide(observe(0.0, {n: 0.0 for n in NAMES}, future=fut))
    d = pol.decide(observe(10.0, rates, future=fut))
    assert d is None or d.kind != "surge-plan"


def test_the_simulator_shows_the_first_minutes_as_the_live_driver_does():
    """Both call driver.with_open_minute: right after a start the open minute, extrapolated
    once 10 s old, is the history (the live meters' completed minutes would be none)."""
    from autoscaler.driving.driver import with_open_minute
    from faro_serve.sim.runner import SimConfig, simulate

    assert with_open_minute([], 30, 5.0).size == 0  # too young
    assert with_open_minute([], 30, 10.0).tolist() == [180.0]
    assert with_open_minute([120.0], 30, 20.0).tolist() == [120.0, 90.0]
    assert with_open_minute([120.0, 60.0], 30, 20.0).tolist() == [120.0, 60.0]
    seen = {}
    pol = make_policy("fairshare", MODELS[:1], ClusterSpec(cpus=4))
    decide = pol.decide

    def logged(o):
        seen[o.now] = o.models["a"].arrivals_per_min.copy()
        return decide(o)

    pol.decide = logged
    simulate(np.full((1, 4), 600.0), MODELS[:1], pol, SimConfig(capacity_cpus=4, seed=1))
    assert seen[0.0].size == 0
    assert seen[10.0].size == 1 and 300 < seen[10.0][0] < 900  # ~600/min from 10 s
    assert seen[60.0].size == 1  # minute 0 done; 1 not yet 10 s old
    assert seen[70.0].size == 2 and seen[70.0][0] == seen[60.0][0]
    assert seen[120.0].size == 2 and seen[180.0].size == 3  # completed minutes only


def test_simulated_new_deployment_loses_less_in_its_first_minutes():
    """A compare slice (day 9, minutes 310-340, 6 jobs, 16 replicas, slowed 3x, counts /3):
    every model starts new at one replica. The surge plan and the new models' surge lose less
    of the first five minutes than granting surges in turn (the rule before them)."""
    from faro_serve.distributions import parse_dist
    from faro_serve.metrics import utility_from_latency
    from faro_serve.validation.comparison import Workload
    from faro_serve.validation.matched import simulate_policy

    wl = Workload(
        trace="../shared/traces/faro10_days1-10.csv",
        day=9,
        sample=0,
        jobs=("job9", "job0", "job3", "job1", "job6", "job5"),
        start=310,
        minutes=10,
        rate_scale=1 / 3,
        slowdown=3,
    )
    lost = {}
    for on in (True, False):
        r = simulate_policy(
            "faro-fairsum",
            wl,
            16,
            parse_dist("lognorm:0.5,0.008,0.003"),
            10.0,
            cluster={"surge_plan": on, "surge_new": on},
        )
        u = utility_from_latency(r.table.p_all, np.full(len(r.names), 2.16))
        lost[on] = float((1 - u[:, :5]).sum())
        assert ("surge-plan" in r.decisions) is on
    assert lost[True] < lost[False]


def test_a_new_model_is_judged_by_its_open_minute_when_the_tick_saw_less():
    """Live, the first tick's 10 s window may hold only the seconds since the load began,
    while the open minute is extrapolated from the meter's start: the higher one counts."""
    pol = make_policy("faro-fairsum", MODELS, ClusterSpec(cpus=10))
    pol.decide(observe(0.0, {n: 0.0 for n in NAMES}))
    o = observe(10.0, {"a": 0.5 * R1, "b": 0.1, "c": 0.1, "d": 0.1})
    a = o.models["a"]
    o.models["a"] = ModelObservation("a", 1, 1, np.array([3 * R1 * 60.0]), arrival_rate=a.arrival_rate)
    d = pol.decide(o)
    assert d is not None and d.replicas["a"] == min_replicas_for_slo(3 * R1, 0.154, 0.72, 0.99)[0]
