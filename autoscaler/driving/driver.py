"""What every driver of a policy does around ``policy.decide``, once (paper sections 4.4, 5, 6.4).

Two drivers run the same policy objects: the live autoscaler loop (``autoscaler.driving.loop``, over
Ray Serve through ``faro_serve.serving.autoscaler_deployment``) and the simulator
(``faro_serve.sim.runner``). Both

1. turn what each model's router measured into a typed :class:`MeterSnapshot` (live: the
   meter's JSON; simulated: the model's queue state), and build the policy's
   :class:`~autoscaler.contract.policy.Observation` from the snapshots with :func:`observe`;
2. apply the policy's :class:`~autoscaler.contract.policy.Decision` with :func:`apply_decision`:
   unknown models refused, every target clamped to the model's bounds, the capacity checked,
   drop rates clipped to [0, 1], and the scale changes ordered decreases first, so that a
   cluster that is full while one model grows and another shrinks never holds both at once
   (what ``grant_in_order`` assumes).

Nothing here imports Ray.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any

import numpy as np

from autoscaler.contract.policy import (
    STARTUP_MINUTES,
    Decision,
    ModelObservation,
    Observation,
    PipelineObservation,
    Policy,
)
from autoscaler.contract.setting import Setting, field_map
from faro_serve.config import ModelSLO
from faro_serve.meter_report import MeterReport, decode_meter_report, read_reports
from faro_serve.resources import Capacity, as_capacity, demand, usage

log = logging.getLogger("faro_serve.autoscaler")


class _AtTick(Exception):
    """An exception of a decision tick: ``now``, the tick's time (s), for a caller that
    words its own message (``faro_serve.sim.policy_suite.policy_failures``)."""

    def __init__(self, message: str, now: float | None = None) -> None:
        super().__init__(message)
        self.now = now


class DecisionRefused(_AtTick, ValueError):
    """A decision the driver will not apply (not a Decision, unknown models, a replica count
    that is no number >= 0, a field a model cannot take): the text names the policy and time."""


class CapacityExceeded(_AtTick, RuntimeError):
    """A policy asked for more replicas than the cluster holds."""


OPEN_MINUTE_MIN_S = 10.0  # once it is this old


def with_open_minute(
    completed: Any,
    open_count: float,
    elapsed_s: float,
    min_elapsed_s: float = OPEN_MINUTE_MIN_S,
    startup_minutes: int = STARTUP_MINUTES,
) -> np.ndarray:
    """A model's arrival history as policies see it: the completed minutes, and right after a
    start (fewer than ``startup_minutes`` of them) the open minute extrapolated to a full
    minute once it is ``min_elapsed_s`` old, so that the first decisions see the load. The
    live driver and the simulator both call this."""
    hist = np.asarray(completed, float)
    if hist.size < startup_minutes and elapsed_s >= min_elapsed_s:
        hist = np.append(hist, open_count * 60.0 / elapsed_s)
    return hist


@dataclass(frozen=True)
class MeterSnapshot:
    """What a model's router measured, as of one decision tick."""

    arrivals_per_min: np.ndarray  # completed-minute arrival counts, oldest first
    arrival_rate: float = 0.0  # requests/s over the last tick
    latency_ms: float | None = None  # SLO-percentile latency over the look-back
    processing_ms: float | None = None  # mean replica processing time over the look-back
    queue_length: float = 0.0  # requests waiting for a replica
    mean_in_flight: float = 0.0  # queued + in service, averaged over the tick
    # the SLO percentile the live meter measures at (None in the simulator); what it was
    # told to enforce is ``told``, below
    percentile: float | None = None
    # a batching model (issue 20): how long ago each queued request left its client (s: its
    # wait plus the network time clients declare), and the batch size and threads its
    # replicas run (None: not reported)
    queued_ages_s: np.ndarray | None = None
    batch_size: int | None = None
    threads: int | None = None
    mean_batch: float = 1.0  # request-weighted mean batch behind processing_ms
    batch_times: np.ndarray | None = None  # rows of (batch, batches, median s): recent batches
    device: str | None = None  # where its replicas run the model, as they say ("cuda:0", "cpu")
    variant: str | None = None  # a task with variants: the one its replicas serve
    told: Setting | None = None  # the setting the meter was told and enforces (live only)

    @classmethod
    def quick(
        cls,
        arrivals_per_min: np.ndarray,
        arrival_rate: float = 0.0,
        latency_ms: float | None = None,
        processing_ms: float | None = None,
        queue_length: float = 0.0,
        mean_in_flight: float = 0.0,
        queued_ages_s: np.ndarray | None = None,
        batch_size: int | None = None,
    ) -> "MeterSnapshot":
        """``MeterSnapshot(...)`` of the fields a simulated meter reports (the others at their
        defaults): the same snapshot, its fields in the same order, in a fraction of the
        time. The simulator builds one per model per tick, and a frozen dataclass's
        ``__init__`` sets its fields one ``object.__setattr__`` at a time."""
        snap = object.__new__(cls)
        own = {
            **_SNAPSHOT_DEFAULTS,
            "arrivals_per_min": arrivals_per_min,
            "arrival_rate": arrival_rate,
            "latency_ms": latency_ms,
            "processing_ms": processing_ms,
            "queue_length": queue_length,
            "mean_in_flight": mean_in_flight,
            "queued_ages_s": queued_ages_s,
            "batch_size": batch_size,
        }
        object.__setattr__(snap, "__dict__", own)
        return snap

    @classmethod
    def from_meter(
        cls,
        meter: Mapping[str, Any],
        min_elapsed_s: float = OPEN_MINUTE_MIN_S,
        startup_minutes: int = STARTUP_MINUTES,
        model: str | None = None,
    ) -> "MeterSnapshot":
        """The live meter's JSON (``MeterControl.metrics``), read strictly: a missing or
        ill-typed field raises :class:`~faro_serve.meter_report.MeterReportError` naming
        it (and ``model``) rather than becoming a default."""
        return cls.from_report(decode_meter_report(meter, model), min_elapsed_s, startup_minutes)

    @classmethod
    def from_report(
        cls, r: MeterReport, min_elapsed_s: float = OPEN_MINUTE_MIN_S, startup_minutes: int = STARTUP_MINUTES
    ) -> "MeterSnapshot":
        """Its arrival history: :func:`with_open_minute` (the completed minutes, and the open
        one extrapolated right after a start), as the simulator gives its policies."""
        hist = with_open_minute(
            r.arrivals_per_min, r.current_minute_count, r.current_minute_elapsed_s, min_elapsed_s, startup_minutes
        )
        return cls(
            arrivals_per_min=hist,
            arrival_rate=r.arrival_rate,
            latency_ms=r.latency_ms,
            processing_ms=r.processing.mean_ms,
            queue_length=r.queue_length,
            mean_in_flight=r.mean_in_flight,
            percentile=r.percentile,
            queued_ages_s=(None if r.queued_ages_s is None else np.asarray(r.queued_ages_s, float)),
            batch_size=r.batch_size,
            threads=r.threads,
            mean_batch=r.mean_batch or 1.0,
            variant=r.variant,
            batch_times=(None if r.batch_times is None else np.asarray(r.batch_times, float).reshape(-1, 3)),
            device=r.device,
            told=Setting.from_json(r.setting, f"meter report of {r.model!r}: setting"),
        )

    @classmethod
    def read_meters(
        cls, raw: Mapping[str, Mapping[str, Any]], slos: Mapping[str, ModelSLO]
    ) -> tuple[dict[str, "MeterSnapshot"], dict[str, str]]:
        """Every model's meter JSON as a snapshot, and the error of each model left out: a
        malformed report, or replicas reserving other resources than the SLO's
        (:func:`~faro_serve.meter_report.read_reports`, which logs them)."""
        reports, errors = read_reports(raw, slos)
        snaps = {}
        for n, r in reports.items():
            try:
                snaps[n] = cls.from_report(r)
            except ValueError as err:  # a setting field this autoscaler does not know
                errors[n] = str(err)
                log.error("left out this tick: %s", err)
        return snaps, errors

    def enforces(self, want: Setting, percentile: float) -> bool:
        """Whether the meter was told every field ``want`` sets, at these values, and the
        SLO percentile (else the driver resends them: after a decision, or when a restarted
        meter came back with defaults)."""
        told = self.told or Setting()
        return self.percentile == percentile and all(getattr(told, f) == v for f, v in want.set_fields().items())


