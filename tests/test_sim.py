"""The matched simulator: queueing against theory and a reference, conservation, cold start,
tail drop, drop rates, determinism and the capacity guard."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np
import pytest

from autoscaler.contract.policy import Decision, Policy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine.latency import latency_mdc
from faro_serve.sim import NO_OVERHEAD, CapacityExceeded, SimConfig, TimeDist, simulate
from faro_serve.sim.kernels import DONE, DROP_TAIL, PENDING, TIMED_OUT, advance


class Hold(Policy):
    """Never changes anything (a fixed cluster)."""

    name = "hold"

    def decide(self, obs):
        return None


class ScaleOnce(Policy):
    """Sets given targets (and drop rates) at its first tick."""

    name = "scale-once"

    def __init__(self, models, cluster, targets, drops=None):
        super().__init__(models, cluster)
        self.targets, self.drops, self.done = targets, drops or {}, False

    def decide(self, obs):
        if self.done:
            return None
        self.done = True
        return Decision(dict(self.targets), dict(self.drops))


def one_model(p_ms=100.0, max_replicas=100):
    return [ModelSLO(name="m", slo_ms=1000.0, processing_ms=p_ms, max_replicas=max_replicas)]


def run_fixed(c, lam, dist, minutes=60, seed=1, limit=10**6):
    m = one_model(dist.mean * 1e3)
    cfg = SimConfig(
        capacity_cpus=c,
        queue_limit=limit,
        processing=dist,
        router_overhead=NO_OVERHEAD,
        initial_replicas=c,
        seed=seed,
        keep_records=True,
    )
    return simulate(np.full((1, minutes), lam * 60.0), m, Hold(m, ClusterSpec(cpus=c)), cfg)


@pytest.mark.parametrize("c, lam", [(4, 30.0), (10, 80.0)])
def test_mdc_p99_matches_the_engine_estimator(c, lam):
    """Constant processing, Poisson arrivals, fixed replicas: the M/D/c queue the engine models."""
    p = 0.1
    res = run_fixed(c, lam, TimeDist("const", (p,)))
    sim = np.percentile(res.records["latency_s"], 99)
    est = latency_mdc(c, lam, p, 0.99)
    assert sim == pytest.approx(est, rel=0.10), (sim, est)
    # the load is what was asked for
    assert res.records["latency_s"].size == pytest.approx(lam * 3600, rel=0.02)


def test_mm1_sojourn_time_is_exponential():
    """M/M/1: sojourn ~ Exp(mu - lambda), mean 1 / (mu - lambda), p99 ln(100) / (mu - lambda)."""
    res = run_fixed(1, 6.0, TimeDist("expon", (0.0, 0.1)), minutes=120)
    lat = res.records["latency_s"]
    assert lat.mean() == pytest.approx(1 / 4.0, rel=0.05)
    assert np.percentile(lat, 99) == pytest.approx(np.log(100) / 4.0, rel=0.10)


def _reference(arr, proc, ready, limit, hold=0.0):
    """Event-driven FIFO c-server queue with tail drop (heap of departures), for comparison;
    a server takes its next request ``hold`` after a departure."""
    free = list(ready)  # when each server can next start
    heapq.heapify(free)
    queue: deque[int] = deque()
    start = np.full(arr.size, np.nan)
    dropped = np.zeros(arr.size, bool)
    busy: list[float] = []  # departure times of requests in service

    def serve_until(t):
        while queue and free and free[0] <= t:
            f = heapq.heappop(free)
            j = queue.popleft()
            start[j] = max(f, arr[j])
            heapq.heappush(free, start[j] + proc[j] + hold)

    for i, a in enumerate(arr):
        serve_until(a)
        if not queue and free[0] <= a:
            heapq.heappop(free)
            start[i] = a
            heapq.heappush(free, a + proc[i] + hold)
        elif len(queue) >= limit:
            dropped[i] = True
        else:
            queue.append(i)
    serve_until(np.inf)
    del busy
    return start, dropped


@pytest.mark.parametrize("hold", [0.0, 0.02])
def test_kernel_matches_a_reference_queue_across_tick_boundaries(hold):
    rng = np.random.default_rng(7)
    n = 4000
    arr = np.sort(rng.uniform(0, 200, n))  # 20 req/s on 3 servers of mean 0.16 s: overloaded bursts
    proc = rng.lognormal(np.log(0.15), 0.4, n)
    ready = np.array([0.0, 0.0, 30.0])  # the third replica is cold until t = 30
    limit = 5
    ref_start, ref_drop = _reference(arr, proc, ready, limit, hold)
    start = np.full(n, np.nan)
    lat = np.full(n, np.nan)
    status = np.zeros(n, np.int8)
    qbuf = np.zeros(limit, np.int64)
    free_at, busy = ready.copy(), np.full(3, -np.inf)
    nxt, qh, nq, total_arr, total_drop = 0, 0, 0, 0, 0
    for t0, t1 in zip(np.arange(0, 200, 10.0), np.arange(10, 210, 10.0)):
        nxt, qh, nq, a, d, _ = advance(
            t0,
            t1,
            arr,
            proc,
            np.zeros(n),
            np.ones(n),
            start,
            lat,
            status,
            nxt,
            n,
            qbuf,
            qh,
            nq,
            free_at,
            busy,
            0.0,
            limit,
            hold,
        )
        total_arr += a
        total_drop += d
    advance(
        200.0,
        1e18,
        arr,
        proc,
        np.zeros(n),
        np.ones(n),
        start,
        lat,
        status,
        nxt,
        n,
        qbuf,
        qh,
        nq,
        free_at,
        busy,
        0.0,
        limit,
        hold,
    )
    assert total_arr == n
    assert np.array_equal(status == DROP_TAIL, ref_drop) and ref_drop.sum() > 0
    assert not (status == PENDING).any()
    served = status == DONE
    assert np.allclose(start[served], ref_start[served])
    assert np.allclose(lat[served], start[served] - arr[served] + proc[served])
    assert total_drop == ref_drop.sum()


def test_replica_hold_lowers_the_service_rate_of_a_saturated_queue():
    """Back to back on one replica, each request holds it for processing + hold: queued
    requests of 0.1 s leave 0.12 s apart with a 20 ms hold, and the hold shows in the latency
    only through the wait (an idle replica answers in processing + overhead)."""
    m = one_model(100.0)
    counts = np.zeros((1, 3))
    counts[0, 0] = 900.0  # 15 req/s on a 0.1 s replica: a queue from the start
    ends = {}
    for hold in (0.0, 0.02):
        cfg = SimConfig(
            capacity_cpus=1,
            processing=TimeDist("const", (0.1,)),
            router_overhead=NO_OVERHEAD,
            queue_limit=10**6,
            replica_hold_s=hold,
            seed=2,
            keep_records=True,
        )
        rec = simulate(counts, m, Hold(m, ClusterSpec(cpus=1)), cfg).records
        done = np.sort(rec["arrival_s"] + rec["latency_s"])
        gaps = np.diff(done)
        backlog = gaps[gaps < 0.1 + hold + 1e-9]  # consecutive services with a queue
        assert backlog.size > 10 and np.allclose(backlog, 0.1 + hold)
        ends[hold] = rec["latency_s"].min()
    assert ends[0.0] == pytest.approx(0.1) and ends[0.02] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="replica hold"):
        SimConfig(capacity_cpus=1, replica_hold_s=float("nan"))


def test_conservation_every_arrival_is_served_or_dropped():
    m = [ModelSLO(name=f"j{i}", slo_ms=720, processing_ms=154) for i in range(3)]
    counts = np.array([[600.0] * 10, [200.0] * 10, [1500.0] * 10])  # j2 overloaded on 2 replicas
    cfg = SimConfig(capacity_cpus=6, seed=3, keep_records=True)
    res = simulate(counts, m, ScaleOnce(m, ClusterSpec(cpus=6), {"j0": 2, "j1": 2, "j2": 2}), cfg)
    rec = res.records
    n = int(res.summary.job_requests.sum())
    assert rec["latency_s"].size == n
    # the realised Poisson counts are what arrived
    assert n == pytest.approx(counts.sum(), rel=0.02)
    served = ~rec["dropped"]
    assert np.all(np.isfinite(rec["latency_s"][served]))
    assert served.sum() + rec["dropped"].sum() == n
    assert res.summary.job_dropped[2] > 0 and res.summary.job_dropped[1] == 0


def test_cold_start_delays_new_replicas():
    m = one_model(100.0)
    cfg = SimConfig(
        capacity_cpus=5,
        processing=TimeDist("const", (0.1,)),
        router_overhead=NO_OVERHEAD,
        cold_start_s=60.0,
        queue_limit=10**6,
        keep_records=True,
    )
    res = simulate(np.full((1, 3), 30 * 60.0), m, ScaleOnce(m, ClusterSpec(cpus=5), {"m": 5}), cfg)
    t = res.tick_times
    assert res.targets[0, 0] == 5
    assert np.all(res.serving[(t > 0) & (t < 60), 0] == 1)
    assert np.all(res.serving[t >= 60, 0] == 5)
    rec = res.records
    start = rec["arrival_s"] + rec["latency_s"] - 0.1
    early = np.sort(start[start < 60.0])
    # one replica: services before t = 60 never overlap
    assert np.all(np.diff(early) >= 0.1 - 1e-9)
    late = np.sort(start[(start >= 70.0) & (start < 120.0)])
    assert np.any(np.diff(late) < 0.1 - 1e-9)  # several replicas at once after the cold start
    # 30 req/s on one 0.1 s replica is 3x overload: latency grows until the replicas arrive
    assert rec["latency_s"][rec["arrival_s"] < 60].max() > 10.0


def test_the_simulated_arrival_rate_is_the_live_meters_ten_second_window():
    """faro_serve.measures.ARRIVAL_RATE_S: with 5 s ticks a step from 0 to 6/s shows as 3/s
    at its first tick and 6/s at the next (the live meter's 10 s, the seconds before the
    start idle); with 10 s ticks (the default) or longer, the last tick's count over it."""
    from faro_serve.sim.rates import TickRates

    r = TickRates()
    assert [r.rate("a", 5.0, n) for n in (30, 30, 30, 0)] == [3.0, 6.0, 6.0, 3.0]
    assert [r.rate("b", 10.0, n) for n in (60, 20)] == [6.0, 2.0]
    assert r.rate("c", 30.0, 90) == 3.0 and r.rate("c", 0.0, 5) == 0.0
    assert [r.rate("d", 4.0, n) for n in (8, 8, 8, 8)] == [0.8, 1.6, 2.0, 2.0]  # 12 s span / 12


