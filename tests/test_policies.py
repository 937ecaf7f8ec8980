"""Baseline and seed-system policies: their rules on hand-made observations, and every
registered policy on a short trace in the simulator without ever exceeding capacity."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import with_batching

from autoscaler import make_policy, policy_names
from autoscaler.catalogue.registry import needs_batching
from autoscaler.contract.policy import ModelObservation, Observation
from autoscaler.policies.common import max_rate_one_replica
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine.latency import latency_mdc, min_replicas_for_slo
from faro_serve.sim import SimConfig, simulate
from forecasting.base import Forecast

SLO = 720.0
EXPECTED = {
    "fairshare",
    "oneshot",
    "aiad",
    "mark",
    "ray-serve",
    "swayam",
    "inferline",
    "infaas",
    "oracle",
    "faro-sum",
    "faro-fair",
    "faro-fairsum",
    "faro-penaltysum",
    "faro-penaltyfairsum",
}


def models(n=2, **kw):
    return [ModelSLO(name=f"m{i}", slo_ms=SLO, processing_ms=154, **kw) for i in range(n)]


def obs(now, per_model, cap=10.0, minutes=20):
    """per_model: name -> dict of ModelObservation fields (defaults: 1 replica, idle)."""
    out = {}
    for n, f in per_model.items():
        f = dict(f)
        f.setdefault("replicas", 1)
        f.setdefault("target_replicas", f["replicas"])
        f.setdefault("arrivals_per_min", np.full(minutes, 60.0 * f.get("arrival_rate", 0.0)))
        out[n] = ModelObservation(name=n, **f)
    return Observation(now=now, capacity_cpus=cap, capacity_memory_gb=None, models=out)


def test_every_policy_is_registered():
    assert EXPECTED <= set(policy_names())
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope", models(), ClusterSpec(cpus=4))


def test_fairshare_is_floor_capacity_over_jobs_once():
    ms = models(10)
    pol = make_policy("fairshare", ms, ClusterSpec(cpus=36))
    d = pol.decide(obs(0, {m.name: {} for m in ms}, cap=36))
    assert d.replicas == {m.name: 3 for m in ms}
    assert pol.decide(obs(10, {m.name: {"replicas": 3} for m in ms}, cap=36)) is None


def test_aiad_adds_after_30s_overloaded_and_removes_after_5min_underloaded():
    ms = models(1)
    pol = make_policy("aiad", ms, ClusterSpec(cpus=10))
    hot = {"m0": {"replicas": 2, "latency_ms": 900.0}}
    assert [pol.decide(obs(t, hot)) for t in (0, 10, 20)] == [None, None, None]
    assert pol.decide(obs(30, hot)).replicas == {"m0": 3}
    assert pol.decide(obs(40, {"m0": {"replicas": 2, "target_replicas": 3, "latency_ms": 900.0}})) is None
    cool = {"m0": {"replicas": 3, "latency_ms": 300.0}}
    for t in range(50, 340, 10):
        assert pol.decide(obs(t, cool)) is None, t
    assert pol.decide(obs(350, cool)).replicas == {"m0": 2}


def test_oneshot_scales_in_proportion_to_latency_over_slo():
    ms = models(1)
    pol = make_policy("oneshot", ms, ClusterSpec(cpus=20))
    hot = {"m0": {"replicas": 3, "latency_ms": 2.5 * SLO}}
    for t in (0, 10, 20):
        pol.decide(obs(t, hot, cap=20))
    assert pol.decide(obs(30, hot, cap=20)).replicas == {"m0": math.ceil(3 * 2.5)}
    pol = make_policy("oneshot", ms, ClusterSpec(cpus=20))
    cool = {"m0": {"replicas": 8, "latency_ms": 0.3 * SLO}}
    for t in range(0, 300, 10):
        assert pol.decide(obs(t, cool, cap=20)) is None
    assert pol.decide(obs(300, cool, cap=20)).replicas == {"m0": math.ceil(8 * 0.3)}


def test_increases_are_granted_first_come_first_served_within_capacity():
    ms = models(2)
    pol = make_policy("aiad", ms, ClusterSpec(cpus=3))
    hot = {"replicas": 1, "latency_ms": 2000.0}
    pol.decide(obs(0, {"m0": hot, "m1": {"replicas": 1}}, cap=3))  # m0 overloaded first
    for t in (10, 20):
        pol.decide(obs(t, {"m0": hot, "m1": hot}, cap=3))
    d = pol.decide(obs(30, {"m0": hot, "m1": hot}, cap=3))
    assert d.replicas == {"m0": 2}  # only one free replica: the first marked gets it


def test_ray_serve_default_formula_and_delays():
    ms = models(1)
    pol = make_policy("ray-serve", ms, ClusterSpec(cpus=50))
    busy = {"m0": {"replicas": 2, "ongoing_per_replica": 10.0}}  # 20 ongoing -> 20 / 2 = 10
    assert [pol.decide(obs(t, busy, cap=50)) for t in (0, 10, 20)] == [None, None, None]
    assert pol.decide(obs(30, busy, cap=50)).replicas == {"m0": 10}
    quiet = {"m0": {"replicas": 10, "ongoing_per_replica": 0.3}}  # 3 ongoing -> ceil(1.5) = 2
    for t in range(40, 640, 10):
        assert pol.decide(obs(t, quiet, cap=50)) is None, t
    assert pol.decide(obs(640, quiet, cap=50)).replicas == {"m0": 2}


def test_ray_serve_keeps_its_target_pending_until_capacity_frees():
    ms = models(3)
    pol = make_policy("ray-serve", ms, ClusterSpec(cpus=8))
    busy = {"replicas": 1, "ongoing_per_replica": 20.0}
    idle = {"replicas": 6, "ongoing_per_replica": 0.0}
    for t in range(0, 40, 10):  # m0 and m1 want 10 each after Ray's 30 s upscale delay
        assert pol.decide(obs(t, {"m0": busy, "m1": busy, "m2": idle}, cap=8)) is None
    # m2 idles at 6 replicas: after Ray's 600 s downscale delay it gives 5 back, and the two
    # pending targets take them one replica each in turn (the older wish first), as Ray
    # placed freed CPUs among several deployments' pending replicas live
    t, d = 40, None
    while d is None and t <= 700:
        d = pol.decide(obs(t, {"m0": busy, "m1": busy, "m2": idle}, cap=8))
        t += 10
    assert t > 600 and d.replicas == {"m0": 4, "m1": 3, "m2": 1}


def test_ray_serve_gives_free_capacity_to_a_new_wish_at_once():
    """Ray starts a replica as soon as its request finds room: the first wish of a tick
    takes what is free (first come first served), not a share."""
    ms = models(3)
    pol = make_policy("ray-serve", ms, ClusterSpec(cpus=10))
    busy = {"replicas": 1, "ongoing_per_replica": 20.0}
    state = {"m0": busy, "m1": busy, "m2": {"replicas": 4, "ongoing_per_replica": 0.0}}
    for t in range(0, 30, 10):
        assert pol.decide(obs(t, state, cap=10)) is None
    assert pol.decide(obs(30, state, cap=10)).replicas == {"m0": 5}  # 4 free CPUs, all to m0


def test_ray_serve_takes_each_models_own_autoscaling_config():
    """per_model: each model under its own Ray settings (whatif's as-run cluster), the others
    under the policy's; the policy ticks at the shortest metrics interval, and a model with
    a longer one samples only that often."""
    from autoscaler.policies.ray_rule import RayServePolicy

    ms = models(3)
    pol = RayServePolicy(
        ms,
        ClusterSpec(cpus=50),
        per_model={
            "m1": {
                "target_ongoing_requests": 1,
                "upscale_delay_s": 4,
                "downscale_delay_s": 20,
                "metrics_interval_s": 2,
                "upscaling_factor": None,
            },
            "m2": {"metrics_interval_s": 8},
        },
    )
    assert pol.tick_s == 2 and pol.rules["m0"].target_ongoing_requests == 2.0
    busy = {n: {"replicas": 2, "ongoing_per_replica": 5.0} for n in ("m0", "m1", "m2")}  # 10 ongoing
    seen = {}
    for t in range(0, 32, 2):
        d = pol.decide(obs(t, busy, cap=50))
        for n, r in (d.replicas if d else {}).items():
            seen.setdefault(n, (t, r))
    # m1: 10 / 1 = 10 replicas after its 4 s delay; m0 and m2: 10 / 2 = 5 after Ray's 30 s
    assert seen == {"m1": (4, 10), "m0": (30, 5), "m2": (30, 5)}
    assert [t for t, _ in pol.samples["m2"]] == [8, 16, 24] and len(pol.samples["m1"]) == 15
    quiet = {n: {"replicas": r, "ongoing_per_replica": 0.1} for n, r in (("m0", 5), ("m1", 10), ("m2", 5))}
    downs = {}
    for t in range(32, 700, 2):
        d = pol.decide(obs(t, quiet, cap=50))
        for n in d.replicas if d else {}:
            downs.setdefault(n, t)
    assert downs["m1"] < 32 + 20 + 12 < 600 < downs["m0"]  # its own 20 s (plus the 10 s look-back)
    with pytest.raises(ValueError, match="not models of the policy"):
        RayServePolicy(ms, ClusterSpec(cpus=50), per_model={"nope": {}})
    with pytest.raises(ValueError, match="m0: min_replicas is not a setting"):
        RayServePolicy(ms, ClusterSpec(cpus=50), per_model={"m0": {"min_replicas": 1}})


def test_mark_provisions_the_forecast_peak_at_one_replica_capacity():
    class Const:
        input_size, horizon = 15, 7

        def predict(self, history, n_samples=100, seed=None):
            names = list(history)
            return Forecast(names, np.full((len(names), 4, 7), 12.0), {n: "const" for n in names})

    ms = models(1)
    pol = make_policy("mark", ms, ClusterSpec(cpus=50), forecaster=Const())
    d = pol.decide(obs(0, {"m0": {}}, cap=50))
    r1 = max_rate_one_replica(0.154, 0.72, 0.99)
    assert latency_mdc(1, r1, 0.154, 0.99) == pytest.approx(0.72, rel=1e-6)
    assert d.replicas == {"m0": math.ceil(12.0 / r1)}


def test_swayam_sizes_the_burst_padded_rate_and_scales_in_slowly():
    ms = models(1)
    pol = make_policy("swayam", ms, ClusterSpec(cpus=40))
    n_b = min_replicas_for_slo(2 * 10.0, 0.154, 0.72, 0.99)[0]
    d = None
    for t in range(0, 60, 10):
        d = pol.decide(obs(t, {"m0": {"replicas": 1, "arrival_rate": 10.0}}, cap=40)) or d
    assert d.replicas == {"m0": n_b}
    low = {"m0": {"replicas": n_b, "arrival_rate": 1.0}}
    downs = [t for t in range(60, 1200, 10) if pol.decide(obs(t, low, cap=40)) is not None]
    assert downs and downs[0] >= 60 + 900 - 10  # regulation (10 min) + idle collection (5 min)


def test_infaas_keeps_headroom_and_scales_down_after_load_latency():
    ms = models(1)
    pol = make_policy("infaas", ms, ClusterSpec(cpus=20))
    q = 1 / 0.154
    d = pol.decide(obs(0, {"m0": {"replicas": 1, "arrival_rate": 10.0}}, cap=20))
    assert d.replicas == {"m0": math.ceil(1.05 * 10.0 / q)}
    low = {"m0": {"replicas": 4, "arrival_rate": 5.0}}  # fits 3: headroom 3q/5 >= 1.05
    ds = [pol.decide(obs(t, low, cap=20)) for t in range(10, 90, 10)]
    assert all(x is None for x in ds[:-1]) and ds[-1].replicas == {"m0": 3}  # 70 s >= T_v = 65 s


def test_inferline_plans_then_scales_up_when_the_envelope_exceeds_the_sample():
    ms = models(1)
    pol = make_policy("inferline", ms, ClusterSpec(cpus=40))
    d = pol.decide(obs(0, {"m0": {"replicas": 1, "arrival_rate": 5.0}}, cap=40))
    n = d.replicas["m0"]
    assert n == min_replicas_for_slo(5.0, 0.154, 0.72, 0.99)[0]
    calm = {"m0": {"replicas": n, "arrival_rate": 5.0}}
    assert pol.decide(obs(10, calm, cap=40)) is None
    burst = {"m0": {"replicas": n, "arrival_rate": 15.0}}
    up = pol.decide(obs(20, burst, cap=40))
    assert up is not None and up.replicas["m0"] > n


@pytest.fixture(scope="module")
def short_trace():
    rng = np.random.default_rng(0)
    base = np.array([900.0, 480.0, 500.0, 770.0, 1200.0, 430.0])[:, None]
    counts = base * (1 + 0.4 * np.sin(np.arange(20) / 3.0 + np.arange(6)[:, None])) * rng.uniform(0.8, 1.2, (6, 20))
    return counts, np.full((6, 30), base)


@pytest.mark.parametrize("capacity", [8, 18])
def test_every_policy_runs_and_never_exceeds_capacity(short_trace, capacity):
    """The simulator raises CapacityExceeded on any decision above capacity."""
    counts, warm = short_trace
    ms = [ModelSLO(name=f"j{i}", slo_ms=SLO, processing_ms=154) for i in range(counts.shape[0])]
    lost = {}
    for name in policy_names():  # every registered policy, baselines, seeds and Faro
        mods = with_batching(ms) if needs_batching(name) else ms  # Sponge: a profile each
        pol = make_policy(name, mods, ClusterSpec(cpus=capacity))
        res = simulate(counts, mods, pol, SimConfig(capacity_cpus=capacity, seed=1), warmup_history=warm)
        assert res.targets.sum(axis=1).max() <= capacity
        assert res.summary.job_requests.sum() > 0
        lost[name] = res.summary.lost_cluster_utility
    assert all(0 <= v <= counts.shape[0] for v in lost.values())
    if capacity == 18:  # enough for everyone: the oracle plans with the truth
        assert lost["oracle"] < lost["fairshare"]
