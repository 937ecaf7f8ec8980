"""Issue 48 (scale): ``replan_scope="groups"``, a re-plan of only the triggering models'
groups, and the exact speed-ups beside it (bands in one call, the recurring-peak search array-wise, a slim
problem to the solver's child)."""

import numpy as np
import pytest

from autoscaler import ModelObservation, Observation, make_policy
from autoscaler.faro.replan import band_of, bands_of, replan_scope, scoped_capacity
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import make_problem, sandbox
from faro_serve.engine.hierarchy import model_groups
from faro_serve.engine.solver import solve_relaxed
from faro_serve.resources import Capacity
from forecasting.recurrence import Recurrence, _strongest_peak

SLO = dict(slo_ms=720, processing_ms=154)


def models(n):
    return [ModelSLO(name=f"m{i}", **SLO) for i in range(n)]


def test_scope_is_the_triggering_models_groups_and_the_whole_cluster_below_50():
    assert ClusterSpec(cpus=8).replan_scope == "cluster"  # the default: every model
    assert replan_scope(models(100), ClusterSpec(cpus=200), {"m5"}) is None
    c = ClusterSpec(cpus=200, replan_scope="groups")
    assert replan_scope(models(30), c, {"m3"}) is None  # one group: the whole cluster
    ms = models(100)
    groups = model_groups(100, c)
    assert len(groups) == 10 and sorted(i for g in groups for i in g) == list(range(100))
    scope, spec = replan_scope(ms, c, {"m5"})
    (g5,) = [g for g in groups if 5 in g]
    assert scope == [f"m{i}" for i in g5] and spec.groups == 1
    g_other = next(g for g in groups if 5 not in g)
    two, spec = replan_scope(ms, c, {"m5", f"m{g_other[0]}"})
    assert set(two) == {f"m{i}" for i in g5 + g_other} and len(two) == 20 and spec.groups == 2
    assert replan_scope(ms, c, {f"m{g[0]}" for g in groups}) is None  # every group: the cluster
    with pytest.raises(ValueError):
        ClusterSpec(cpus=8, replan_scope="some")


def test_scoped_capacity_is_what_the_other_models_leave():
    ms = models(4)
    c = ClusterSpec(cpus=20)
    cap = scoped_capacity(ms, c, Capacity.of(cpus=18), {"m0": 3, "m1": 5, "m2": 2, "m3": 1}, {"m0", "m3"})
    assert cap.cpus == pytest.approx(18 - 5 - 2)


def obs(now, rates, targets, cpus):
    return Observation(
        now=now,
        capacity_cpus=cpus,
        capacity_memory_gb=None,
        models={
            n: ModelObservation(
                n,
                targets[n],
                targets[n],
                np.full(20, 60.0),
                arrival_rate=rates[n],
                latency_ms=None,
                processing_ms=154.0,
            )
            for n in rates
        },
    )


@pytest.mark.parametrize("scope", ["groups", "cluster"])
def test_a_replan_at_60_models_plans_the_triggering_models_group(scope):
    ms = models(60)
    policy = make_policy("faro-fairsum", ms, ClusterSpec(cpus=150, replan_trigger_s=10.0, replan_scope=scope))
    flat = {m.name: 1.0 for m in ms}
    first = policy.decide(obs(0.0, flat, {m.name: 2 for m in ms}, 150))
    assert first.kind == "long_term"
    targets = {m.name: first.replicas.get(m.name, 2) for m in ms}
    for t in range(10, 70, 10):
        assert policy.decide(obs(float(t), flat, targets, 150)) is None
    d = policy.decide(obs(70.0, {**flat, "m7": 12.0}, targets, 150))
    assert d is not None and d.kind == "replan"
    assert d.replicas["m7"] > targets["m7"]
    if scope == "groups":
        (g,) = [g for g in model_groups(60, policy.cluster) if 7 in g]
        planned = {f"m{i}" for i in g}
        assert set(d.info["models"]) == planned and set(d.replicas) <= planned
        assert d.info["replan"]["scope"] == {"models": len(g), "of": 60}
        assert set(policy.band) == {m.name for m in ms}  # the others keep their bands
    else:
        assert set(d.info["models"]) == {m.name for m in ms} and "scope" not in d.info["replan"]


def test_bands_in_one_call_equal_band_by_band():
    rng = np.random.default_rng(3)
    s = {f"m{i}": rng.gamma(2.0, 1.0, (100, 7) if i % 5 else (40, 3)) for i in range(30)}
    s["zero"] = np.zeros((100, 7))
    got = bands_of(s)
    assert list(got) == list(s) and got == {n: band_of(v) for n, v in s.items()}


def _peak_by_lag(acf, max_lag, rc):
    """The search lag by lag, as it was written before it went array-wise."""
    best, best_acf = None, rc.min_acf
    for lag in range(rc.min_lag, max_lag + 1):
        a = acf[lag]
        if a < best_acf or a < acf[lag - 1] or a < acf[lag + 1]:
            continue
        if a - acf[1:lag].min() >= rc.dip:
            best, best_acf = lag, a
    return best


def test_the_array_wise_peak_search_finds_the_lag_by_lag_one():
    rc, rng = Recurrence(), np.random.default_rng(7)
    found = 0
    for k in range(3000):
        max_lag = int(rng.integers(rc.min_lag + 1, 181))
        if k % 3 == 0:  # ties: a few levels only
            acf = rng.integers(0, 4, max_lag + 2) / 4.0
        else:
            lag = rng.integers(5, 90)
            acf = 0.6 * np.cos(2 * np.pi * np.arange(max_lag + 2) / lag) + rng.normal(0, 0.2, max_lag + 2)
        acf[0] = 1.0
        want = _peak_by_lag(acf, max_lag, rc)
        assert _strongest_peak(acf, max_lag, rc) == want
        found += want is not None
    assert found > 500  # both outcomes were exercised


def test_the_solver_child_gets_the_problem_without_its_samples_and_solves_it_the_same():
    ms = [ModelSLO(name=f"m{i}", slo_ms=500 + 40 * i, processing_ms=100 + 10 * i) for i in range(10)]
    rng = np.random.default_rng(0)
    rates = {m.name: rng.gamma(4.0, 1.5, (100, 7)) for m in ms}
    prob = make_problem(ms, rates, {m.name: 2 for m in ms}, ClusterSpec(cpus=40))
    slim = sandbox._wire(prob)
    assert all(j.rates.size == 0 for j in slim.jobs) and all(j.rates.shape == (100, 7) for j in prob.jobs)
    x1, d1, n1 = solve_relaxed(prob, backend="nlopt")
    x2, d2, n2 = solve_relaxed(prob, backend="nlopt-inline")
    assert n1 > 0 and n1 == n2 and np.array_equal(x1, x2) and np.array_equal(d1, d2)
