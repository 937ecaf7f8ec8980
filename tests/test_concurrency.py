"""Concurrency per replica (issue 34): a replica of concurrency k is k servers of the measured
processing time, in the estimator, the planner, the policies and the simulator alike
(docs/concurrency.md). Ray-free and fast."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from autoscaler import make_policy
from autoscaler.contract.policy import ModelObservation, Observation
from autoscaler.policies.common import max_rate_one_replica
from bench.concurrency_check import simulated_p99 as bench_p99
from faro_serve.config import Batching, ClusterSpec, ModelSLO
from faro_serve.distributions import PAPER_PROCESSING
from faro_serve.engine import max_rate_for_slo, min_replicas_for_slo, plan
from faro_serve.engine.latency import EST_MDC, latency, latency_relaxed
from faro_serve.engine.window import NO_DROP, step_utility_table
from faro_serve.sim import NO_OVERHEAD, SimConfig, simulate

P = PAPER_PROCESSING.mean  # the paper's ResNet34 on 1 vCPU: near-constant lognormal, 154 ms
Q = 0.99


def simulated_p99(replicas: int, k: int, lam: float, n: int = 100_000, seed: int = 0) -> float:
    """bench.concurrency_check's simulation (the kernel, request by request), checked that
    every request was served."""
    return bench_p99(replicas, k, lam, n, seed)


def test_a_replica_of_concurrency_k_is_k_servers_in_the_simulator():
    """Same draws: 3 replicas serving 4 at once queue exactly as 12 replicas serving one,
    and not as 3 replicas serving one (which cannot keep up with this rate)."""
    lam = 0.8 * 12 / P
    four = simulated_p99(3, 4, lam, n=20_000)
    assert four == simulated_p99(12, 1, lam, n=20_000)
    assert four < 3 * P
    assert simulated_p99(3, 1, lam, n=20_000) > 10 * four


@pytest.mark.parametrize("slo_ms", [450.0, 720.0])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_estimate_for_k_servers_per_replica_holds_in_the_simulator(k, slo_ms):
    """At the rate the estimator says 3 replicas of concurrency k serve within the SLO
    (M/D/(3k)), the simulated p99 is within 15 % of the SLO (measured by
    bench/concurrency_check.py: 0.97-1.12x over SLOs 300-1000 ms, docs/concurrency.md);
    and that rate grows at least k-fold."""
    slo = slo_ms / 1e3
    lam = max_rate_for_slo(3, P, slo, Q, concurrency=k)
    sim = np.mean([simulated_p99(3, k, lam, seed=s) for s in range(2)])
    assert sim == pytest.approx(slo, rel=0.15)
    one = max_rate_for_slo(3, P, slo, Q)
    assert k * one * 0.95 <= lam  # pooling k servers per replica gains, never loses
    if k > 1:  # ignoring the concurrency, 3 servers at this rate are unstable
        assert latency(3, lam, P, Q, 0.95, EST_MDC) > 2 * slo


def test_window_table_column_c_is_the_estimate_for_c_times_k_servers():
    """The planner's utility table, through its own Erlang-B row, at concurrency k: column
    c is the scalar estimator's (relaxed M/D/c) utility at c k servers."""
    rates = np.array([[5.0, 18.0, 40.0], [9.0, 30.0, 55.0]])
    slo = 0.4
    for k in (1, 2, 4):
        table = step_utility_table(rates, P, Q, slo, 1.0, 0.95, EST_MDC, 12, NO_DROP, k=k)
        for t in range(rates.shape[1]):
            for c in range(1, 13):
                lat = [latency_relaxed(c * k, lam, P, Q, 0.95) for lam in rates[:, t]]
                u = np.mean([1.0 if x <= slo else (slo / x if np.isfinite(x) else 0.0) for x in lat])
                assert table[0, t, c] == pytest.approx(u, abs=1e-9)


def test_k1_is_the_paper_model():
    """Concurrency 1 (the default) is exactly the one-at-a-time M/D/c of the paper: the
    replica-facing helpers agree with the estimator at c servers."""
    assert ModelSLO(name="m", slo_ms=720).concurrency == 1
    lam, slo = 30.0, 0.72
    n, lat = min_replicas_for_slo(lam, P, slo, Q)
    assert n == min_replicas_for_slo(lam, P, slo, Q, concurrency=1)[0]
    assert latency(n, lam, P, Q, 0.95, EST_MDC) <= slo < latency(n - 1, lam, P, Q, 0.95, EST_MDC)
    assert max_rate_for_slo(4, P, slo, Q) == max_rate_for_slo(4, P, slo, Q, concurrency=1)
    assert max_rate_one_replica(P, slo, Q) == max_rate_one_replica(P, slo, Q, 1)


