"""Faro plans pipelines end to end (issue 35 item 3; docs/pipelines.md). Fast, no Ray."""

import numpy as np
import pytest

from autoscaler import ModelObservation, Observation, make_policy
from autoscaler.contract.policy import PipelineObservation
from bench.pipeline_composition import case
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import plan
from faro_serve.engine.latency import min_replicas_for_slo
from faro_serve.engine.pipeline_latency import compose, path_matrix, shares
from faro_serve.engine.planner import make_problem
from faro_serve.engine.utility import phi
from faro_serve.pipelines import PipelineSLO


def chain(slo_ms=250.0, pa=5.0, pb=100.0, name="pipe"):
    return PipelineSLO(
        name=name,
        slo_ms=slo_ms,
        stages=[dict(name="a", processing_ms=pa, cpus=1), dict(name="b", after=["a"], processing_ms=pb, cpus=1)],
    )


@pytest.mark.parametrize("lam", [40.0, 64.0])  # stage loads 0.5 and 0.8
def test_composed_p99_is_conservative_within_the_stated_tolerance(lam):
    """The planner's rule (sum of the stages' p99 estimates) against a simulated chain of
    two M/D/c queues (the simulator's kernel): never below the simulated p99 by more than
    5 %, and above it by less than 80 % (docs/pipelines.md has the table)."""
    r = case(lam, [(2, 0.025), (4, 0.05)], 0.99, 100_000, seed=1)
    assert 0.95 * r["sim"] <= r["sum"] <= 1.8 * r["sim"]
    # the convolution of the stages' M/D/c distributions sits between them
    assert r["sim"] * 0.95 <= r["conv"] <= r["sum"]


def test_compose_takes_the_slowest_path_and_its_shares():
    # a -> b, a -> c: the e2e estimate is a + max(b, c)
    paths = path_matrix([[0, 1], [0, 2]], 3)
    lat = np.array([[0.1, 0.3, 0.2], [0.1, 0.1, 0.4]])
    assert compose(lat, paths) == pytest.approx([0.4, 0.5])
    assert shares(lat[0], paths) == pytest.approx([0.25, 0.75, 0.0])


def test_planner_gives_the_slow_stage_more_replicas():
    p = chain(slo_ms=300, pa=20, pb=100)
    a = plan(p.stage_models(), {"pipe": 30.0}, {"a": 2, "b": 6}, ClusterSpec(cpus=40), pipelines=[p])
    assert a.replicas["b"] > a.replicas["a"]
    pd = a.pipelines[0]
    assert pd.latency_ms <= 300 and pd.utility == pytest.approx(1.0)
    assert pd.stages["b"]["share"] > pd.stages["a"]["share"]
    assert sum(s["share"] for s in pd.stages.values()) == pytest.approx(1.0)
    assert all(d.pipeline == "pipe" for d in a.decisions)


def test_joint_plan_meets_the_slo_where_the_equal_split_fails_or_costs_more():
    """A fast stage a and a slow stage b: the equal split gives b only half the SLO, which
    it needs many more replicas for, while a wastes its half."""
    p = chain()
    m = ModelSLO(name="m", slo_ms=200, processing_ms=50, cpus=1)
    models = [m] + p.stage_models()
    cur = {"m": 3, "a": 1, "b": 6}
    # contended: 9 CPUs
    joint = plan(models, {"m": 20.0, "pipe": 40.0}, cur, ClusterSpec(cpus=9), pipelines=[p])
    split = plan(models, {"m": 20.0, "a": 40.0, "b": 40.0}, cur, ClusterSpec(cpus=9))
    assert joint.pipelines[0].latency_ms <= p.slo_ms
    assert all(d.utility == pytest.approx(1.0) for d in joint.decisions)
    assert min(d.utility for d in split.decisions) < 0.9  # b misses its half of the SLO
    # ample: the split buys what its half needs; the joint plan stops at the e2e SLO
    joint = plan(models, {"m": 20.0, "pipe": 40.0}, cur, ClusterSpec(cpus=30), pipelines=[p])
    split = plan(models, {"m": 20.0, "a": 40.0, "b": 40.0}, cur, ClusterSpec(cpus=30))
    need_b_split = min_replicas_for_slo(40.0, 0.1, 0.125, 0.99)[0]
    assert split.replicas["b"] >= need_b_split - 1
    assert joint.cpus_used < split.cpus_used
    assert joint.pipelines[0].latency_ms <= p.slo_ms


