"""The simulator for batching models: Sponge's own setting (EuroMLSys '24, section 4; issue 20).

One model behind an EDF queue, served in dynamic batches by replicas whose cores a policy
may change every tick (in-place vertical scaling, Sponge's premise: a change is instant and
costs no cold start). Requests come from clients over a network whose bandwidth varies
second by second, so each request reaches the server with its own remaining budget: the
SLO minus its network time. The policy is any :class:`~autoscaler.contract.policy.Policy` (Sponge,
or a static allocation); it sees what a batching front reports (the arrival rate, the
remaining budgets of the queued requests, the cores and batch in force) through the one
policy interface, and returns cores and batch sizes in its :class:`Decision`.

The network: Sponge evaluates on 4G/LTE bandwidth logs (0.5-7 MB/s within 10 minutes, its
Figure 1), which are not available here. :func:`bandwidth_trace` draws a stand-in with the
same range: the log of the bandwidth follows a mean-reverting random walk, one value per
second, clipped to [0.5, 7] MB/s. A request of ``payload_mb`` sent at second ``s`` spends
``payload_mb / bandwidth[s] + rtt_s`` on the network.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoscaler.contract.policy import Policy
from autoscaler.contract.setting import Setting, largest_batch
from autoscaler.driving import driver
from autoscaler.driving.driver import MeterSnapshot, apply_decision, observe
from faro_serve.engine.batching import BatchProfile

from .batched import advance_batched
from .kernels import DONE


def bandwidth_trace(
    seconds: int,
    seed: int = 0,
    lo: float = 0.5,
    hi: float = 7.0,
    mean: float = 2.0,
    reversion: float = 0.05,
    sigma: float = 0.25,
) -> np.ndarray:
    """MB/s per second: ``log b`` mean-reverting to ``log mean`` at ``reversion`` per second
    with noise ``sigma``, clipped to ``[lo, hi]``."""
    rng = np.random.default_rng(seed)
    x = np.empty(seconds)
    v, mu = math.log(mean), math.log(mean)
    for s in range(seconds):
        v += reversion * (mu - v) + sigma * rng.standard_normal()
        v = min(max(v, math.log(lo)), math.log(hi))
        x[s] = math.exp(v)
    return x


@dataclass(frozen=True)
class BatchedSetting:
    """Sponge's evaluation setting (section 4), with its defaults."""

    profile: BatchProfile
    slo_s: float = 1.0
    rate: float = 20.0  # requests/s, a fixed rate (the paper's workload generator)
    duration_s: int = 600
    poisson: bool = False  # True: Poisson arrivals at ``rate`` instead of evenly spaced
    payload_mb: float = 0.2  # a 200 KB image (the paper's Figure 1)
    rtt_s: float = 0.02
    bandwidth_mean: float = 2.0  # MB/s, the walk's centre
    jitter_sigma: float = 0.05  # lognormal noise of a batch's service time
    queue_limit: int = 100_000
    replicas: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if not (self.slo_s > 0 and self.rate > 0 and self.duration_s >= 1 and self.replicas >= 1):
            raise ValueError("slo_s, rate, duration_s and replicas must be positive")


@dataclass
class BatchedResult:
    policy: str
    slo_violation_rate: float  # answered after the SLO, or dropped, over all requests
    mean_cores: float  # time-average of the cores allocated (all replicas) while requests come
    p99_ms: float
    requests: int
    dropped: int
    cores: np.ndarray  # per tick, all replicas
    batch: np.ndarray  # per tick
    network_s: np.ndarray  # per request
    latency_s: np.ndarray  # per request (inf: dropped)

    def to_dict(self) -> dict:
        return {
            "policy": self.policy,
            "slo_violation_rate": self.slo_violation_rate,
            "mean_cores": self.mean_cores,
            "p99_ms": self.p99_ms,
            "requests": self.requests,
            "dropped": self.dropped,
        }


def workload(setting: BatchedSetting) -> tuple[np.ndarray, np.ndarray]:
    """(send instants, network seconds) of every request, in send order."""
    rng = np.random.default_rng(setting.seed + 1)
    n = int(setting.rate * setting.duration_s)
    if setting.poisson:
        send = np.cumsum(rng.exponential(1 / setting.rate, n))
        send = send[send < setting.duration_s]
    else:
        send = np.arange(n) / setting.rate
    bw = bandwidth_trace(setting.duration_s + 1, setting.seed, mean=setting.bandwidth_mean)
    net = setting.payload_mb / bw[send.astype(int)] + setting.rtt_s
    return send, net


