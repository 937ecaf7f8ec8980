"""SLO and cluster schema: one pydantic model for Python, YAML and JSON (paper Table 4).

Units are the ones people write: milliseconds for latencies, seconds for intervals, CPUs
and GiB for resources. The engine converts to seconds internally.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .resources import CPU, MEMORY, Capacity, as_capacity, demand, unit

Objective = Literal["sum", "fair", "fair_sum", "penalty_sum", "penalty_fair_sum"]
Estimator = Literal["mdc", "upper", "mdc-exact"]


class ConfigError(ValueError):
    """A configuration file or object is invalid; the message names field, value and reason."""


class Batching(BaseModel):
    """A model whose replicas serve dynamic batches: Sponge's profile
    ``l(b, c) = gamma b / c + eps / c + delta b + eta`` seconds (what ``faro-serve profile``
    fits and saves) and the largest batch a replica may take. The planner weighs batch sizes
    up to it with the replica count (engine/batched_latency.py); the profile's shape, not
    its scale, is what it uses: the measured processing time sets the scale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gamma: float = Field(ge=0, description="s per request, parallel (x b / c)")
    eps: float = Field(ge=0, description="s per batch, parallel (/ c)")
    delta: float = Field(0.0, ge=0, description="s per request, serial (x b)")
    eta: float = Field(0.0, ge=0, description="s per batch, serial")
    max_batch_size: int = Field(16, ge=1, le=64, description="largest batch a replica takes")

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any) -> Any:
        """``profile: PATH`` reads the four parameters from a saved ``faro-serve profile``
        file (its ``profile`` entry); parameters given beside it win."""
        if not isinstance(data, dict) or "profile" not in data:
            return data
        data = dict(data)
        path = Path(data.pop("profile"))
        try:
            saved = json.loads(path.read_text())["profile"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"batching profile {path}: not a saved profile "
                             f"(faro-serve profile writes one): {err}") from None
        return {**{k: saved[k] for k in ("gamma", "eps", "delta", "eta") if k in saved}, **data}

    @model_validator(mode="after")
    def _positive(self) -> "Batching":
        if self.gamma + self.eps + self.delta + self.eta <= 0:
            raise ValueError("a batch profile needs a positive time (gamma, eps, delta, eta all 0)")
        return self

    def share(self, cores: float) -> float:
        """The share of one request's time ``l(1, cores)`` that each request of a batch adds."""
        per_request = self.gamma / cores + self.delta
        return per_request / (per_request + self.eps / cores + self.eta)