class RecordRates(Policy):
    """Changes nothing; records the arrival rate each 5 s tick observes."""

    name = "record-rates"

    def __init__(self, models, cluster):
        super().__init__(models, cluster)
        self.tick_s, self.seen = 5.0, {}

    def decide(self, obs):
        self.seen[obs.now] = obs.models["m"].arrival_rate
        return None


def test_a_step_in_load_reaches_the_simulated_policy_as_the_live_meters_see_it():
    """0 then 10 requests/s from minute 1, 5 s ticks: the policy sees 5/s at 65 s (the live
    meter's 10 s window holds 5 s of load) and 10/s from 70 s; the last tick's count alone
    would show 10/s at 65 s already."""
    m = one_model(10.0)
    pol = RecordRates(m, ClusterSpec(cpus=2))
    cfg = SimConfig(capacity_cpus=2, processing=TimeDist("const", (0.01,)), router_overhead=NO_OVERHEAD)
    simulate(np.array([[0.0, 600.0, 600.0]]), m, pol, cfg)
    assert pol.seen[60.0] == 0.0
    assert pol.seen[65.0] == pytest.approx(5.0, abs=1.0)
    assert pol.seen[70.0] == pytest.approx(10.0, abs=1.5) and pol.seen[90.0] == pytest.approx(10.0, abs=1.5)


