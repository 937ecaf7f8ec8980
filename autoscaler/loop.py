"""The live autoscaler's control loop, Ray-free (paper sections 4.4 and 5).

Every tick it reads the cluster through a :class:`ClusterAdapter` (router-front metrics,
running replicas, capacity), builds the policy's :class:`~autoscaler.policy.Observation`,
lets the policy decide, applies the decision (replica targets, drop rates) and logs it as
one JSON line. Observing and applying are the simulator's own code (``driver.py``). The Ray
Serve adapter and deployment live in ``faro_serve/serving/autoscaler_deployment.py``; tests
drive this loop with a fake adapter and a fake clock.

On a restart the loop resumes from the cluster as it is: the targets start at the running
replica counts (never below a model's minimum), and the metric history is the fronts'.
The policy sees the same inputs as in the simulator (``faro_serve.sim.runner``): completed
per-minute arrivals, the SLO-percentile latency over the last 30 s, mean processing time.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from faro_serve.metrics import utility_from_latency

from .config import AutoscalerConfig
from .driver import FrontSnapshot, apply_decision, largest_batch, observe
from .policy import Decision, Observation
from .registry import make_policy

log = logging.getLogger("faro_serve.autoscaler")


class ClusterAdapter(Protocol):
    def capacity(self) -> tuple[float, float | None]:
        """(CPUs, GiB) the cluster has for models now."""

    def running_replicas(self) -> dict[str, int]:
        """Serving replicas per deployed model (models not deployed are absent)."""

    def front_metrics(self, names: list[str]) -> dict[str, dict]:
        """Router-front snapshots per model (models that did not answer are absent)."""

    def scale(self, name: str, replicas: int) -> None: ...

    def control(self, name: str, drop_rate: float, replicas: int, percentile: float,
                **batching) -> None:
        """Tell a front what to enforce; ``batching`` (``batch_size``, ``threads``,
        ``variant``) only for a model a policy batches or switches."""


class StateStore(Protocol):
    """Where the loop keeps its state between restarts (live: a named Ray actor)."""

    def load(self) -> dict | None: ...

    def save(self, state: dict) -> None: ...


class AutoscalerLoop:
    """``previous``: the loop this one replaces after a config change (same process);
    ``store``: the state saved by a loop that stopped (a restart), restored when it is
    the same policy over the same models and at most ``max_state_age_s`` old."""

    def __init__(self, cfg: AutoscalerConfig, cluster: ClusterAdapter, forecaster=None,
                 clock: Callable[[], float] = time.time, previous: "AutoscalerLoop | None" = None,
                 store: StateStore | None = None):
        self.cfg = cfg
        self.cluster = cluster
        self.clock = clock
        self.store = store
        self.policy = make_policy(cfg.policy_name(), cfg.models, cfg.cluster, forecaster)
        self.slo = {m.name: m for m in cfg.models}
        self.start = previous.start if previous else clock()
        self.targets: dict[str, int] = dict(previous.targets) if previous else {}
        self.drop_rates: dict[str, float] = dict(previous.drop_rates) if previous else {}
        # batching models (issue 20): the batch size and threads a policy set, per model
        self.batch_sizes: dict[str, int] = dict(previous.batch_sizes) if previous else {}
        self.threads: dict[str, int] = dict(previous.threads) if previous else {}
        self.variants: dict[str, str] = dict(previous.variants) if previous else {}
        self.history: deque = previous.history if previous else deque(maxlen=500)
        self.last: dict = {}
        self.last_plan: dict = previous.last_plan if previous else {}
        self.ticks = 0
        self.restored: dict | None = None  # where the state came from, for the status
        if previous is not None:
            self._resume(previous.state(), "the previous configuration")
        elif store is not None:
            try:
                saved = store.load()
            except Exception as err:  # no store yet, or it cannot be reached: start afresh
                log.warning("cannot read the saved autoscaler state: %s", err)
                saved = None
            if saved:
                self._resume(saved, "the state saved before a restart", restart=True)

    @property
    def max_state_age_s(self) -> float:
        """Older saved state is stale (its timers describe another load): start afresh."""
        return max(2 * self.cfg.cluster.long_term_interval_s, 600.0)

    def state(self) -> dict:
        """Everything a restarted loop needs to carry on, JSON-able."""
        return {"version": 1, "saved_at": self.clock(), "start": self.start,
                "drop_rates": dict(self.drop_rates), "last_plan": self.last_plan,
                "batch_sizes": dict(self.batch_sizes), "threads": dict(self.threads),
                "variants": dict(self.variants),
                "policy": self.policy.get_state()}

    def _resume(self, saved: dict, source: str, restart: bool = False) -> None:
        age = self.clock() - float(saved.get("saved_at", -math.inf))
        if restart and not age <= self.max_state_age_s:
            log.info("saved autoscaler state is %.0f s old: starting afresh", age)
            return
        try:
            self.policy.set_state(saved["policy"])
        except (KeyError, TypeError, ValueError) as err:  # another policy or model set
            log.info("not resuming from %s: %s", source, err)
            return
        if restart:
            self.start = float(saved["start"])  # the policy's timers run on this clock
            self.drop_rates = {n: float(d) for n, d in saved.get("drop_rates", {}).items()
                               if n in self.slo}
            self.batch_sizes = {n: int(b) for n, b in saved.get("batch_sizes", {}).items()
                                if n in self.slo and largest_batch(self.slo[n]) > 1}
            self.threads = {n: int(t) for n, t in saved.get("threads", {}).items() if n in self.slo}
            self.variants = {n: str(v) for n, v in saved.get("variants", {}).items()
                             if n in self.slo and self.slo[n].variants}
            self.last_plan = saved.get("last_plan") or {}
        self.restored = {"from": source, "saved_at": saved.get("saved_at"), "age_s": round(age, 3)}
        log.info("resumed %s from %s (%.1f s old)", self.policy.name, source, age)

    @property
    def tick_s(self) -> float:
        return self.policy.tick_s

    def _observe(self, now: float) -> tuple[Observation, dict[str, FrontSnapshot]]:
        running = self.cluster.running_replicas()
        names = [m.name for m in self.cfg.models if m.name in running]
        # a malformed report (or replicas reserving other CPUs than the SLO's) is logged and
        # left out: that model is planned as one whose front did not answer (front_report.py)
        fronts, self.front_errors = FrontSnapshot.read_fronts(self.cluster.front_metrics(names), self.slo)
        cpus, mem = self.cluster.capacity()
        cap_cpu = min(self.cfg.cluster.cpus, cpus)
        cap_mem = self.cfg.cluster.memory_gb
        if cap_mem is not None and mem is not None:
            cap_mem = min(cap_mem, mem)
        for n in names:
            if n not in self.targets:  # (re)start: resume from what is running
                self.targets[n] = self.slo[n].clamp(running[n])
        snaps = {n: fronts.get(n) or FrontSnapshot(np.zeros(0)) for n in names}
        obs = observe(now - self.start, cap_cpu, cap_mem, snaps, running, self.targets, self.drop_rates,
                      slo_s={n: self.slo[n].slo_ms / 1e3 for n in names})
        return obs, fronts

    def step(self) -> dict:
        """One tick: observe, decide, apply, log. Returns the tick's record."""
        now = self.clock()
        obs, fronts = self._observe(now)
        self.ticks += 1
        decision = None
        if self.cfg.enabled and obs.models:
            missing = [m.name for m in self.cfg.models if m.name not in obs.models]
            if missing:  # plan only for what is deployed; the policy wants every model
                log.warning("models not deployed yet: %s", ", ".join(missing))
            else:
                decision = self.policy.decide(obs)
        if decision is not None:
            self._apply(decision, obs)
        if self.cfg.enabled:
            self._sync_fronts(obs, fronts)
        record = self._record(now, obs, decision)
        self.last = record
        if decision is not None:
            self.history.append(record)
            self._log(record)
        if self.store is not None:
            try:
                self.store.save(self.state())
            except Exception as err:  # the next tick saves again
                log.warning("cannot save the autoscaler state: %s", err)
        return record

    def _sync_fronts(self, obs: Observation, fronts: dict[str, FrontSnapshot]) -> None:
        """Tell a front the drop rate, target and SLO percentile where it differs from ours
        (after a decision, or when a restarted front came back with defaults)."""
        for n in obs.models:
            f = fronts.get(n)
            want = (self.drop_rates.get(n, 0.0), self.targets[n], self.slo[n].percentile)
            batching = {k: v[n] for k, v in (("batch_size", self.batch_sizes), ("threads", self.threads),
                                             ("variant", self.variants)) if n in v}
            if f is not None and f.enforces(*want, **batching):
                continue
            try:
                self.cluster.control(n, *want, **batching)
            except Exception as err:  # a front may be restarting
                log.warning("cannot reach the front of %s: %s", n, err)

    def _apply(self, decision: Decision, obs: Observation) -> None:
        done = apply_decision(decision, self.targets, self.cfg.models, obs.capacity_cpus,
                              obs.capacity_memory_gb, policy=self.policy.name, now=obs.now)
        for n, r in done.changes:  # decreases first: they free what the increases take
            self.cluster.scale(n, r)
            self.targets[n] = r
        self.drop_rates.update(done.drop_rates)
        self.batch_sizes.update(done.batch_sizes)
        self.threads.update(done.threads)
        self.variants.update(done.variants)
        if decision.plan:  # what the status shows as predicted, until the next plan
            self.last_plan = {n: {"utility": round(p.utility, 4), "predictor": p.predictor,
                                  "latency_ms": p.latency_ms} for n, p in decision.plan.items()}

    def _record(self, now: float, obs: Observation, decision: Decision | None) -> dict:
        models = {}
        for n, o in obs.models.items():
            planned = self.last_plan.get(n, {})
            models[n] = {
                "slo_ms": self.slo[n].slo_ms, "percentile": self.slo[n].percentile,
                "arrival_rate": round(o.arrival_rate, 4),
                "latency_ms": None if o.latency_ms is None else round(o.latency_ms, 2),
                "processing_ms": None if o.processing_ms is None else round(o.processing_ms, 2),
                "queue_length": o.queue_length, "replicas": o.replicas,
                "target": self.targets.get(n), "drop_rate": self.drop_rates.get(n, 0.0),
                # measured: min(SLO / p99 over the look-back, 1), the paper's utility (alpha 1);
                # predicted: what the last plan expected over its window
                "observed_utility": observed_utility(o.latency_ms, self.slo[n].slo_ms),
                "predicted_utility": planned.get("utility"), "predictor": planned.get("predictor"),
                "predicted_latency_ms": planned.get("latency_ms"),
            }
            for key, held in (("batch_size", self.batch_sizes), ("threads", self.threads),
                              ("variant", self.variants)):
                if n in held:  # set by a policy that batches or switches variants
                    models[n][key] = held[n]
        rec = {"time": round(now, 3), "t": round(obs.now, 3), "policy": self.policy.name,
               "capacity_cpus": obs.capacity_cpus, "models": models,
               "decision": None if decision is None else {
                   "kind": decision.kind, "replicas": decision.replicas,
                   "drop_rates": decision.drop_rates, "info": decision.info,
                   **{k: v for k, v in (("batch_sizes", decision.batch_sizes),
                                        ("threads", decision.threads),
                                        ("variants", decision.variants)) if v}}}
        return rec

    def _log(self, record: dict) -> None:
        line = json.dumps(record, default=_json_default)
        log.info("decision %s", line)
        if self.cfg.decision_log:
            path = Path(self.cfg.decision_log).expanduser()
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a") as f:
                f.write(line + "\n")

    def status(self) -> dict:
        return {"policy": self.policy.name, "objective": self.cfg.cluster.objective,
                "enabled": self.cfg.enabled, "ticks": self.ticks,
                "capacity_cpus": self.last.get("capacity_cpus"),
                "models": self.last.get("models", {}), "last_decision": self.history[-1]["decision"]
                if self.history else None, "restored": self.restored}


def observed_utility(latency_ms: float | None, slo_ms: float) -> float | None:
    """The paper's utility of a measured SLO-percentile latency (the metrics' own formula);
    None when nothing completed in the look-back."""
    if latency_ms is None:
        return None
    return round(float(utility_from_latency(latency_ms, slo_ms)), 4)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return None if not math.isfinite(float(o)) else float(o)
    return str(o)
