"""InferLine for pipelines (issue 35 item 2): the discrete-event Estimator against the
simulator's queue kernel, the planner against exhaustive search, the tuner on a burst, and
the policy built from the schema. Fast, no Ray."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autoscaler import make_policy
from autoscaler.contract.policy import ModelObservation, Observation, PipelineObservation
from autoscaler.policies.inferline_pipeline import sample_arrivals
from faro_serve.config import Batching, ClusterSpec, ModelSLO
from faro_serve.engine.inferline_plan import StageConfig, StageProfile, batch_times, evaluate, plan
from faro_serve.engine.pipeline_des import StageSpec, simulate
from faro_serve.pipelines import PipelineSLO
from faro_serve.sim.kernels import DONE, advance

SHAPE = Batching(gamma=0.75, eps=0.25, max_batch_size=8)


def _kernel(arr, p, replicas, batch, share):
    """One stage in the simulator's kernel: every request of ``arr`` (sorted), constant
    processing time ``p``, no overhead, no drops, no hold; returns completion times."""
    n = arr.size
    start, lat, status = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
    advance(
        0.0,
        1e9,
        arr,
        np.full(n, p),
        np.zeros(n),
        np.ones(n),
        start,
        lat,
        status,
        0,
        n,
        np.zeros(n + 1, np.int64),
        0,
        0,
        np.zeros(replicas),
        np.zeros(replicas),
        0.0,
        10**9,
        0.0,
        np.inf,
        True,
        batch,
        share * np.arange(65) + 1 - share,
        1.0,
    )
    assert (status == DONE).all()
    return arr + lat


@pytest.mark.parametrize("ra,rb,bb", [(1, 2, 4), (2, 3, 1), (2, 2, 8)])
def test_des_matches_the_simulator_kernel_query_for_query(ra, rb, bb):
    """A 2-stage chain: stage A's completions, sorted, are stage B's arrivals in the
    kernel; the DES does the same inside. Same FIFO rule, same tie-breaking (lowest
    replica), constant service times: the per-query latencies agree exactly."""
    rng = np.random.default_rng(ra * 10 + rb)
    arr = np.sort(rng.uniform(0, 300, 2400))  # 8 queries/s, A near saturation at ra = 1
    pa, pb, share = 0.1, 0.3, SHAPE.share(1.0)
    fa = _kernel(arr, pa, ra, 1, 1.0)
    order = np.argsort(fa, kind="stable")
    fb = np.empty_like(fa)
    fb[order] = _kernel(fa[order], pb, rb, bb, share)
    run = simulate(
        arr,
        [StageSpec("a"), StageSpec("b", (0,))],
        [ra, rb],
        [1, bb],
        [np.array([pa]), pb * (share * np.arange(1, bb + 1) + 1 - share)],
    )
    assert np.allclose(run.latency_s, fb - arr, rtol=0, atol=1e-9)
    assert run.latency_s.max() > 3 * (pa + pb)  # queueing happened: a real check
    if bb > 1:
        assert run.stages["b"].mean_batch > 1.2


def test_des_replica_schedule_matches_the_kernel_with_a_replica_added_midway():
    """A tuner's decisions as a schedule: one replica, a second from t = 100 s (the
    simulator's way: a new replica is free from the end of its cold start). Same latencies
    as the kernel; the same schedule held constant equals plain replicas."""
    rng = np.random.default_rng(5)
    arr = np.sort(rng.uniform(0, 300, 2700))  # 9/s against one replica's 8/s (b = 2)
    share = SHAPE.share(1.0)
    bt = 0.2 * (share * np.arange(1, 3) + 1 - share)
    n = arr.size
    start, lat, status = np.zeros(n), np.zeros(n), np.zeros(n, np.int64)
    advance(
        0.0,
        1e9,
        arr,
        np.full(n, 0.2),
        np.zeros(n),
        np.ones(n),
        start,
        lat,
        status,
        0,
        n,
        np.zeros(n + 1, np.int64),
        0,
        0,
        np.array([0.0, 100.0]),
        np.zeros(2),
        0.0,
        10**9,
        0.0,
        np.inf,
        True,
        2,
        share * np.arange(65) + 1 - share,
        1.0,
    )
    run = simulate(arr, [StageSpec("a")], [1], [2], [bt], schedules=[(np.array([0.0, 100.0]), np.array([1, 2]))])
    assert np.allclose(run.latency_s, lat, atol=1e-9)
    early, late = run.latency_s[arr < 100], run.latency_s[arr > 270]
    assert early.max() > 5 * late.max()  # the queue built before, drained after
    const = simulate(arr, [StageSpec("a")], [2], [2], [bt])
    same = simulate(arr, [StageSpec("a")], [7], [2], [bt], schedules=[(np.array([0.0, 50.0]), np.array([2, 2]))])
    assert np.array_equal(const.latency_s, same.latency_s)


def test_des_conditional_visits_and_fan_out():
    """A -> {B (all), C (30 %)}: C sees about 30 % of the queries, and a query's latency is
    its slowest visited branch."""
    arr = np.arange(0, 200, 0.5)
    st = [StageSpec("a"), StageSpec("b", (0,)), StageSpec("c", (0,), 0.3)]
    run = simulate(arr, st, [1, 1, 1], [1, 1, 1], [np.array([0.05]), np.array([0.1]), np.array([0.2])], seed=3)
    assert abs(run.visits[2].mean() - 0.3) < 0.06
    assert np.allclose(run.latency_s[run.visits[2]], 0.25)
    assert np.allclose(run.latency_s[~run.visits[2]], 0.15)


def _profiles():
    a = StageProfile(StageSpec("a"), {1.0: batch_times(0.02)}, max_replicas=4)
    b = StageProfile(
        StageSpec("b", (0,), 0.6), {c: batch_times(0.12, SHAPE, 1.0, c) for c in (1.0, 2.0)}, max_replicas=4
    )
    return [a, b]


@pytest.mark.parametrize("slo", [0.2, 0.45, 0.9])
def test_planner_finds_the_cheapest_feasible_configuration_of_a_tiny_grid(slo):
    """Exhaustive search over replicas 1..4 x batch 1..8 x {1, 2} CPUs for B (A: 1..4
    replicas) with the same Estimator: the greedy plan meets the SLO at the least cost."""
    rng = np.random.default_rng(7)
    arr = np.sort(rng.uniform(0, 240, 240 * 15))  # 15 queries/s, B sees 9/s
    stages = _profiles()
    got = plan(stages, arr, slo, 99.0)
    assert got.feasible and got.latency_s <= slo
    best = math.inf
    for na, nb, bb, cb in itertools.product(range(1, 5), range(1, 5), (1, 2, 4, 8), (1.0, 2.0)):
        cfg = {"a": StageConfig(na, 1, 1.0), "b": StageConfig(nb, bb, cb)}
        if evaluate(stages, arr, cfg).percentile(99.0) <= slo:
            best = min(best, na * 1.0 + nb * cb)
    assert got.cost == best
    assert evaluate(stages, arr, got.configs).percentile(99.0) == pytest.approx(got.latency_s)


def test_planner_says_infeasible():
    stages = _profiles()
    arr = np.sort(np.random.default_rng(0).uniform(0, 60, 600))
    short = plan(stages, arr, 0.07)  # 20 ms + B's 60 ms alone on 2 CPUs
    assert not short.feasible and "longest path" in short.reason
    flood = plan(stages, np.sort(np.random.default_rng(0).uniform(0, 60, 60 * 400)), 0.45)
    assert not flood.feasible and "max_replicas" in flood.reason


def _pipeline(**b_extra):
    return PipelineSLO(
        name="p",
        slo_ms=600,
        stages=[
            {"name": "A", "processing_ms": 20, "max_replicas": 20},
            {"name": "B", "after": ["A"], "processing_ms": 60, "max_replicas": 20, **b_extra},
        ],
    )


def _obs(now, pipe_rate, targets, singles=None, minutes=20, cap=64.0):
    ms = {
        n: ModelObservation(
            name=n,
            replicas=r,
            target_replicas=r,
            arrivals_per_min=np.full(minutes, 60.0 * pipe_rate),
            arrival_rate=pipe_rate,
        )
        for n, r in targets.items()
    }
    for n, (r, rate) in (singles or {}).items():
        ms[n] = ModelObservation(
            name=n, replicas=r, target_replicas=r, arrivals_per_min=np.full(minutes, 60.0 * rate), arrival_rate=rate
        )
    po = PipelineObservation("p", np.full(minutes, 60.0 * pipe_rate), pipe_rate)
    return Observation(now=now, capacity_cpus=cap, capacity_memory_gb=None, models=ms, pipelines={"p": po})


def test_tuner_scales_the_bottleneck_stage_by_the_envelope():
    """B is 3x slower than A. The plan (t = 0) sizes both; a burst at 2.5x the planned
    rate raises each stage to ceil(r_max s / (mu rho)) (Algorithm 3). The paper's rule
    scales every stage's planned count by r_max / lambda (rho_m = lambda s_m / (n_m mu_m)),
    so B, the bottleneck, gains the most replicas; A, at one replica, would saturate at
    this burst (50/s against its 50/s) and rises too. Quiet again, after the 15 s guard,
    B comes back down (Algorithm 4)."""
    p = _pipeline()
    pol = make_policy("inferline", p.stage_models(), ClusterSpec(cpus=64), pipelines=[p])
    d = pol.decide(_obs(0, 20.0, {"A": 1, "B": 1}))
    n = {"A": 1, "B": 1, **d.replicas}
    assert n["B"] >= 2 * n["A"] and d.info["pipelines"]["p"]["feasible"]
    rho = pol.pstate["p"]["rho"]
    assert pol.decide(_obs(10, 20.0, n)) is None  # the sample's own traffic: no change
    burst = pol.decide(_obs(20, 50.0, n))
    assert burst.kind == "reactive"
    # expected: k_m = ceil(r_max / (mu_m rho_m)), r_max = 50/s (the 10 s window's rate)
    want = {s: math.ceil(50.0 / ((1e3 / t) * rho[s]) - 1e-9) for s, t in (("A", 20), ("B", 60))}
    assert {s: burst.replicas.get(s, n[s]) for s in n} == want
    assert burst.replicas["B"] - n["B"] > want["A"] - n["A"] > 0
    up = {s: burst.replicas.get(s, n[s]) for s in n}
    calm = [pol.decide(_obs(t, 20.0, up)) for t in range(30, 200, 10)]
    downs = [c for c in calm if c is not None]
    assert downs and downs[0].replicas["B"] < up["B"]


def test_tuner_leaves_a_stage_whose_replicas_cover_the_burst():
    """A stage already at or above its k_m (here A, which someone left at 12 replicas) is
    not touched by a scale-up: only the stages below their k_m change (Algorithm 3, lines
    11-13), and no stage scales down in the tick of a scale-up."""
    p = _pipeline()
    pol = make_policy("inferline", p.stage_models(), ClusterSpec(cpus=64), pipelines=[p])
    n = {"A": 1, "B": 1, **pol.decide(_obs(0, 20.0, {"A": 1, "B": 1})).replicas}
    burst = pol.decide(_obs(20, 30.0, {**n, "A": 12}))
    assert "A" not in burst.replicas and burst.replicas["B"] > n["B"]


def test_schema_to_policy_decides_for_stages_and_single_models():
    """make_policy over a pipeline's stage models plus a single model: one decision sets
    all three; the batching stage gets a batch size, the others none."""
    p = _pipeline(batching=SHAPE.model_dump())
    single = ModelSLO(name="solo", slo_ms=720, processing_ms=154)
    pol = make_policy("inferline", [*p.stage_models(), single], ClusterSpec(cpus=64), pipelines=[p])
    d = pol.decide(_obs(0, 30.0, {"A": 5, "B": 1}, singles={"solo": (1, 10.0)}))
    assert set(d.replicas) == {"A", "B", "solo"}
    assert set(d.field("batch_size")) == {"B"} and d.field("batch_size")["B"] >= 1
    assert d.info["pipelines"]["p"]["latency_ms"] <= 600
    state = pol.get_state()
    again = make_policy("inferline", [*p.stage_models(), single], ClusterSpec(cpus=64), pipelines=[p])
    again.set_state(state)
    assert again.pstate == pol.pstate


def test_sample_arrivals_are_poisson_within_each_minute_and_seeded():
    a = sample_arrivals(np.array([3, 0, 5]), 1)
    assert a.size == 8 and np.all(np.diff(a) >= 0) and a[:3].max() < 60 <= a[3:].min()
    assert np.array_equal(a, sample_arrivals(np.array([3, 0, 5]), 1))


def test_tuner_restores_the_plan_when_traffic_returns_after_a_scale_down():
    """After a quiet spell scales B down, traffic back at the sample's rate (not above its
    envelope) brings B back to the planned count: the threshold follows the provisioning
    (the policy's [gap] note; the paper's literal Algorithm 3 would wait for a rate above
    the sample's)."""
    p = _pipeline()
    pol = make_policy("inferline", p.stage_models(), ClusterSpec(cpus=64), pipelines=[p])
    n = {"A": 1, "B": 1, **pol.decide(_obs(0, 20.0, {"A": 1, "B": 1})).replicas}
    cur = dict(n)
    for t in range(10, 300, 10):
        d = pol.decide(_obs(t, 5.0, cur))
        if d is not None:
            cur.update(d.replicas)
    assert cur["B"] < n["B"]
    back = pol.decide(_obs(300, 20.0, cur))
    assert back is not None and back.replicas["B"] == n["B"]


def test_a_pipeline_without_history_is_planned_once_its_first_minute_exists():
    """No minute of entry queries yet: no plan, no change. The first minute, even between
    two scheduled plans, plans the pipeline and its increases are granted."""
    p = _pipeline()
    pol = make_policy("inferline", p.stage_models(), ClusterSpec(cpus=64), pipelines=[p])
    assert pol.decide(_obs(0, 20.0, {"A": 1, "B": 1}, minutes=0)) is None
    d = pol.decide(_obs(60, 20.0, {"A": 1, "B": 1}, minutes=1))
    assert d is not None and d.replicas["B"] > 1 and "p" in pol.pstate


@pytest.mark.parametrize("rate", [6.0, 8.0, 10.0, 12.0, 14.0])
def test_tuner_does_not_flap_under_steady_traffic(rate):
    """Planned at 20 queries/s, then a lower rate with a busy tick every 100 s: the stages
    settle, no stage goes down and then up again (a scale-down never lowers the threshold
    under the live envelope)."""
    p = _pipeline()
    pol = make_policy("inferline", p.stage_models(), ClusterSpec(cpus=64), pipelines=[p])
    cur = {"A": 1, "B": 1, **pol.decide(_obs(0, 20.0, {"A": 1, "B": 1})).replicas}
    moves = {"A": [], "B": []}
    # one busy tick every 100 s: the 120 s envelope still holds it when the 30 s rate of
    # the scale-down no longer does
    for i, t in enumerate(range(10, 900, 10)):
        d = pol.decide(_obs(t, rate * (1.6 if i % 10 == 0 else 1.0), cur))
        for n, r in d.replicas.items() if d is not None else ():
            moves[n].append(r - cur[n])
            cur[n] = r
    for n, m in moves.items():
        signs = [x > 0 for x in m]
        assert signs == sorted(signs, reverse=True), (n, m)  # ups (bursts) before downs only