def _obs(now, p, targets, pipe_latency=None, stage_latency=None, rate=40.0, cap=12):
    models = {"m": ModelObservation("m", targets["m"], targets["m"], np.full(20, 600.0), arrival_rate=10.0)}
    for s in p.stages:
        models[s.name] = ModelObservation(
            s.name,
            targets[s.name],
            targets[s.name],
            np.full(20, rate * 60 * s.fraction),
            arrival_rate=rate * s.fraction,
            latency_ms=stage_latency,
        )
    return Observation(
        now=now,
        capacity_cpus=cap,
        capacity_memory_gb=None,
        models=models,
        pipelines={p.name: PipelineObservation(p.name, np.full(20, rate * 60), rate, pipe_latency)},
    )


def test_faro_with_pipelines_plans_every_stage_and_model_within_capacity():
    p = chain()
    m = ModelSLO(name="m", slo_ms=200, processing_ms=50, cpus=1)
    for name in ("faro-fairsum", "faro-sum", "faro-penaltyfairsum"):
        policy = make_policy(name, [m] + p.stage_models(), ClusterSpec(cpus=12), pipelines=[p])
        d = policy.decide(_obs(0.0, p, {"m": 2, "a": 2, "b": 4}))
        assert d.kind == "long_term" and set(d.replicas) == {"m", "a", "b"}
        assert sum(d.replicas.values()) <= 12
        info = d.info["pipelines"]["pipe"]
        assert set(info["stages"]) == {"a", "b"}
        assert info["stages"]["b"]["replicas"] == d.replicas["b"] > d.replicas["a"]
        assert d.info["models"]["b"]["forecast_mean_rps"] == pytest.approx(40.0)


def test_reactive_step_adds_to_the_bottleneck_stage_on_the_end_to_end_slo():
    p = chain()
    m = ModelSLO(name="m", slo_ms=200, processing_ms=50, cpus=1)
    policy = make_policy("faro-fairsum", [m] + p.stage_models(), ClusterSpec(cpus=12), pipelines=[p])
    t = {"m": 2, "a": 1, "b": 6}
    policy.decide(_obs(0.0, p, t))
    # the stages over their own (equal-split) targets for 30 s while the pipeline meets its
    # SLO: each gets a replica, as with faro-split (a stage falling behind is helped at once)
    for now in (10.0, 20.0, 30.0):
        assert policy.decide(_obs(now, p, t, pipe_latency=200.0, stage_latency=180.0)) is None
    d = policy.decide(_obs(40.0, p, t, pipe_latency=200.0, stage_latency=180.0))
    assert d.kind == "reactive" and dict(d.replicas) == {"a": 2, "b": 7}
    # the pipeline over its SLO for 30 s: one more replica for b (most of the estimate)
    for now in (50.0, 60.0, 70.0):
        assert policy.decide(_obs(now, p, t, pipe_latency=400.0)) is None
    d = policy.decide(_obs(80.0, p, t, pipe_latency=400.0))
    assert d.kind == "reactive" and dict(d.replicas) == {"b": 7}


