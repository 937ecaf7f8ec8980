"""Resources as Ray names them (issue 34 item 7): GPUs, fractional GPUs and custom resources
bind the plan, every policy and the drivers' checks as CPUs do; CPU-only plans are as before."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoscaler import make_policy
from autoscaler.contract.policy import Decision, ModelObservation, Observation, grant_in_order
from autoscaler.driving.cluster_adapter import capped_capacity
from autoscaler.driving.driver import CapacityExceeded, apply_decision, observe
from faro_serve.config import ClusterSpec, FaroConfig, ModelSLO, check_minimums_fit
from faro_serve.engine import plan
from faro_serve.resources import CPU, GPU, MEMORY, Capacity, demand, usage
from faro_serve.sim import SimConfig, simulate

SLO, PROC = 720.0, 154.0
RATES = (0.5, 5.0, 20.0, 80.0)  # requests/s per model: idle to far beyond 2 GPUs


def gpu_models(gpus=1.0, n=2, **kw):
    return [ModelSLO(name=f"m{i}", slo_ms=SLO, processing_ms=PROC, gpus=gpus, max_replicas=40, **kw) for i in range(n)]


def used(models, replicas) -> dict[str, float]:
    return usage(replicas, {m.name: demand(m) for m in models})


@pytest.mark.parametrize("objective", ["fair_sum", "sum", "fair", "penalty_fair_sum"])
@pytest.mark.parametrize("groups", [1, 2])
def test_the_plan_never_takes_more_gpus_than_the_cluster_has(objective, groups):
    ms = gpu_models()
    for rate in RATES:
        alloc = plan(
            ms, {"m0": rate, "m1": rate}, None, ClusterSpec(cpus=64, gpus=2, objective=objective, groups=groups)
        )
        assert used(ms, alloc.replicas)[GPU] <= 2 + 1e-9, (rate, alloc.replicas)
    # the GPUs bind: without the cap the same load takes more replicas
    free = plan(ms, {"m0": 20.0, "m1": 20.0}, None, ClusterSpec(cpus=64, objective=objective))
    assert sum(free.replicas.values()) > 2


def test_the_live_capacity_binds_the_plan_where_the_config_leaves_gpus_out():
    ms = gpu_models()
    alloc = plan(ms, {"m0": 20.0, "m1": 20.0}, None, ClusterSpec(cpus=64), capacity=Capacity.of(64, gpus=2))
    assert used(ms, alloc.replicas)[GPU] <= 2 + 1e-9


def test_half_gpus_pack_four_replicas_on_two():
    ms = gpu_models(gpus=0.5)
    alloc = plan(ms, {"m0": 20.0, "m1": 20.0}, None, ClusterSpec(cpus=64, gpus=2))
    assert sum(alloc.replicas.values()) == 4  # loaded beyond 4: every half GPU taken
    assert used(ms, alloc.replicas)[GPU] == pytest.approx(2.0)


def test_a_custom_resource_caps_the_plan():
    ms = [
        ModelSLO(name=f"m{i}", slo_ms=SLO, processing_ms=PROC, max_replicas=40, resources={"accelerator": 1.0})
        for i in range(2)
    ]
    for rate in RATES:
        alloc = plan(ms, {"m0": rate, "m1": rate}, None, ClusterSpec(cpus=64, resources={"accelerator": 3}))
        assert used(ms, alloc.replicas)["accelerator"] <= 3 + 1e-9
    # a cap on a resource no model uses changes nothing
    loaded = {"m0": 20.0, "m1": 20.0}
    cpu_only = [ModelSLO(name=f"m{i}", slo_ms=SLO, processing_ms=PROC, max_replicas=40) for i in range(2)]
    assert (
        plan(cpu_only, loaded, None, ClusterSpec(cpus=12, gpus=1, resources={"x": 0})).replicas
        == plan(cpu_only, loaded, None, ClusterSpec(cpus=12)).replicas
    )


@pytest.mark.parametrize("groups", [1, 2])
def test_cpu_only_plans_are_unchanged_by_caps_that_do_not_bind(groups):
    """A GPU and custom cap far above what the models could take leaves the CPU-bound plan
    exactly as the CPU-only one: same replicas, drops and objective."""
    rng = np.random.default_rng(3)
    ms = [ModelSLO(name=f"m{i}", slo_ms=SLO, processing_ms=PROC, priority=float(i + 1)) for i in range(5)]
    fc = {m.name: rng.uniform(1, 12, (20, 7)) for m in ms}
    cur = {m.name: int(rng.integers(1, 4)) for m in ms}
    base = plan(ms, fc, cur, ClusterSpec(cpus=14, groups=groups, objective="penalty_fair_sum"))
    with_gpus = [m.model_copy(update={"gpus": 0.25, "resources": {"x": 1.0}}) for m in ms]
    capped = plan(
        with_gpus,
        fc,
        cur,
        ClusterSpec(cpus=14, gpus=1000, resources={"x": 1000}, groups=groups, objective="penalty_fair_sum"),
    )
    assert capped.replicas == base.replicas and capped.drop_rates == base.drop_rates
    assert capped.objective_value == base.objective_value
    assert sum(base.replicas.values()) == 14  # the CPUs bind: the comparison means something


def test_grant_in_order_and_apply_decision_keep_within_every_resource():
    ms = gpu_models()
    cap = Capacity.of(64, gpus=2)
    out = grant_in_order({"m0": 5, "m1": 5}, {"m0": 1, "m1": 0}, ms, cap, order=["m1", "m0"])
    assert used(ms, out)[GPU] == 2 and out == {"m0": 1, "m1": 1}
    # CPUs alone (the old scalars) would have granted everything
    assert grant_in_order({"m0": 5, "m1": 5}, {"m0": 1, "m1": 0}, ms, 64, None) == {"m0": 5, "m1": 5}
    with pytest.raises(CapacityExceeded, match="3 GPUs"):
        apply_decision(Decision({"m0": 2}), {"m0": 1, "m1": 1}, ms, cap)
    done = apply_decision(Decision({"m0": 2, "m1": 0 + 1}), {"m0": 1, "m1": 1}, ms, Capacity.of(64, gpus=3))
    assert done.targets == {"m0": 2, "m1": 1}


def _idle_obs(ms, cap) -> Observation:
    mo = {
        m.name: ModelObservation(name=m.name, replicas=1, target_replicas=1, arrivals_per_min=np.zeros(5)) for m in ms
    }
    return Observation(now=0.0, capacity_cpus=cap.cpus, capacity_memory_gb=cap.memory_gb, models=mo, capacity=cap)


def test_fairshare_shares_the_scarcest_resource():
    ms = gpu_models(gpus=0.5)
    pol = make_policy("fairshare", ms, ClusterSpec(cpus=64, gpus=3))
    dec = pol.decide(_idle_obs(ms, Capacity.of(64, gpus=3)))
    assert dict(dec.replicas) == {"m0": 3, "m1": 3}  # floor(3 / 2 / 0.5), not 64 / 2


def test_the_observation_of_old_scalars_caps_cpus_and_memory_only():
    o = Observation(now=0.0, capacity_cpus=8, capacity_memory_gb=None, models={})
    assert o.capacity.cpus == 8 and o.capacity.memory_gb is None and math.isinf(o.capacity[GPU])
    full = observe(0.0, Capacity.of(8, 16, gpus=2), None, {}, {}, {})
    assert (full.capacity_cpus, full.capacity_memory_gb, full.capacity[GPU]) == (8, 16, 2)


def short_trace(minutes=20):
    rng = np.random.default_rng(0)
    base = np.array([900.0, 1500.0])[:, None]  # requests/min: several replicas each
    counts = base * (1 + 0.5 * np.sin(np.arange(minutes) / 3.0 + np.arange(2)[:, None]))
    return counts * rng.uniform(0.8, 1.2, counts.shape), np.full((2, 30), base)


@pytest.mark.parametrize(
    "policy", ["faro-fairsum", "faro-sum", "faro-penaltyfairsum", "fairshare", "ray-serve", "aiad"]
)
def test_no_policy_asks_for_more_gpus_in_the_simulator(policy):
    """The simulator checks every decision against every resource (CapacityExceeded)."""
    counts, warm = short_trace()
    ms = gpu_models()
    pol = make_policy(policy, ms, ClusterSpec(cpus=64, gpus=2, moves=True, replan=True))
    res = simulate(counts, ms, pol, SimConfig(capacity_cpus=64, capacity_gpus=2, seed=1), warmup_history=warm)
    assert res.targets.sum(axis=1).max() <= 2
    assert res.summary.job_requests.sum() > 0


def test_the_simulator_refuses_initial_replicas_beyond_the_gpus():
    ms = gpu_models()
    pol = make_policy("fairshare", ms, ClusterSpec(cpus=64))
    with pytest.raises(ValueError, match="GPUs"):
        simulate(np.ones((2, 2)), ms, pol, SimConfig(capacity_cpus=64, capacity_gpus=1))


def test_min_replicas_that_cannot_fit_the_gpus_are_a_config_error():
    ms = gpu_models(min_replicas=2)  # 4 GPUs at least
    with pytest.raises(ValueError, match="need 4 GPUs but the cluster has 3"):
        FaroConfig(cluster=ClusterSpec(cpus=64, gpus=3), models=ms)
    FaroConfig(cluster=ClusterSpec(cpus=64), models=ms)  # GPUs not given: Ray's, checked live
    with pytest.raises(ValueError, match="need 2 accelerator but the cluster has 0"):
        check_minimums_fit(
            [ModelSLO(name=f"m{i}", slo_ms=SLO, resources={"accelerator": 1}) for i in range(2)],
            Capacity.of(64, resources={"accelerator": 0}),
        )
    with pytest.raises(ValueError, match="as cpus/gpus/memory_gb"):
        ClusterSpec(cpus=4, resources={"GPU": 2})


def test_the_live_capacity_is_ray_capped_by_the_config():
    spec = ClusterSpec(cpus=8, gpus=1, resources={"acc": 5})
    ray_has = Capacity.from_mapping({CPU: 16, MEMORY: 4, GPU: 2, "acc": 3}, default=0.0)
    cap = capped_capacity(spec, ray_has)
    assert (cap[CPU], cap[GPU], cap["acc"]) == (8, 1, 3)
    assert cap.memory_gb is None  # Ray reserves no memory for a replica: the config's cap only
    assert cap["tpu"] == 0  # Ray lists no tpu: the cluster has none
    assert capped_capacity(spec.model_copy(update={"memory_gb": 10}), ray_has).memory_gb == 4
    old = capped_capacity(ClusterSpec(cpus=8), (6.0, None))  # an adapter of old: (CPUs, GiB)
    assert (old.cpus, old.memory_gb, math.isinf(old[GPU])) == (6, None, True)


def test_ray_serve_cluster_capacity_reads_every_ray_resource(monkeypatch):
    pytest.importorskip("ray")
    from faro_serve.serving import autoscaler_deployment as ad

    monkeypatch.setattr(
        ad.ray,
        "cluster_resources",
        lambda: {
            "CPU": 4.0,
            "GPU": 1.0,
            "memory": 8 * 2**30,
            "object_store_memory": 2**30,
            "node:10.0.0.1": 1.0,
            "node:__internal_head__": 1.0,
            "accelerator_type:A10G": 1.0,
        },
    )
    cap = ad.RayServeCluster.capacity(None)
    assert cap.limits == {CPU: 4.0, GPU: 1.0, MEMORY: 8.0, "accelerator_type:A10G": 1.0}
    assert cap["anything else"] == 0


def test_a_scenario_with_gpus_simulates_within_them():
    """``simulate --gpus-per-replica 0.5 --capacity-gpus 1``: the models, the policy's cluster
    and the simulated cluster all carry the GPUs."""
    from faro_serve.sim.scenario import Scenario

    sc = Scenario(trace="unused", gpus_per_replica=0.5, capacity_gpus=1.0).validate()
    ms = sc.models(["a", "b"])
    counts, warm = short_trace()
    cfg = sc.sim_config(16, seed=0)
    res = simulate(counts, ms, make_policy("faro-fairsum", ms, sc.cluster(16)), cfg, warmup_history=warm)
    assert res.targets.sum(axis=1).max() <= 2  # 1 GPU / 0.5 per replica, of 16 CPUs
    with pytest.raises(ValueError, match=">= 0"):
        Scenario(trace="unused", capacity_gpus=-1).validate()