class Variant(BaseModel):
    """One variant of a model's task (INFaaS, ATC '21): an architecture with its accuracy, its
    time alone on the model's replica and, if it batches, its batch profile (each batch size
    up to the profile's largest is then a variant of its own, as in INFaaS)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    accuracy: float = Field(gt=0, le=100, description="top-1 accuracy, %")
    processing_ms: float = Field(gt=0, description="one request alone on the replica's cpus")
    batching: Batching | None = None
    load_s: float | None = Field(None, ge=0, description="time to load it on a replica "
                                 "(default: the cluster's cold start)")


class ModelSLO(BaseModel):
    """One served model and its latency SLO."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64,
                      description="unique model name (letters, digits, '_', '-', '.')")
    slo_ms: float = Field(gt=0, description="latency target in milliseconds")
    percentile: float = Field(99.0, gt=0, lt=100, description="SLO percentile k, e.g. 99")
    priority: float = Field(1.0, gt=0, description="weight pi in the sum objectives")
    min_replicas: int = Field(1, ge=1, description="never scaled below this")
    max_replicas: int = Field(100, ge=1, description="never scaled above this")
    cpus: float = Field(1.0, gt=0, description="vCPU per replica")
    memory_gb: float = Field(1.0, gt=0, description="GiB of memory per replica")
    gpus: float = Field(0.0, ge=0, description="GPUs per replica, fractions allowed (Ray's num_gpus)")
    resources: dict[str, float] = Field(default_factory=dict, description="Ray custom resources "
                                        "per replica, e.g. {accelerator_type:A10G: 0.001}")
    concurrency: int = Field(1, ge=1, le=1024, description="requests one replica serves at once "
                             "(Ray's max_ongoing_requests); the planner counts a replica as "
                             "this many servers of the processing time (docs/concurrency.md); "
                             "1: the paper's M/D/c, one at a time")
    app: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64,
                            description="the Serve application the model runs in (default: "
                            "its name)")
    deployment: str | None = Field(None, max_length=128, description="the deployment Faro scales "
                                   "in that application (default: faro-serve's own, 'Model')")
    processing_ms: float | None = Field(None, gt=0, description="prior per-request processing "
                                        "time; replaced by measurements at run time")
    allow_drop: bool = Field(True, description="penalty objectives may drop this model's requests")
    batching: Batching | None = Field(None, description="the replicas serve dynamic batches "
                                      "(profile and largest batch); None: one request at a time")
    variants: list[Variant] | None = Field(None, description="variants of this model's task "
                                           "(INFaaS); the first is the one deployed")
    min_accuracy: float | None = Field(None, gt=0, le=100, description="the task's accuracy "
                                       "target for variant selection (default: the first variant's)")

    @model_validator(mode="after")
    def _bounds(self) -> "ModelSLO":
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is below min_replicas "
                             f"({self.min_replicas})")
        if self.variants is not None:
            names = [v.name for v in self.variants]
            if not names or len(set(names)) != len(names):
                raise ValueError(f"variants need distinct names, at least one (got {names})")
            acc = self.min_accuracy if self.min_accuracy is not None else self.variants[0].accuracy
            if not any(v.accuracy >= acc and v.processing_ms < self.slo_ms for v in self.variants):
                raise ValueError(f"no variant reaches accuracy {acc:g} within slo_ms {self.slo_ms:g}")
        elif self.min_accuracy is not None:
            raise ValueError("min_accuracy needs variants")
        if self.concurrency > 1 and (self.batching is not None
                                     or any(v.batching for v in self.variants or ())):
            raise ValueError(f"concurrency {self.concurrency} with batching: a replica either "
                             "serves its requests in batches (one batch at a time, the batch "
                             "profile's time) or serves up to concurrency requests side by side, "
                             "each in the measured time; the planner models each alone, not "
                             "both at once (docs/concurrency.md). Set concurrency 1 or drop "
                             "batching")
        if self.processing_ms is not None and self.processing_ms >= self.slo_ms:
            raise ValueError(f"processing_ms ({self.processing_ms:g}) must be below slo_ms "
                             f"({self.slo_ms:g}): no replica count could meet the SLO")
        return self

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"resources: give {name} as cpus/gpus/memory_gb, not as a "
                                 "custom resource")
            if not amount > 0:
                raise ValueError(f"resources: {name} must be > 0 per replica (got {amount!r})")
        return v

    @property
    def app_name(self) -> str:
        """The Serve application this model runs in."""
        return self.app or self.name

    @property
    def deployment_name(self) -> str:
        """The deployment the autoscaler scales (faro-serve's own model apps: ``Model``)."""
        return self.deployment or "Model"

    def clamp(self, replicas: float) -> int:
        """``replicas`` as a whole count within this model's bounds."""
        return int(min(max(int(replicas), self.min_replicas), self.max_replicas))

    def variant(self, name: str) -> Variant:
        """The variant called ``name``; ValueError when the model has no such variant."""
        for v in self.variants or ():
            if v.name == name:
                return v
        raise ValueError(f"model {self.name!r} has no variant {name!r}")