def test_tail_drop_at_the_queue_limit_and_drop_rates():
    m = one_model(100.0)
    cfg = SimConfig(
        capacity_cpus=1,
        processing=TimeDist("const", (0.1,)),
        router_overhead=NO_OVERHEAD,
        queue_limit=50,
        keep_records=True,
    )
    res = simulate(np.full((1, 2), 20 * 60.0), m, Hold(m, ClusterSpec(cpus=1)), cfg)
    lat = res.records["latency_s"][~res.records["dropped"]]
    # never more than 50 waiting: wait <= 50 services, plus its own
    assert lat.max() <= 51 * 0.1 + 1e-9
    assert res.summary.job_dropped[0] == pytest.approx(0.5 * res.summary.job_requests[0], rel=0.1)
    # a 30 % drop rate on a lightly loaded model drops about 30 % at random
    cfg = SimConfig(capacity_cpus=1, seed=2, keep_records=True)
    res = simulate(np.full((1, 5), 120.0), m, ScaleOnce(m, ClusterSpec(cpus=1), {}, {"m": 0.3}), cfg)
    assert res.summary.job_dropped[0] / res.summary.job_requests[0] == pytest.approx(0.3, abs=0.05)


def test_same_seed_same_run_other_seed_other_run():
    m = [ModelSLO(name=f"j{i}", slo_ms=720, processing_ms=154) for i in range(2)]
    counts = np.array([[300.0, 900.0, 400.0], [100.0, 50.0, 800.0]])

    def go(seed):
        pol = ScaleOnce(m, ClusterSpec(cpus=4), {"j0": 2, "j1": 2})
        return simulate(counts, m, pol, SimConfig(capacity_cpus=4, seed=seed, keep_records=True))

    a, b, c = go(5), go(5), go(6)
    assert np.array_equal(a.records["latency_s"], b.records["latency_s"])
    assert np.array_equal(a.table.p_all, b.table.p_all, equal_nan=True)
    assert a.summary.lost_cluster_utility == b.summary.lost_cluster_utility
    assert not np.array_equal(a.table.requests, c.table.requests)