# the fields of a ModelObservation in the order observe() passes them (checked below)
_OBSERVATION_FIELDS = (
    "name",
    "replicas",
    "target_replicas",
    "arrivals_per_min",
    "arrival_rate",
    "latency_ms",
    "processing_ms",
    "queue_length",
    "ongoing_per_replica",
    "drop_rate",
    "queued_budgets_s",
    "threads",
    "batch_size",
    "mean_batch",
    "batch_times",
)
if tuple(f.name for f in fields(ModelObservation)) != _OBSERVATION_FIELDS:  # a field added or moved
    raise ImportError("autoscaler.driving.driver.observe passes ModelObservation's fields out of order")
# every field of a snapshot at its default, in their order (MeterSnapshot.quick)
_SNAPSHOT_DEFAULTS = {f.name: None if f.default is MISSING else f.default for f in fields(MeterSnapshot)}


def observe(
    now: float,
    capacity_cpus: float | Capacity,
    capacity_memory_gb: float | None,
    snapshots: Mapping[str, MeterSnapshot],
    running: Mapping[str, int],
    settings: Mapping[str, Setting],
    future: dict[str, np.ndarray] | None = None,
    slo_s: Mapping[str, float] | None = None,
    pipelines: Mapping[str, PipelineObservation] | None = None,
) -> Observation:
    """The policy's observation of the models in ``snapshots`` (in their order).

    ``running``: replicas serving now; ``settings``: the settings in force (their replicas
    are the last targets set, replicas starting included); ``future``: true upcoming
    arrivals, which only the simulator has; ``slo_s``: each model's SLO, which turns the
    queued requests' waits into remaining budgets. A batch size or thread count the meter
    reports wins over the one set (it is what the replicas run). The capacity: a
    :class:`~faro_serve.resources.Capacity`, or CPUs and memory as two scalars.
    ``pipelines``: each pipeline's end-to-end view (its stages are models of ``snapshots``)."""
    models = {}
    for n, s in snapshots.items():
        budgets = None
        if s.queued_ages_s is not None and slo_s is not None and n in slo_s:
            budgets = np.sort(float(slo_s[n]) - s.queued_ages_s)
        held, r = settings[n], int(running[n])
        # positional, in the order of _OBSERVATION_FIELDS: a third of the time of keywords
        # (the simulator builds one per model per tick)
        models[n] = ModelObservation(
            n,
            r,
            _held(held, n),
            s.arrivals_per_min,
            s.arrival_rate,
            s.latency_ms,
            s.processing_ms,
            s.queue_length,
            s.mean_in_flight / max(r, 1),  # ongoing_per_replica
            float(held.drop_rate or 0.0),
            budgets,
            int(s.threads or 1),
            int(s.batch_size or 1),
            s.mean_batch,
            s.batch_times,
        )
    cap = as_capacity(capacity_cpus, capacity_memory_gb)
    return Observation(
        now=float(now),
        capacity_cpus=cap.cpus,
        capacity_memory_gb=cap.memory_gb,
        models=models,
        future_arrivals_per_min=future,
        capacity=cap,
        pipelines=dict(pipelines or {}),
    )