class ClusterSpec(BaseModel):
    """The fixed-size cluster and the autoscaler's settings (paper sections 3.2, 4.4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(gt=0, description="total vCPU the models may use")
    memory_gb: float | None = Field(None, gt=0, description="total GiB; None = not binding")
    gpus: float | None = Field(None, ge=0, description="total GPUs the models may use; None = "
                               "what the Ray cluster has (not binding where there is no Ray "
                               "cluster: simulate, plan)")
    resources: dict[str, float] | None = Field(None, description="caps per Ray custom resource "
                                                "(names as in ModelSLO.resources); a resource "
                                                "not named: what the Ray cluster has")
    objective: Objective = "fair_sum"
    gamma: float | None = Field(None, ge=0, description="fairness weight; default = number of models")
    alpha: float = Field(1.0, gt=0, description="utility exponent")
    rho_max: float = Field(0.95, gt=0, lt=1, description="relaxation knob of M/D/c")
    groups: int | None = Field(None, ge=1, description="hierarchical groups G; default 1 "
                               "below 50 models, 10 from 50")
    estimator: Estimator = "mdc"
    long_term_interval_s: float = Field(300.0, gt=0)
    window_s: float = Field(420.0, gt=0)
    cold_start_s: float = Field(65.0, ge=0)
    reactive_interval_s: float = Field(10.0, gt=0)
    reactive_trigger_s: float = Field(30.0, gt=0)
    surge: bool = Field(True, description="surge response (ours, after Knative's panic mode): "
                        "when the last tick's arrival rate is surge_factor x what a model's "
                        "target replicas serve within the SLO, add what it needs at once, "
                        "within free capacity")
    surge_factor: float = Field(2.0, gt=1, description="how many times the rate the target "
                                "replicas serve the last tick's rate must reach before the "
                                "surge rule acts")
    replan: bool = Field(False, description="re-plan on surprise (ours, issue 31): between "
                         "the long-term plans, re-solve the whole cluster when a model's rate "
                         "leaves its forecast band for replan_trigger_s, or (replan_latency) "
                         "its latency breaks the SLO for reactive_trigger_s")
    replan_margin: float = Field(0.25, ge=0, description="the forecast band p10..p90 is "
                                 "widened by this share before a rate outside it is a surprise")
    replan_trigger_s: float = Field(30.0, gt=0, description="the rate averaged over this "
                                    "long must be outside the band")
    replan_gap_s: float = Field(60.0, ge=0, description="no re-plan within this long of the "
                                "last plan or re-plan (hysteresis)")
    replan_latency: bool = Field(False, description="a model over its SLO for "
                                 "reactive_trigger_s also triggers a re-plan")
    replan_down: bool = Field(False, description="a rate below the band triggers a re-plan "
                              "too (by default only a rate above it does)")
    replan_min_gain: float = Field(0.01, ge=0, description="each change a re-plan makes to a "
                                   "model that did not trigger it must gain the cluster "
                                   "objective this much (window utilities, cold start "
                                   "included), else it is undone: no reshuffling for nothing")
    moves: bool = Field(True, description="move replicas in a full cluster (ours, issue 31): "
                        "a model over its SLO with no free capacity takes a replica from the "
                        "model whose loss costs the cluster objective least, when the "
                        "objective gains and the donor stays within its SLO with one fewer")
    move_min_gain: float = Field(0.01, ge=0, description="the least gain of the cluster "
                                 "objective (window utilities) that pays for a move")
    fair_tiebreak: float = Field(1e-3, ge=0, description="weight of mean utility added to "
                                 "'fair' so equally fair allocations prefer more utility")
    shrink: bool = Field(True, description="run the shrink pass (paper section 4.3)")
    solver: Literal["nlopt", "scipy"] = Field("nlopt", description="COBYLA implementation: "
                                              "NLopt (compiled) or scipy.optimize (pure Python)")
    seed: int = 0

    @field_validator("resources")
    @classmethod
    def _resource_caps(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for name, amount in (v or {}).items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"resources: give {name} as cpus/gpus/memory_gb, not as a "
                                 "custom resource")
            if not amount >= 0:
                raise ValueError(f"resources: {name} must be >= 0 (got {amount!r})")
        return v

    def resolved_gamma(self, n_models: int) -> float:
        return float(n_models) if self.gamma is None else float(self.gamma)

    def resolved_groups(self, n_models: int) -> int:
        g = self.groups if self.groups is not None else (1 if n_models < 50 else 10)
        return max(1, min(g, n_models))


class FaroConfig(BaseModel):
    """A cluster and its models, as written in YAML/JSON or built in Python."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: ClusterSpec
    models: list[ModelSLO] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _unique(cls, models: list[ModelSLO]) -> list[ModelSLO]:
        seen: set[str] = set()
        for m in models:
            if m.name in seen:
                raise ValueError(f"model name {m.name!r} appears twice")
            seen.add(m.name)
        return models

    @model_validator(mode="after")
    def _minimums_fit(self) -> "FaroConfig":
        check_minimums_fit(self.models, Capacity.of_cluster(self.cluster))
        return self


def check_minimums_fit(models, cpus: "float | Capacity", memory_gb: float | None = None) -> None:
    """Raise ValueError when the models' minimum replicas alone exceed the capacity: CPUs
    and memory as given, or every resource of a :class:`~faro_serve.resources.Capacity`."""
    cap = as_capacity(cpus, memory_gb)
    need: dict[str, float] = {}
    for m in models:
        for r, a in demand(m).items():
            need[r] = need.get(r, 0.0) + m.min_replicas * a
    for r in sorted(need, key=lambda r: ({CPU: 0, MEMORY: 1}.get(r, 2), r)):  # CPUs first
        if need[r] > cap[r] + 1e-9:
            raise ValueError(f"the models' min_replicas need {need[r]:g} {unit(r)} but the "
                             f"cluster has {cap[r]:g}")


def format_validation_error(err: ValidationError, source: str = "") -> str:
    """One line per problem: where (dotted path), the value given, and why."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e.get("loc", ())) or "(top level)"
        msg = e.get("msg", "invalid").removeprefix("Value error, ")
        val = e.get("input")
        shown = "" if isinstance(val, (dict, list)) or val is None else f" (got {val!r})"
        lines.append(f"{loc}: {msg}{shown}")
    head = f"invalid configuration{f' in {source}' if source else ''}:"
    return head + "\n  " + "\n  ".join(lines)


def parse_config(data: Any, source: str = "") -> FaroConfig:
    """Validate a dict into a :class:`FaroConfig`, raising :class:`ConfigError` with a clear message."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration{f' in {source}' if source else ''}: expected a "
                          f"mapping with 'cluster' and 'models', got {type(data).__name__}")
    try:
        return FaroConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_document(path: str | Path) -> Any:
    """Read a YAML or JSON file, raising :class:`ConfigError` when it cannot be read or parsed."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read {p}: {err.strerror or err}") from None
    try:
        if p.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot parse {p}: {err}") from None