def test_faro_split_is_faro_fairsum_on_the_stages_without_pipelines():
    p = chain()
    m = ModelSLO(name="m", slo_ms=200, processing_ms=50, cpus=1)
    models = [m] + p.stage_models()
    split = make_policy("faro-split", models, ClusterSpec(cpus=12), pipelines=[p])
    faro = make_policy("faro-fairsum", models, ClusterSpec(cpus=12))
    assert split.pipelines == () and split.name == "faro-split"
    t = {"m": 1, "a": 1, "b": 1}
    for now, lat in ((0.0, None), (10.0, 400.0), (40.0, 400.0), (300.0, None)):
        a, b = split.decide(_obs(now, p, t, lat, lat)), faro.decide(_obs(now, p, t, lat, lat))
        assert (a is None) == (b is None)
        if a is not None:  # the same decision (the solve time apart)
            assert (a.settings, a.kind, a.plan) == (b.settings, b.kind, b.plan)
            assert {**a.info, "solve_ms": 0} == {**b.info, "solve_ms": 0}
            t = {**t, **a.replicas}
    with pytest.raises(ValueError, match="not models"):
        make_policy("faro-split", [m], ClusterSpec(cpus=12), pipelines=[p])


def test_drops_are_the_entry_stages_and_reach_every_stage():
    p = PipelineSLO(
        name="pipe",
        slo_ms=250,
        stages=[
            dict(name="a", processing_ms=5, cpus=1, allow_drop=True),
            dict(name="b", after=["a"], processing_ms=100, cpus=1, allow_drop=True),
        ],
    )
    cl = ClusterSpec(cpus=5, objective="penalty_fair_sum")
    prob = make_problem(p.stage_models(), {"pipe": 40.0}, {"a": 1, "b": 4}, cl, pipelines=[p])
    assert list(prob.can_drop) == [True, False]
    x = np.array([1.0, 4.0])
    # 4 replicas of b serve 40/s at most: dropping a fifth at the entry relieves b too
    u0 = prob.utilities(x, np.array([0.0, 0.0]))[1]
    u1 = prob.utilities(x, np.array([0.2, 0.0]))[1]
    assert u1 > 2 * u0
    eu = prob.job_values(x, np.array([0.2, 0.0]))
    assert eu[0] == eu[1] == pytest.approx(u1 * float(phi(0.2)))
    a = plan(p.stage_models(), {"pipe": 40.0}, {"a": 1, "b": 4}, cl, pipelines=[p])
    assert a.drop_rates["b"] == 0.0 and a.pipelines[0].drop_rate == a.drop_rates["a"]
    assert sum(a.replicas.values()) <= 5


def test_grouped_planning_keeps_a_pipelines_stages_in_one_group():
    p = chain()
    singles = [ModelSLO(name=f"m{k}", slo_ms=200, processing_ms=50, cpus=1) for k in range(4)]
    models = singles + p.stage_models()
    fc = {**{m.name: 10.0 for m in singles}, "pipe": 40.0}
    cur = {**{m.name: 2 for m in singles}, "a": 1, "b": 6}
    cl = ClusterSpec(cpus=20, groups=3)
    prob = make_problem(models, fc, cur, cl, pipelines=[p])
    groups = prob.unit_groups(3, np.random.default_rng(0))
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert any({4, 5} <= set(g) for g in groups)  # a and b together
    a = plan(models, fc, cur, cl, pipelines=[p])
    assert a.groups == 3 and a.cpus_used <= 20
    assert a.pipelines[0].latency_ms <= p.slo_ms and a.replicas["b"] > a.replicas["a"]


def test_oracle_plans_a_pipeline_from_its_true_future():
    p = chain()
    m = ModelSLO(name="m", slo_ms=200, processing_ms=50, cpus=1)
    models = [m] + p.stage_models()
    obs = _obs(0.0, p, {"m": 2, "a": 1, "b": 6}, rate=10.0, cap=30)  # history: 10/s ...
    obs.future_arrivals_per_min = {"m": np.full(7, 600.0), "pipe": np.full(7, 60 * 60.0)}  # ... 60/s
    d = make_policy("oracle", models, ClusterSpec(cpus=30), pipelines=[p]).decide(obs)
    assert d.info["models"]["b"]["forecast_mean_rps"] == pytest.approx(60.0)
    assert d.info["models"]["b"]["predictor"] == "oracle (pipeline pipe)"
    assert d.replicas["b"] >= min_replicas_for_slo(60.0, 0.1, 0.24, 0.99)[0]