def decide(policy: Policy, obs: Observation) -> Decision | None:
    """``policy.decide(obs)``. What the policy raises leaves as it was (type, traceback) and
    with the tick's time as ``now`` unless it has one: a caller names the time without
    searching the traceback's frames for the observation."""
    try:
        return policy.decide(obs)
    except Exception as err:
        if not hasattr(err, "now"):
            with contextlib.suppress(AttributeError):  # an exception that takes no attribute
                setattr(err, "now", obs.now)  # any exception type
        raise


@dataclass(frozen=True)
class Applied:
    """A decision made safe to carry out."""

    settings: dict[str, Setting]  # every model's setting after the decision, clamped
    changes: list[tuple[str, int]]  # (model, new target replicas), decreases first
    changed: dict[str, Setting]  # per model, the fields the decision set, clamped

    @property
    def targets(self) -> dict[str, int]:
        return field_map(self.settings, "replicas")

    def field(self, field: str) -> dict[str, Any]:
        """``{model: value}`` of one field the decision set."""
        return field_map(self.changed, field)


def apply_decision(
    decision: Decision,
    current: Mapping[str, Setting | int],
    models: Sequence[ModelSLO],
    capacity_cpus: float | Capacity,
    capacity_memory_gb: float | None = None,
    *,
    policy: str = "policy",
    now: float = 0.0,
) -> Applied:
    """Check and order ``decision`` against the settings in force, ``current`` (a bare
    replica count stands for a setting of only that; see the module docstring).

    Raises :class:`DecisionRefused` (a ``ValueError``) for a decision that is not one, a
    model the cluster does not run, a replica count that is no number >= 0 or a field a
    model cannot take, and :class:`CapacityExceeded` when a decision that grows a model leaves targets
    needing more of any resource (CPUs, memory, GPUs, custom: a
    :class:`~faro_serve.resources.Capacity`, or CPUs and memory as two scalars) than the
    cluster has."""
    if not isinstance(decision, Decision):  # a plug-in's mistake, named (not an AttributeError)
        raise DecisionRefused(
            f"policy {policy!r} returned a {type(decision).__name__} at "
            f"t={now:g}s, not a Decision (autoscaler.contract.policy.Decision) or None",
            now,
        )
    spec = {m.name: m for m in models}
    held = {n: s if isinstance(s, Setting) else Setting(replicas=int(s)) for n, s in current.items()}
    unknown = sorted(set(decision.settings) - set(held))
    if unknown:
        raise DecisionRefused(f"policy {policy!r} named unknown models {unknown} at t={now:g}s", now)
    changed = {}
    for n, s in decision.settings.items():
        r = s.replicas  # clamped to the model's bounds below, but a negative or NaN is a bug
        if r is not None and not (isinstance(r, (int, float, np.number)) and math.isfinite(r) and r >= 0):
            raise DecisionRefused(
                f"policy {policy!r} asked for {r!r} replicas of {n!r} at t={now:g}s (a number >= 0)", now
            )
        try:
            changed[n] = s.clamp(spec[n])
        except ValueError as err:
            raise DecisionRefused(f"policy {policy!r} at t={now:g}s: {err}", now) from None
    after = {n: held[n].merged(changed[n]) if n in changed else held[n] for n in held}
    targets = {n: _held(after[n], n) for n in after}
    before = {n: _held(held[n], n) for n in held}
    # A decision that only shrinks is always carried out: after a restart into a smaller
    # cluster, the targets resumed from the running replicas may exceed it.
    grows = any(targets[n] > before[n] for n in targets)
    cap = as_capacity(capacity_cpus, capacity_memory_gb)
    over = cap.over(usage(targets, {n: demand(spec[n]) for n in targets})) if grows else []
    if over:
        raise CapacityExceeded(f"policy {policy!r} asked for {'; '.join(over)} at t={now:g}s (targets {targets})", now)
    changes = [(n, targets[n]) for n in targets if targets[n] != before[n]]
    changes.sort(key=lambda c: c[1] > before[c[0]])  # decreases first, stable otherwise
    return Applied(after, changes, changed)


def _held(setting: Setting, model: str) -> int:
    """The replica count a held setting carries (every driver's settings hold one)."""
    if setting.replicas is None:
        raise ValueError(f"the setting held for {model!r} has no replica count")
    return int(setting.replicas)
