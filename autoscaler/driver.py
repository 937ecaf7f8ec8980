"""What every driver of a policy does around ``policy.decide``, once (paper sections 4.4, 5, 6.4).

Two drivers run the same policy objects: the live autoscaler loop (``autoscaler.loop``, over
Ray Serve through ``faro_serve.serving.autoscaler_deployment``) and the simulator
(``faro_serve.sim.runner``). Both

1. turn what each model's router measured into a typed :class:`FrontSnapshot` (live: the
   front's JSON; simulated: the model's queue state), and build the policy's
   :class:`~autoscaler.policy.Observation` from the snapshots with :func:`observe`;
2. apply the policy's :class:`~autoscaler.policy.Decision` with :func:`apply_decision`:
   unknown models refused, every target clamped to the model's bounds, the capacity checked,
   drop rates clipped to [0, 1], and the scale changes ordered decreases first, so that a
   cluster that is full while one model grows and another shrinks never holds both at once
   (what ``grant_in_order`` assumes).

Nothing here imports Ray.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from faro_serve.config import ModelSLO

from .front_report import FrontReport, decode_front_report, read_reports
from .policy import Decision, ModelObservation, Observation


class CapacityExceeded(RuntimeError):
    """A policy asked for more replicas than the cluster holds."""


@dataclass(frozen=True)
class FrontSnapshot:
    """What a model's router measured, as of one decision tick."""

    arrivals_per_min: np.ndarray  # completed-minute arrival counts, oldest first
    arrival_rate: float = 0.0  # requests/s over the last tick
    latency_ms: float | None = None  # SLO-percentile latency over the look-back
    processing_ms: float | None = None  # mean replica processing time over the look-back
    queue_length: float = 0.0  # requests waiting for a replica
    mean_in_flight: float = 0.0  # queued + in service, averaged over the tick
    # what the live front enforces now (None in the simulator, which enforces what it is told)
    drop_rate: float | None = None
    replicas: int | None = None
    percentile: float | None = None
    # a batching model (issue 20): how long ago each queued request left its client (s: its
    # wait plus the network time clients declare), and the batch size and threads its
    # replicas run (None: not reported)
    queued_ages_s: np.ndarray | None = None
    batch_size: int | None = None
    threads: int | None = None
    mean_batch: float = 1.0  # request-weighted mean batch behind processing_ms
    variant: str | None = None  # a task with variants: the one its replicas serve

    @classmethod
    def from_front(cls, front: Mapping, min_elapsed_s: float = 10.0,
                   startup_minutes: int = 2, model: str | None = None) -> "FrontSnapshot":
        """The live front's JSON (``FrontControl.metrics``), read strictly: a missing or
        ill-typed field raises :class:`~autoscaler.front_report.FrontReportError` naming
        it (and ``model``) rather than becoming a default."""
        return cls.from_report(decode_front_report(front, model), min_elapsed_s, startup_minutes)

    @classmethod
    def from_report(cls, r: FrontReport, min_elapsed_s: float = 10.0,
                    startup_minutes: int = 2) -> "FrontSnapshot":
        """Its arrival history is the completed minutes, as the simulator gives its policies;
        right after a start (fewer than ``startup_minutes`` of them) the open minute is
        appended, extrapolated to a full minute once it is ``min_elapsed_s`` old, so that the
        first decisions see the load."""
        hist = list(r.arrivals_per_min)
        elapsed = r.current_minute_elapsed_s
        if len(hist) < startup_minutes and elapsed >= min_elapsed_s:
            hist.append(r.current_minute_count * 60.0 / elapsed)
        return cls(arrivals_per_min=np.asarray(hist, float), arrival_rate=r.arrival_rate,
                   latency_ms=r.latency_ms, processing_ms=r.processing.mean_ms,
                   queue_length=r.queue_length, mean_in_flight=r.mean_in_flight,
                   drop_rate=r.drop_rate, replicas=r.replicas, percentile=r.percentile,
                   queued_ages_s=(None if r.queued_ages_s is None
                                  else np.asarray(r.queued_ages_s, float)),
                   batch_size=r.batch_size, threads=r.threads,
                   mean_batch=r.mean_batch or 1.0, variant=r.variant)

    @classmethod
    def read_fronts(cls, raw: Mapping[str, Mapping], slos: Mapping[str, ModelSLO]
                    ) -> tuple[dict[str, "FrontSnapshot"], dict[str, str]]:
        """Every model's front JSON as a snapshot, and the error of each model left out: a
        malformed report, or replicas reserving other resources than the SLO's
        (:func:`~autoscaler.front_report.read_reports`, which logs them)."""
        reports, errors = read_reports(raw, slos)
        return {n: cls.from_report(r) for n, r in reports.items()}, errors

    def enforces(self, drop_rate: float, replicas: int, percentile: float,
                 batch_size: int | None = None, threads: int | None = None,
                 variant: str | None = None) -> bool:
        """Whether the front already enforces these settings (else the driver resends them);
        a batch size, thread count or variant of None is not checked."""
        return ((self.drop_rate, self.replicas, self.percentile) == (drop_rate, replicas, percentile)
                and batch_size in (None, self.batch_size) and threads in (None, self.threads)
                and variant in (None, self.variant))


