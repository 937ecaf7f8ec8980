"""The one policy interface behind the live autoscaler and the simulator (paper 4.4, 6.4).

A driver (the Ray actor, or the simulator) calls ``policy.decide(observation)`` every
``policy.tick_s`` seconds with what the meter measured, and applies the returned
:class:`Decision` (replicas, drop rates). Policies keep their own timers. Nothing here
imports Ray, so the same objects run live and simulated: there is one implementation of
each policy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from autoscaler.contract.setting import Setting, field_map
from autoscaler.contract.state import decode, encode
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.pipelines import PipelineSLO
from faro_serve.resources import Capacity, as_capacity, demand, fits_in, resource_names, usage

# right after a start (fewer completed minutes than this) a model's arrival history also holds
# the open minute, extrapolated (autoscaler.driving.driver.with_open_minute)
STARTUP_MINUTES = 2


@dataclass
class ModelObservation:
    """What the meter reports for one model at a decision tick."""

    name: str
    replicas: int  # replicas serving now
    target_replicas: int  # the last target set (includes replicas still starting)
    arrivals_per_min: np.ndarray  # completed-minute arrival counts, oldest first
    arrival_rate: float = 0.0  # requests/s over the last tick
    latency_ms: float | None = None  # SLO-percentile end-to-end latency over the look-back
    processing_ms: float | None = None  # mean measured replica processing time
    queue_length: float = 0.0  # requests waiting at the router
    ongoing_per_replica: float = 0.0  # mean in-flight requests (queued + running) per replica
    drop_rate: float = 0.0  # the drop rate in force
    # batching models (issue 20): the remaining budgets (s) of the queued requests, EDF
    # order, when the meter knows them; the threads and batch size in force
    queued_budgets_s: np.ndarray | None = None
    threads: int = 1
    batch_size: int = 1
    # the request-weighted mean batch behind processing_ms: a batching replica measures its
    # batch's time, p f(b), so one request's time is processing_ms / f(b) (service.py)
    mean_batch: float = 1.0
    # a batching model's recent batches by size: rows of (batch, batches, median seconds),
    # what a batch curve measured live is fitted to (service.py); None: not reported
    batch_times: np.ndarray | None = None


@dataclass
class PipelineObservation:
    """What the meter reports for one pipeline (issue 35): queries at its entry, measured
    end to end at the ingress. Its stages are reported as models (``ModelObservation``)."""

    name: str
    arrivals_per_min: np.ndarray  # completed-minute query counts at the entry, oldest first
    arrival_rate: float = 0.0  # queries/s over the last tick
    latency_ms: float | None = None  # SLO-percentile end-to-end latency over the look-back


@dataclass
class Observation:
    """Everything a policy may look at: the time, the capacity and every model.

    ``capacity`` holds every resource's cap (CPUs, memory, GPUs, custom resources:
    ``faro_serve.resources``); ``capacity_cpus`` and ``capacity_memory_gb`` are its CPUs and
    memory, kept for policies that read only those. Built from the two scalars alone, the
    capacity caps only CPUs and memory."""

    now: float  # seconds since the driver started
    capacity_cpus: float
    capacity_memory_gb: float | None
    models: dict[str, ModelObservation]
    # True per-minute arrivals of the next window; only the simulator gives these, and only
    # the clairvoyant oracle reads them.
    future_arrivals_per_min: dict[str, np.ndarray] | None = None
    # None only as given: __post_init__ builds it from the two scalars, so a policy reads a Capacity
    capacity: Capacity = None  # type: ignore[assignment]
    # each pipeline's end-to-end view (its stages are in ``models``); the oracle's future
    # counts for a pipeline are under its name in future_arrivals_per_min
    pipelines: dict[str, PipelineObservation] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity is None:
            self.capacity = Capacity.of(self.capacity_cpus, self.capacity_memory_gb)


@dataclass(frozen=True)
class ModelPlan:
    """What a planning policy expects for one model at the replicas it chose."""

    replicas: int
    utility: float  # predicted utility over the forecast window
    latency_ms: float | None  # estimated SLO-percentile latency (None: cannot meet it)
    predictor: str  # the forecaster that served this model ("nhits", "fallback", ...)


class Decision:
    """A partial :class:`~autoscaler.contract.setting.Setting` per model (models left out, and fields
    left ``None``, keep theirs), why it was made, and what a planning policy expects.

    Built from per-field maps, as policies think of them (``Decision({"a": 3}, {"a": 0.1},
    threads={"b": 2})``), or from settings (``settings={"a": Setting(replicas=3)}``);
    :meth:`set` adds to it. Read one field of every model with :meth:`field`
    (``replicas`` is short for ``field("replicas")``): the settings are the one record."""

    def __init__(
        self,
        replicas: Mapping[str, int] | None = None,
        drop_rates: Mapping[str, float] | None = None,
        kind: str = "long_term",
        info: dict[str, Any] | None = None,
        plan: dict[str, ModelPlan] | None = None,
        threads: Mapping[str, int] | None = None,
        batch_sizes: Mapping[str, int] | None = None,
        variants: Mapping[str, str] | None = None,
        *,
        settings: Mapping[str, Setting] | None = None,
    ) -> None:
        self.kind = kind  # "long_term", "reactive", "surge", ... (for logs)
        self.info = info if info is not None else {}  # JSON-able details for the decision log
        self.plan = plan if plan is not None else {}  # planning policies: per model
        self.settings: dict[str, Setting] = dict(settings or {})
        for name, values in (
            ("replicas", replicas),
            ("drop_rate", drop_rates),
            ("batch_size", batch_sizes),
            ("threads", threads),
            ("variant", variants),
        ):
            for n, v in (values or {}).items():
                self.set(n, **{name: v})

    def set(self, name: str, **fields: Any) -> "Decision":
        """Set fields of ``name``'s setting (``dec.set("a", variant="resnet50")``)."""
        self.settings[name] = self.settings.get(name, Setting()).merged(Setting(**fields))
        return self

    def field(self, field: str) -> Mapping[str, Any]:
        """``{model: value}`` of one setting field, where this decision sets it (read-only)."""
        return MappingProxyType(field_map(self.settings, field))

    replicas = property(lambda self: self.field("replicas"), doc="target replicas per model")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Decision) and (self.settings, self.kind, self.info, self.plan) == (
            other.settings,
            other.kind,
            other.info,
            other.plan,
        )

    def __repr__(self) -> str:
        return f"Decision({self.kind!r}, {self.settings!r})"