def test_a_decision_above_capacity_raises():
    m = [ModelSLO(name=f"j{i}", slo_ms=720, processing_ms=154) for i in range(2)]
    pol = ScaleOnce(m, ClusterSpec(cpus=4), {"j0": 3, "j1": 2})
    with pytest.raises(CapacityExceeded, match="asked for 5 CPUs"):
        simulate(np.full((2, 2), 60.0), m, pol, SimConfig(capacity_cpus=4))
    bad = ScaleOnce(m, ClusterSpec(cpus=4), {"nope": 1})
    with pytest.raises(ValueError, match="unknown models"):
        simulate(np.full((2, 2), 60.0), m, bad, SimConfig(capacity_cpus=4))


def test_targets_are_clamped_to_model_bounds():
    m = [ModelSLO(name="a", slo_ms=720, processing_ms=154, min_replicas=2, max_replicas=3)]
    res = simulate(np.full((1, 1), 60.0), m, ScaleOnce(m, ClusterSpec(cpus=10), {"a": 9}), SimConfig(capacity_cpus=10))
    assert res.targets[0, 0] == 3
    res = simulate(np.full((1, 1), 60.0), m, ScaleOnce(m, ClusterSpec(cpus=10), {"a": 0}), SimConfig(capacity_cpus=10))
    assert res.targets[0, 0] == 2


def test_initial_replicas_by_model_start_each_model_apart():
    """A mapping starts each model named at its own count (clamped to its bounds), the others
    at their minimum; an int still starts every model alike."""
    m = [ModelSLO(name=n, slo_ms=720, processing_ms=154, max_replicas=4) for n in ("a", "b", "c")]
    res = simulate(
        np.full((3, 1), 60.0),
        m,
        Hold(m, ClusterSpec(cpus=12)),
        SimConfig(capacity_cpus=12, initial_replicas={"a": 3, "b": 9}),
    )
    assert res.serving[0].tolist() == [3, 4, 1] and (res.targets == [3, 4, 1]).all()
    res = simulate(
        np.full((3, 1), 60.0), m, Hold(m, ClusterSpec(cpus=12)), SimConfig(capacity_cpus=12, initial_replicas=2)
    )
    assert res.serving[0].tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match="initial replicas of nope: not models"):
        simulate(
            np.full((3, 1), 60.0),
            m,
            Hold(m, ClusterSpec(cpus=12)),
            SimConfig(capacity_cpus=12, initial_replicas={"nope": 2}),
        )
    with pytest.raises(ValueError, match="initial replicas"):  # beyond the capacity
        simulate(
            np.full((3, 1), 60.0),
            m,
            Hold(m, ClusterSpec(cpus=5)),
            SimConfig(capacity_cpus=5, initial_replicas={"a": 4, "b": 4}),
        )