def observe(now: float, capacity_cpus: float, capacity_memory_gb: float | None,
            snapshots: Mapping[str, FrontSnapshot], running: Mapping[str, int],
            targets: Mapping[str, int], drop_rates: Mapping[str, float],
            future: dict[str, np.ndarray] | None = None,
            slo_s: Mapping[str, float] | None = None) -> Observation:
    """The policy's observation of the models in ``snapshots`` (in their order).

    ``running``: replicas serving now; ``targets``: the last targets set (replicas starting
    included); ``future``: true upcoming arrivals, which only the simulator has; ``slo_s``:
    each model's SLO, which turns the queued requests' waits into remaining budgets."""
    models = {}
    for n, s in snapshots.items():
        budgets = None
        if s.queued_ages_s is not None and slo_s is not None and n in slo_s:
            budgets = np.sort(float(slo_s[n]) - s.queued_ages_s)
        models[n] = ModelObservation(
            name=n, replicas=int(running[n]), target_replicas=int(targets[n]),
            arrivals_per_min=s.arrivals_per_min, arrival_rate=s.arrival_rate,
            latency_ms=s.latency_ms, processing_ms=s.processing_ms, queue_length=s.queue_length,
            ongoing_per_replica=s.mean_in_flight / max(int(running[n]), 1),
            drop_rate=float(drop_rates.get(n, 0.0)), queued_budgets_s=budgets,
            threads=int(s.threads or 1), batch_size=int(s.batch_size or 1), mean_batch=s.mean_batch)
    return Observation(now=float(now), capacity_cpus=capacity_cpus,
                       capacity_memory_gb=capacity_memory_gb, models=models,
                       future_arrivals_per_min=future)


@dataclass(frozen=True)
class Applied:
    """A decision made safe to carry out."""

    targets: dict[str, int]  # every model's target after the decision
    changes: list[tuple[str, int]]  # (model, new target), decreases first
    drop_rates: dict[str, float]  # the drop rates the decision sets, in [0, 1]
    batch_sizes: dict[str, int] = field(default_factory=dict)  # within each model's batching
    threads: dict[str, int] = field(default_factory=dict)  # within each replica's CPUs
    variants: dict[str, str] = field(default_factory=dict)  # each a variant of its model


def apply_decision(decision: Decision, targets: Mapping[str, int], models: Sequence[ModelSLO],
                   capacity_cpus: float, capacity_memory_gb: float | None, *,
                   policy: str = "policy", now: float = 0.0) -> Applied:
    """Check and order ``decision`` against the current ``targets`` (see the module docstring).

    Raises ``ValueError`` for a model the cluster does not run and :class:`CapacityExceeded`
    when a decision that grows a model leaves targets needing more CPUs or memory than the
    cluster has."""
    spec = {m.name: m for m in models}
    unknown = sorted((set(decision.replicas) | set(decision.drop_rates)) - set(targets))
    if unknown:
        raise ValueError(f"policy {policy!r} named unknown models {unknown} at t={now:g}s")
    after = dict(targets)
    for n, r in decision.replicas.items():
        after[n] = spec[n].clamp(r)
    # A decision that only shrinks is always carried out: after a restart into a smaller
    # cluster, the targets resumed from the running replicas may exceed it.
    grows = any(after[n] > targets[n] for n in after)
    cpus = sum(after[n] * spec[n].cpus for n in after)
    if grows and cpus > capacity_cpus + 1e-9:
        raise CapacityExceeded(f"policy {policy!r} asked for {cpus:g} CPUs at t={now:g}s; the "
                               f"cluster has {capacity_cpus:g} (targets {after})")
    if grows and capacity_memory_gb is not None:
        mem = sum(after[n] * spec[n].memory_gb for n in after)
        if mem > capacity_memory_gb + 1e-9:
            raise CapacityExceeded(f"policy {policy!r} asked for {mem:g} GiB at t={now:g}s; the "
                                   f"cluster has {capacity_memory_gb:g}")
    changes = [(n, after[n]) for n in after if after[n] != targets[n]]
    changes.sort(key=lambda c: c[1] > targets[c[0]])  # decreases first, stable otherwise
    drops = {n: float(np.clip(d, 0.0, 1.0)) for n, d in decision.drop_rates.items()}
    variants = {}
    for n, v in decision.variants.items():
        if n not in spec:
            raise ValueError(f"policy {policy!r} set a variant for unknown model {n!r} at t={now:g}s")
        variants[n] = spec[n].variant(v).name  # ValueError names a variant the model lacks
    batches = {}
    for n, b in decision.batch_sizes.items():
        most = largest_batch(spec[n]) if n in spec else 1
        if most <= 1:
            raise ValueError(f"policy {policy!r} set a batch size for {n!r}, which does not batch "
                             f"(no batching in its config) at t={now:g}s")
        batches[n] = int(min(max(int(b), 1), most))
    # threads inside a replica's CPUs: Ray cannot resize a running replica, so Sponge's
    # vertical scaling is torch's thread count within the CPUs the replica reserved
    threads = {}
    for n, t in decision.threads.items():
        if n not in spec:
            raise ValueError(f"policy {policy!r} set threads for unknown model {n!r} at t={now:g}s")
        threads[n] = int(min(max(int(t), 1), max(1, math.floor(spec[n].cpus))))
    return Applied(after, changes, drops, batches, threads, variants)


def largest_batch(model: ModelSLO) -> int:
    """The largest batch a model's config allows: its own, or its variants' largest."""
    sizes = [model.batching.max_batch_size] if model.batching else []
    sizes += [v.batching.max_batch_size for v in model.variants or () if v.batching]
    return max(sizes, default=1)
