"""The matched simulator's driver: a trace, a policy, a fixed cluster (paper section 6.4).

It plays the role the live autoscaler plays on Ray Serve: every ``policy.tick_s`` it builds
the :class:`~autoscaler.policy.Observation` the router front would report and hands it to
the very same policy object (``autoscaler.make_policy``), then applies the returned
:class:`~autoscaler.policy.Decision`. Observations and decision checks are the live loop's
own (``autoscaler.driver``): targets clamped to each model's min/max, a decision above the
cluster's capacity refused with :class:`CapacityExceeded` (a bug in the policy: policies
fit their own decisions, ``grant_in_order``); here added replicas serve after the cold
start, removed ones leave at once, and drop rates are enforced at the router.

Observation semantics (what a router front measures):
* ``arrivals_per_min``: arrivals (dropped ones included) of every completed minute, after
  an optional warm-up prefix (e.g. the previous day), oldest first;
* ``arrival_rate``: arrivals over the last tick / tick length;
* ``latency_ms``: SLO-percentile latency of requests completed in the look-back (30 s),
  dropped requests excluded (they get a 503 at once); None when none completed;
* ``processing_ms``: mean processing time of those requests;
* ``queue_length``: requests waiting at the router at the tick;
* ``ongoing_per_replica``: time-average of queued + in-service requests over the last
  tick, per serving replica (Ray Serve's ``total_num_requests`` / running replicas);
* ``future_arrivals_per_min``: the realised counts of the coming minutes (oracle only).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autoscaler.driver import CapacityExceeded, FrontSnapshot, apply_decision, observe  # noqa: F401 (re-exported)
from autoscaler.policy import Policy
from faro_serve.config import ModelSLO
from faro_serve.metrics import MinuteTable, Summary, minute_table, summarize

from ..distributions import PAPER_PROCESSING, PAPER_ROUTER_OVERHEAD, TimeDist
from .state import ModelState
from .workload import Workload


@dataclass(frozen=True)
class SimConfig:
    """The simulated cluster (defaults: the paper-matched setup, faro-parameters.md)."""

    capacity_cpus: float
    capacity_memory_gb: float | None = None  # memory is not binding in the paper's runs
    cold_start_s: float = 60.0
    queue_limit: int = 50
    processing: TimeDist | tuple[TimeDist, ...] = PAPER_PROCESSING
    router_overhead: TimeDist = PAPER_ROUTER_OVERHEAD
    # a replica's idle gap between two queued requests: the router's dispatch round trip
    # (0 = the paper's model; matched validation calibrates it on the live system)
    replica_hold_s: float = 0.0
    # a client gives up on a request not answered within this (a replay's per-request
    # timeout); inf: clients wait for ever, the paper's model (kernels.advance)
    client_timeout_s: float = math.inf
    look_back_s: float = 30.0
    initial_replicas: int | None = None  # None: each model's min_replicas
    seed: int = 0
    keep_records: bool = False  # keep every request record (tests, live comparison)

    def __post_init__(self) -> None:
        if not self.capacity_cpus > 0:
            raise ValueError(f"capacity must be > 0 (got {self.capacity_cpus:g})")
        if self.cold_start_s < 0 or not math.isfinite(self.cold_start_s):
            raise ValueError(f"cold start must be a finite number >= 0 (got {self.cold_start_s:g})")
        if self.queue_limit < 0:
            raise ValueError(f"queue limit must be >= 0 (got {self.queue_limit})")
        if not (0 <= self.replica_hold_s < 60):
            raise ValueError(f"replica hold must be in [0, 60) s (got {self.replica_hold_s:g})")
        if not self.client_timeout_s > 0:
            raise ValueError(f"client timeout must be > 0 s (got {self.client_timeout_s:g})")
        if self.look_back_s <= 0:
            raise ValueError("look-back must be > 0 s")


@dataclass
class SimResult:
    policy: str
    names: list[str]
    capacity_cpus: float
    seed: int
    table: MinuteTable
    summary: Summary
    wall_s: float
    tick_times: np.ndarray  # (ticks,)
    targets: np.ndarray  # (ticks, models) target replicas after each tick's decision
    serving: np.ndarray  # (ticks, models) replicas serving at each tick
    decisions: dict[str, int] = field(default_factory=dict)  # decision kind -> count
    records: dict[str, np.ndarray] | None = None  # model, arrival_s, latency_s, dropped

    def to_dict(self, per_job: bool = True) -> dict:
        out = {"policy": self.policy, "capacity": self.capacity_cpus, "seed": self.seed,
               **self.summary.to_dict(per_job=False), "wall_s": round(self.wall_s, 3),
               "minutes": self.table.minutes, "requests": int(self.summary.job_requests.sum()),
               "dropped": int(self.summary.job_dropped.sum()), "decisions": dict(self.decisions)}
        if per_job:
            out["jobs"] = self.summary.to_dict()["jobs"]
        return out


def simulate(counts: np.ndarray, models: Sequence[ModelSLO], policy: Policy, cfg: SimConfig,
             warmup_history: np.ndarray | None = None, future_minutes: int | None = None) -> SimResult:
    """Run ``policy`` on per-minute ``counts`` (jobs x minutes, in ``models`` order).

    ``warmup_history`` (jobs x minutes) is arrival history from before the run (e.g. the
    previous day's end), prepended to what the policy sees but not simulated.
    """
    t_wall = time.perf_counter()
    models = list(models)
    names = [m.name for m in models]
    counts = np.asarray(counts, dtype=float)
    if counts.ndim != 2 or counts.shape[0] != len(models):
        raise ValueError(f"counts must be (models={len(models)}, minutes), got {counts.shape}")
    n_min = counts.shape[1]
    if n_min == 0:
        raise ValueError("the trace has no minutes")
    spec = {m.name: m for m in models}
    init = [cfg.initial_replicas or m.min_replicas for m in models]
    init = [min(max(r, m.min_replicas), m.max_replicas) for r, m in zip(init, models)]
    if sum(r * m.cpus for r, m in zip(init, models)) > cfg.capacity_cpus + 1e-9:
        raise ValueError(f"the initial replicas need {sum(init)} replicas but the capacity is "
                         f"{cfg.capacity_cpus:g}")
    procs = list(cfg.processing) if isinstance(cfg.processing, tuple) else cfg.processing
    work = Workload(counts, procs, cfg.router_overhead, seed=cfg.seed)
    tick = float(policy.tick_s)
    look_ticks = int(math.ceil(cfg.look_back_s / tick)) + 1
    states = {m.name: ModelState(m.name, i, cfg.queue_limit, look_ticks,
                                     cfg.replica_hold_s, cfg.client_timeout_s) for i, m in enumerate(models)}
    for s, r in zip(states.values(), init):
        s.scale_to(r, 0.0, 0.0)
    slo_s = np.array([m.slo_ms / 1e3 for m in models])
    pct = np.array([m.percentile for m in models])
    if warmup_history is None:
        warmup_history = np.zeros((len(models), 0))
    warmup_history = np.asarray(warmup_history, dtype=float)
    if warmup_history.ndim != 2 or warmup_history.shape[0] != len(models):
        raise ValueError("warm-up history must be (models, minutes)")
    history = np.concatenate([warmup_history, work.counts.astype(float)], axis=1)
    n_warm = warmup_history.shape[1]
    if future_minutes is None:
        window = getattr(getattr(policy, "cluster", None), "window_s", 420.0)
        future_minutes = int(math.ceil(window / 60.0)) + 1
    end = 60.0 * n_min
    n_ticks = int(math.ceil(end / tick))
    tick_times = np.arange(n_ticks) * tick
    targets_log = np.zeros((n_ticks, len(models)), dtype=np.int32)
    serving_log = np.zeros((n_ticks, len(models)), dtype=np.int32)
    kinds: dict[str, int] = {}
    table = MinuteTable.empty(names, n_min)
    rec_parts: list[tuple] = []
    state_list = list(states.values())

    def flush(final: bool) -> None:
        nonlocal table
        upto = n_min if final else min(s.settled_until_minute() for s in state_list)
        parts = [s.take_settled(upto) for s in state_list]
        sizes = [p[0].size for p in parts]
        if sum(sizes) == 0:
            return
        midx = np.repeat(np.arange(len(models)), sizes)
        arr = np.concatenate([p[0] for p in parts])
        lat = np.concatenate([p[1] for p in parts])
        drp = np.concatenate([p[2] for p in parts])
        table = table.merge(minute_table(names, midx, arr, lat, drp, slo_s, n_min, pct))
        if cfg.keep_records:
            rec_parts.append((midx, arr, lat, drp))

    # Event instants: minute starts (load the minute) and ticks (observe + decide).
    minute_starts = 60.0 * np.arange(n_min)
    events = np.unique(np.concatenate([minute_starts, tick_times, [end]]))
    last_tick_t = 0.0
    k_tick = 0
    m_next = 0
    t_prev = 0.0
    for t in events:
        if t > t_prev:
            for s in state_list:
                s.run(t_prev, t)
            t_prev = t
        if t >= end:
            break
        if m_next < n_min and t >= minute_starts[m_next]:
            batch = work.minute(m_next)
            for s, sl in zip(state_list, batch.job_slices()):
                s.append(batch.arrival[sl], batch.proc[sl], batch.overhead[sl], batch.u[sl])
            m_next += 1
            if m_next % 5 == 0:
                flush(False)
        if k_tick < n_ticks and t >= tick_times[k_tick]:
            dt = t - last_tick_t
            minute_now = int(t // 60.0)
            snaps, running = {}, {}
            for i, (n, s) in enumerate(states.items()):
                n_arr, _, area = s.end_tick()
                running[n] = serving_log[k_tick, i] = s.serving(t)
                lat, proc, _ = s.observe(t, cfg.look_back_s, spec[n].percentile)
                snaps[n] = FrontSnapshot(
                    arrivals_per_min=history[i, :n_warm + minute_now],
                    arrival_rate=n_arr / dt if dt > 0 else 0.0,
                    latency_ms=None if math.isnan(lat) else lat * 1e3,
                    processing_ms=None if math.isnan(proc) else proc * 1e3,
                    queue_length=float(s.nq), mean_in_flight=area / dt if dt > 0 else 0.0)
            future = {n: work.counts[i, minute_now:minute_now + future_minutes].astype(float)
                      for i, n in enumerate(names)}
            obs = observe(float(t), cfg.capacity_cpus, cfg.capacity_memory_gb, snaps, running,
                          {n: s.target for n, s in states.items()},
                          {n: s.drop_rate for n, s in states.items()}, future)
            dec = policy.decide(obs)
            if dec is not None:
                done = apply_decision(dec, {n: s.target for n, s in states.items()}, models,
                                      cfg.capacity_cpus, cfg.capacity_memory_gb,
                                      policy=policy.name, now=float(t))
                for n, r in done.changes:
                    states[n].scale_to(r, float(t), cfg.cold_start_s)
                for n, d in done.drop_rates.items():
                    states[n].drop_rate = d
                kinds[dec.kind] = kinds.get(dec.kind, 0) + 1
            for i, s in enumerate(state_list):
                targets_log[k_tick, i] = s.target
            last_tick_t = t
            k_tick += 1
    # Drain: no more arrivals; queued requests are served by the replicas left.
    for s in state_list:
        s.run(end, 1e18)
    flush(True)
    records = None
    if cfg.keep_records:
        cols = list(zip(*rec_parts)) if rec_parts else [[np.empty(0, int)], [np.empty(0)],
                                                        [np.empty(0)], [np.empty(0, bool)]]
        records = dict(zip(("model", "arrival_s", "latency_s", "dropped"),
                           (np.concatenate(c) for c in cols)))
    return SimResult(policy=policy.name, names=names, capacity_cpus=cfg.capacity_cpus, seed=cfg.seed,
                     table=table, summary=summarize(table, slo_s), wall_s=time.perf_counter() - t_wall,
                     tick_times=tick_times, targets=targets_log, serving=serving_log,
                     decisions=kinds, records=records)