def test_clients_give_up_after_their_timeout():
    """A client's timeout (a replay's 60 s): a request still queued after it leaves unserved
    and never takes a replica; one answered later than it fails too; the queue stays bounded."""
    n = 600
    arr = np.arange(n) * 0.1  # 10 req/s on one replica of 1 s: hopelessly overloaded
    proc = np.full(n, 1.0)
    start, lat = np.full(n, np.nan), np.full(n, np.nan)
    status = np.zeros(n, np.int8)
    qbuf = np.zeros(n, np.int64)
    free_at, busy = np.zeros(1), np.full(1, -np.inf)
    out = advance(
        0.0,
        1e9,
        arr,
        proc,
        np.zeros(n),
        np.ones(n),
        start,
        lat,
        status,
        0,
        n,
        qbuf,
        0,
        0,
        free_at,
        busy,
        0.0,
        n,
        0.0,
        3.5,
    )
    assert out[2] == 0 and not (status == PENDING).any()
    done = status == DONE
    assert np.all(lat[done] <= 3.5) and np.all(np.isinf(lat[~done]))
    assert np.all(status[~done] == TIMED_OUT) and 0 < done.sum() < n / 10
    # the replica serves one request at a time, and stops when that request's client leaves
    began = ~np.isnan(start)
    order = np.argsort(start[began])
    s0 = start[began][order]
    ends = np.minimum(s0 + 1.0, arr[began][order] + 3.5)
    assert np.all(s0[1:] >= ends[:-1] - 1e-9) and np.all(s0 - arr[began][order] <= 3.5)
    assert np.isclose(s0[-1], ends[-2])  # back to back: no idle replica while clients wait

    # Plain Ray Serve's unbounded queue, overloaded for 10 minutes: with clients that give
    # up after 60 s its backlog (mean ongoing requests) stays about 60 s of arrivals deep.
    m = one_model(200.0)
    runs = {}
    for timeout in (60.0, np.inf):
        cfg = SimConfig(
            capacity_cpus=1,
            queue_limit=10**6,
            processing=TimeDist("const", (0.2,)),
            router_overhead=NO_OVERHEAD,
            client_timeout_s=timeout,
            keep_records=True,
        )
        runs[timeout] = simulate(np.full((1, 10), 600.0), m, Hold(m, ClusterSpec(cpus=1)), cfg)
    waits = runs[60.0].records["latency_s"]
    assert np.nanmax(waits[np.isfinite(waits)]) <= 60.0
    assert runs[60.0].summary.job_dropped.sum() > 0.4 * 6000
    assert runs[np.inf].summary.job_dropped.sum() == 0
    with pytest.raises(ValueError, match="client timeout"):
        SimConfig(capacity_cpus=1, client_timeout_s=0)

    # a server that does not notice (plain Ray Serve, live): the replica serves the given-up
    # requests anyway, back to back, and almost nothing is answered in time
    n = 600
    start, lat = np.full(n, np.nan), np.full(n, np.nan)
    status = np.zeros(n, np.int8)
    advance(
        0.0,
        1e9,
        arr,
        proc,
        np.zeros(n),
        np.ones(n),
        start,
        lat,
        status,
        0,
        n,
        np.zeros(n, np.int64),
        0,
        0,
        np.zeros(1),
        np.full(1, -np.inf),
        0.0,
        n,
        0.0,
        3.5,
        False,
    )
    assert np.all(~np.isnan(start))  # every request took the replica, one second each
    assert np.allclose(np.diff(np.sort(start)), 1.0)
    assert (status == DONE).sum() <= 3 < (status == TIMED_OUT).sum()