def _plan(k: int, rate: float, slo_ms: float = 720.0) -> tuple[int, float]:
    m = ModelSLO(name="m", slo_ms=slo_ms, processing_ms=P * 1e3, max_replicas=100, concurrency=k)
    d = plan([m], {"m": rate}, {"m": 1}, ClusterSpec(cpus=200, cold_start_s=0.0)).decisions[0]
    return d.replicas, d.latency_ms


@pytest.mark.parametrize("rate", [20.0, 60.0, 150.0])
def test_planner_asks_about_k_times_fewer_replicas(rate):
    """The same load needs the same servers: ceil(n / k) replicas of concurrency k, give or
    take one, never fewer servers than at k = 1, each plan's estimated latency within the SLO."""
    n1, lat1 = _plan(1, rate)
    assert lat1 <= 720.0 and n1 >= 4
    for k in (2, 4):
        nk, latk = _plan(k, rate)
        assert latk <= 720.0
        assert math.ceil(n1 / k) - 1 <= nk <= math.ceil(n1 / k) + 1, (k, n1, nk)
        assert nk * k >= n1


def test_replica_level_helpers_divide_by_k():
    lam, slo = 60.0, 0.72
    n1, _ = min_replicas_for_slo(lam, P, slo, Q)
    for k in (2, 4, 8):
        nk, lat = min_replicas_for_slo(lam, P, slo, Q, concurrency=k)
        assert nk == math.ceil(n1 / k) and lat <= slo
        assert max_rate_one_replica(P, slo, Q, k) == pytest.approx(
            max_rate_for_slo(1, P, slo, Q, concurrency=k), rel=1e-3
        )


@pytest.mark.parametrize("name", ["faro-fairsum", "mark", "swayam", "infaas", "inferline"])
def test_policies_size_replicas_of_concurrency_k(name):
    """Every policy that models one replica's rate asks about k times fewer replicas of
    concurrency k for 60 req/s (at most ceil(n1 / k) + 1), never fewer servers than the
    offered load (60 req/s x 154 ms = 9.2)."""
    asks = {}
    for k in (1, 2, 4):
        m = [ModelSLO(name="m", slo_ms=720, processing_ms=154, max_replicas=64, concurrency=k)]
        obs = Observation(
            now=10.0,
            capacity_cpus=64,
            capacity_memory_gb=None,
            models={
                "m": ModelObservation(
                    name="m",
                    replicas=1,
                    target_replicas=1,
                    arrival_rate=60.0,
                    processing_ms=154.0,
                    arrivals_per_min=np.full(20, 3600.0),
                )
            },
        )
        asks[k] = make_policy(name, m, ClusterSpec(cpus=64)).decide(obs).replicas["m"]
    assert asks[1] >= 10
    for k in (2, 4):
        assert asks[k] * k * 1.0 / 0.154 > 60.0, asks
        assert asks[k] <= math.ceil(asks[1] / k) + 1, asks


def test_batching_with_concurrency_is_refused_with_a_reason():
    with pytest.raises(ValidationError, match="concurrency 4 with batching"):
        ModelSLO(name="m", slo_ms=720, concurrency=4, batching=Batching(gamma=0.1, eps=0.05))
    ModelSLO(name="m", slo_ms=720, concurrency=4)
    ModelSLO(name="m", slo_ms=720, batching=Batching(gamma=0.1, eps=0.05))


def _simulated_faro(k: int, rate: float, minutes: int = 20):
    m = [ModelSLO(name="m", slo_ms=400, processing_ms=P * 1e3, max_replicas=64, concurrency=k)]
    cluster = ClusterSpec(cpus=64, cold_start_s=20.0)
    cfg = SimConfig(capacity_cpus=64, cold_start_s=20.0, router_overhead=NO_OVERHEAD, seed=1)
    res = simulate(np.full((1, minutes), rate * 60.0), m, make_policy("faro-fairsum", m, cluster), cfg)
    return res


def test_simulated_faro_meets_the_slo_with_a_quarter_of_the_replicas_at_concurrency_4():
    """Faro in the simulator, 100 req/s for 20 min, p99 SLO 400 ms: replicas of concurrency
    4 meet the SLO (at most 1 % of requests over it or dropped, once the first plan's
    replicas serve) as replicas of concurrency 1 do, with about a quarter of them."""
    one, four = _simulated_faro(1, 100.0), _simulated_faro(4, 100.0)
    settle = slice(len(one.tick_times) // 2, None)
    r1 = float(np.median(one.serving[settle, 0]))
    r4 = float(np.median(four.serving[settle, 0]))
    assert r1 >= 12  # the load really needs many servers
    assert r1 / 4 - 1 <= r4 <= r1 / 4 + 1, (r1, r4)
    for res in (one, four):
        t = res.table
        late = t.over_slo[0, 5:].sum() + t.dropped[0, 5:].sum()
        assert late <= 0.01 * t.requests[0, 5:].sum(), (res.serving[:, 0], late)
