"""Issue 36, item 3: a thousand models. The planner on 1,000 models with synthetic
forecasts stays feasible and within every model's minimum, and its deadline
(``ClusterSpec.plan_deadline_s``) falls back and says so: a behaviour, not a timing
assertion (``bench/scale_bench.py`` measures the times)."""

import numpy as np
import pytest

from autoscaler import ModelObservation, Observation, make_policy
from autoscaler.driving.explain import explain
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import plan

N, CPUS = 1000, 3000


@pytest.fixture(scope="module")
def thousand():
    """1,000 models of mixed SLOs, processing times, minimums and priorities; forecasts
    are 20 samples x 7 steps around a per-model rate; some models get two CPUs."""
    rng = np.random.default_rng(36)
    proc = rng.uniform(40, 300, N)
    models = [
        ModelSLO(
            name=f"m{i}",
            slo_ms=float(round(proc[i] * rng.uniform(3, 8))),
            processing_ms=float(proc[i]),
            min_replicas=int(rng.integers(1, 3)),
            cpus=float(rng.choice([1.0, 1.0, 1.0, 2.0])),
            priority=float(rng.choice([1.0, 2.0])),
        )
        for i in range(N)
    ]
    rate = rng.uniform(0.2, 12.0, N)
    forecasts = {m.name: np.abs(rng.normal(rate[i], 0.15 * rate[i] + 0.05, size=(20, 7))) for i, m in enumerate(models)}
    current = {m.name: m.min_replicas for m in models}
    return models, forecasts, current


def check(alloc, models):
    by = {d.name: d for d in alloc.decisions}
    assert len(by) == N
    assert all(by[m.name].replicas >= m.min_replicas for m in models)
    assert sum(by[m.name].replicas * m.cpus for m in models) <= CPUS + 1e-9
    assert alloc.cpus_used <= CPUS + 1e-9
    assert np.isfinite(alloc.objective_value)


def test_a_thousand_models_plan_within_capacity_and_minimums(thousand):
    models, forecasts, current = thousand
    cluster = ClusterSpec(cpus=CPUS, objective="fair_sum")
    alloc = plan(models, forecasts, current, cluster)
    check(alloc, models)
    assert alloc.groups == 10
    # groups of 100 are nested (group_max 20): every COBYLA stays at about 10 variables
    assert any("nested" in n for n in alloc.notes)
    # within the default deadline, or past it and saying so: never silent
    assert alloc.fallback is None or "deadline" in alloc.fallback
    assert alloc.cpus_used > 0.9 * CPUS  # the capacity is used, not left idle


@pytest.mark.parametrize("groups", [None, 1])
def test_a_tiny_deadline_falls_back_and_the_decision_says_so(thousand, groups):
    models, forecasts, current = thousand
    cluster = ClusterSpec(cpus=CPUS, groups=groups, plan_deadline_s=1e-6)
    alloc = plan(models, forecasts, current, cluster)
    check(alloc, models)
    assert alloc.fallback is not None and "deadline" in alloc.fallback
    assert "skipped" in alloc.fallback  # no COBYLA ran: the integer starts decided
    assert alloc.fallback in alloc.notes
    assert alloc.evaluations == 0


def test_the_policy_decision_and_its_explanation_carry_the_fallback():
    """Through Faro's policy: the decision record (log, status) shows the fallback."""
    models = [ModelSLO(name=f"m{i}", slo_ms=720, processing_ms=154) for i in range(60)]
    obs = Observation(
        now=0.0,
        capacity_cpus=200,
        capacity_memory_gb=None,
        models={m.name: ModelObservation(m.name, 1, 1, np.full(20, 60.0 + 10 * (i % 7))) for i, m in enumerate(models)},
    )
    d = make_policy("faro-fairsum", models, ClusterSpec(cpus=200, plan_deadline_s=1e-6)).decide(obs)
    assert d.kind == "long_term" and "deadline" in d.info["fallback"]
    lines = explain([{"t": 0.0, "decision": {"kind": d.kind, "replicas": d.replicas, "info": d.info}}])
    assert any(line.startswith("  planner fell back: deadline") for line in lines)
    calm = make_policy("faro-fairsum", models, ClusterSpec(cpus=200, plan_deadline_s=None)).decide(obs)
    assert "fallback" not in calm.info