def simulate_batched(setting: BatchedSetting, policy: Policy, name: str | None = None) -> BatchedResult:
    """Run ``policy`` every ``policy.tick_s`` on Sponge's setting (its first decision at 0 s,
    told the setting's rate); see the module docstring."""
    name = name or policy.models[0].name
    send, net = workload(setting)
    arr = send + net  # reaching the server
    order = np.argsort(arr, kind="stable")
    arr, net = arr[order], net[order]
    n = arr.size
    deadline = arr - net + setting.slo_s  # = send + SLO
    rng = np.random.default_rng(setting.seed + 2)
    jitter = rng.lognormal(-(setting.jitter_sigma**2) / 2, setting.jitter_sigma, n)
    start, lat = np.full(n, np.nan), np.full(n, np.nan)
    status = np.zeros(n, dtype=np.int64)
    hkey, hidx = np.empty(n + 1), np.empty(n + 1, dtype=np.int64)
    free_at = np.zeros(setting.replicas)
    prof = np.array([setting.profile.gamma, setting.profile.eps, setting.profile.delta, setting.profile.eta])
    cores, batch = 1.0, 1
    tick = float(policy.tick_s)
    end = float(setting.duration_s) + setting.slo_s * 10
    ticks = int(math.ceil(end / tick))
    cores_log, batch_log = np.zeros(ticks), np.zeros(ticks, dtype=int)
    nxt, nq, dropped = 0, 0, 0

    model = next((m for m in policy.models if m.name == name), None)
    if model is None or largest_batch(model) <= 1:
        raise ValueError(
            f"the batched simulator runs a model that declares batching; "
            f"{policy.name!r} has {'no model ' + repr(name) if model is None else repr(name) + ' without it'}"
        )
    in_force = {name: Setting(replicas=setting.replicas, drop_rate=0.0, batch_size=batch, threads=int(cores))}

    def decide(now: float, rate: float) -> None:
        """What the live loop does each tick (``autoscaler.driving.driver``): the front's snapshot
        (the queued requests' ages since they left their clients), observe, decide, apply."""
        nonlocal cores, batch, in_force
        snap = MeterSnapshot(
            arrivals_per_min=np.zeros(0),
            arrival_rate=rate,
            queue_length=float(nq),
            queued_ages_s=setting.slo_s - (hkey[:nq] - now),
            batch_size=batch,
            threads=int(cores),
        )
        obs = observe(
            now,
            policy.cluster.cpus,
            None,
            {name: snap},
            {name: setting.replicas},
            in_force,
            slo_s={name: setting.slo_s},
        )
        dec = driver.decide(policy, obs)  # its exception carries the time
        if dec is not None:
            done = apply_decision(dec, in_force, policy.models, policy.cluster.cpus, None, policy=policy.name, now=now)
            if done.changes:
                raise ValueError(
                    f"{policy.name!r} changed the replicas of {name!r}: the batched "
                    "simulator runs a fixed number (its cores and batches change)"
                )
            in_force = done.settings
            now_in_force = in_force[name]  # a setting without a batch or threads keeps those in force
            cores = cores if now_in_force.threads is None else float(now_in_force.threads)
            batch = batch if now_in_force.batch_size is None else int(now_in_force.batch_size)

    decide(0.0, setting.rate)  # the monitor knows the rate from before: no cold first second
    for k in range(ticks):
        t0, t1 = k * tick, (k + 1) * tick
        cores_log[k], batch_log[k] = cores * setting.replicas, batch
        nxt, nq, n_arr, n_drop, _ = advance_batched(
            t0,
            t1,
            arr,
            deadline,
            net,
            jitter,
            np.zeros(n),
            start,
            lat,
            status,
            nxt,
            n,
            hkey,
            hidx,
            nq,
            free_at,
            batch,
            cores,
            prof,
            setting.queue_limit,
        )
        dropped += n_drop
        if nxt >= n and nq == 0 and np.all(free_at <= t1):
            cores_log, batch_log = cores_log[: k + 1], batch_log[: k + 1]
            break
        decide(t1, n_arr / tick)
    done = status == DONE
    lat = np.where(done, lat, np.inf)
    finite = lat[np.isfinite(lat)]
    return BatchedResult(
        policy=policy.name,
        slo_violation_rate=float(np.mean(lat > setting.slo_s)),
        mean_cores=float(cores_log[: max(1, int(setting.duration_s / tick))].mean()),
        p99_ms=float(np.percentile(finite, 99) * 1e3) if finite.size else math.inf,
        requests=n,
        dropped=dropped,
        cores=cores_log,
        batch=batch_log,
        network_s=net,
        latency_s=lat,
    )