class Policy(ABC):
    """Base of every autoscaling policy, live or simulated."""

    name: str = "policy"
    tick_s: float = 10.0
    #: the attributes a policy keeps between decisions (timers, the time of its last plan,
    #: counters that seed its forecasts); saved by :meth:`get_state` after every tick and
    #: restored by :meth:`set_state` when the autoscaler restarts (``autoscaler.contract.state``)
    state_fields: tuple[str, ...] = ()
    #: the pipelines over this policy's models (:meth:`attach_pipelines`); a policy that
    #: does not read them scales each stage as a model with its own ``slo_ms``
    pipelines: tuple[PipelineSLO, ...] = ()

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec):
        self.models = list(models)
        self.cluster = cluster
        self.slo = {m.name: m for m in self.models}
        self.tick_s = cluster.reactive_interval_s

    @property
    def demand(self) -> dict[str, dict[str, float]]:
        """Per model, what one replica reserves (CPUs, memory, GPUs, custom resources)."""
        return {m.name: demand(m) for m in self.models}

    def attach_pipelines(self, pipelines: Sequence[PipelineSLO]) -> None:
        """Tell the policy which of its models are stages of which pipeline (issue 35);
        ValueError when a stage is not one of its models."""
        for p in pipelines:
            missing = [n for n in p.stage_names if n not in self.slo]
            if missing:
                raise ValueError(f"pipeline {p.name!r}: stage(s) {', '.join(missing)} are not models of this policy")
        self.pipelines = tuple(pipelines)

    @abstractmethod
    def decide(self, obs: Observation) -> Decision | None:
        """Return the new targets, or None to leave everything as it is."""

    def get_state(self) -> dict[str, Any]:
        """This policy's state between decisions, JSON-able."""
        return {
            "policy": self.name,
            "models": sorted(self.slo),
            "fields": {f: encode(getattr(self, f)) for f in self.state_fields},
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Carry on from ``state`` (from :meth:`get_state` of the same policy over the same
        models; raises ``ValueError`` otherwise, and the policy then starts afresh)."""
        if state.get("policy") != self.name or state.get("models") != sorted(self.slo):
            raise ValueError(
                f"saved state is for policy {state.get('policy')!r} over "
                f"{state.get('models')}, not {self.name!r} over {sorted(self.slo)}"
            )
        fields = state.get("fields", {})
        restored = {f: decode(fields[f], getattr(self, f)) for f in self.state_fields if f in fields}
        for f, v in restored.items():  # all decoded before any is set: all or nothing
            setattr(self, f, v)


def grant_in_order(
    wanted: dict[str, int],
    current: dict[str, int],
    models: Iterable[ModelSLO],
    capacity_cpus: float | Capacity,
    capacity_memory_gb: float | None = None,
    order: Iterable[str] | None = None,
    interleave: bool = False,
) -> dict[str, int]:
    """Fit desired replica counts into the capacity, first come first served.

    Decreases are always granted (they free capacity first); increases are granted in
    ``order`` (default: the order of ``wanted``) while capacity remains, each as far as it
    fits. This is how independent per-model autoscalers share a fixed cluster.

    ``interleave``: one replica per model per round, in ``order``, instead of each model's
    whole increase in turn: how Ray places the pending replicas of several deployments when
    CPUs free up (seen live: 10 freed CPUs went 3/3/2/2/0 to five deployments).

    The capacity: a :class:`~faro_serve.resources.Capacity` (every resource a model
    declares counts), or CPUs and memory as two scalars.
    """
    spec = {m.name: m for m in models}
    out = dict(current)
    goal = {}
    for n, w in wanted.items():
        goal[n] = spec[n].clamp(w)
        if goal[n] < out.get(n, 0):
            out[n] = goal[n]
    need = {n: demand(m) for n, m in spec.items()}
    free = as_capacity(capacity_cpus, capacity_memory_gb).free(usage(out, need), resource_names(need))

    def fits(m: ModelSLO) -> bool:
        return fits_in(free, need[m.name])

    queue = [n for n in (order if order is not None else wanted) if n in goal]
    while queue:
        still = []
        for n in queue:
            m = spec[n]
            while out.get(n, 0) < goal[n] and fits(m):
                out[n] = out.get(n, 0) + 1
                for r in free:
                    free[r] -= need[n].get(r, 0.0)
                if interleave:
                    break
            if interleave and out.get(n, 0) < goal[n] and fits(m):
                still.append(n)
        queue = still
    return out
