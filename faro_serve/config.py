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

from .model_slo import Batching as Batching
from .model_slo import ModelSLO as ModelSLO
from .model_slo import Variant as Variant
from .pipelines import PipelineSLO, check_unique, expand
from .resources import CPU, MEMORY, Capacity, as_capacity, demand, unit

Objective = Literal["sum", "fair", "fair_sum", "penalty_sum", "penalty_fair_sum"]
Estimator = Literal["mdc", "upper", "mdc-exact"]


class ConfigError(ValueError):
    """A configuration file or object is invalid; the message names field, value and reason."""


class ClusterSpec(BaseModel):
    """The fixed-size cluster and the autoscaler's settings (paper sections 3.2, 4.4)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(gt=0, description="total vCPU the models may use")
    memory_gb: float | None = Field(None, gt=0, description="total GiB; None = not binding")
    gpus: float | None = Field(
        None,
        ge=0,
        description="total GPUs the models may use; None = "
        "what the Ray cluster has (not binding where there is no Ray "
        "cluster: simulate, plan)",
    )
    resources: dict[str, float] | None = Field(
        None,
        description="caps per Ray custom resource "
        "(names as in ModelSLO.resources); a resource "
        "not named: what the Ray cluster has",
    )
    objective: Objective = "fair_sum"
    gamma: float | None = Field(None, ge=0, description="fairness weight; default = number of models")
    alpha: float = Field(1.0, gt=0, description="utility exponent")
    rho_max: float = Field(0.95, gt=0, lt=1, description="relaxation knob of M/D/c")
    groups: int | None = Field(None, ge=1, description="hierarchical groups G; default 1 below 50 models, 10 from 50")
    group_max: int = Field(
        20,
        ge=2,
        description="a group of more models than this is "
        "itself solved in groups of about 10 (ours, issue 36: at 1,000 "
        "models G = 10 would leave 100 models to each COBYLA)",
    )
    plan_deadline_s: float | None = Field(
        10.0,
        gt=0,
        description="time budget of one plan: "
        "past it the remaining COBYLA solves are skipped "
        "(integer starts only) and the decision says so "
        "(Allocation.fallback)"
        "; None: no deadline",
    )
    estimator: Estimator = "mdc"
    long_term_interval_s: float = Field(300.0, gt=0)
    window_s: float = Field(420.0, gt=0)
    cold_start_s: float = Field(65.0, ge=0)
    reactive_interval_s: float = Field(10.0, gt=0)
    reactive_trigger_s: float = Field(30.0, gt=0)
    surge: bool = Field(
        True,
        description="surge response (ours, after Knative's panic mode): "
        "when the last tick's arrival rate is surge_factor x what a model's "
        "target replicas serve within the SLO, add what it needs at once, "
        "within free capacity",
    )
    surge_factor: float = Field(
        2.0,
        gt=1,
        description="how many times the rate the target "
        "replicas serve the last tick's rate must reach before the "
        "surge rule acts",
    )
    surge_new: bool = Field(
        True,
        description="a new deployment (history shorter than two "
        "minutes, about its first 70 s) surges as soon as its rate exceeds "
        "what its target replicas serve within the SLO, not twice it "
        "(issue 31, cold start)",
    )
    surge_plan: bool = Field(
        True,
        description="when the surging models' needs do not all fit "
        "in the free capacity, plan the whole cluster at the rates seen "
        "now instead of granting them in turn (at most once per "
        "replan_gap_s, and at a new deployment's start)",
    )
    replan: bool = Field(
        True,
        description="re-plan on surprise (ours, issue 31): between "
        "the long-term plans, re-solve the whole cluster when a model's rate "
        "leaves its forecast band for replan_trigger_s, or (replan_latency) "
        "its latency breaks the SLO for reactive_trigger_s; never under heavy "
        "overload (the observed need over overload_guard x the capacity)",
    )
    replan_margin: float = Field(
        0.25,
        ge=0,
        description="the forecast band p10..p90 is widened by this share before a rate outside it is a surprise",
    )
    replan_trigger_s: float = Field(30.0, gt=0, description="the rate averaged over this long must be outside the band")
    replan_gap_s: float = Field(
        60.0, ge=0, description="no re-plan within this long of the last plan or re-plan (hysteresis)"
    )
    replan_latency: bool = Field(
        True, description="a model over its SLO for reactive_trigger_s also triggers a re-plan"
    )
    replan_down: bool = Field(
        False, description="a rate below the band triggers a re-plan too (by default only a rate above it does)"
    )
    replan_min_gain: float = Field(
        0.01,
        ge=0,
        description="each change a re-plan makes to a "
        "model that did not trigger it must gain the cluster "
        "objective this much (window utilities, cold start "
        "included), else it is undone: no reshuffling for nothing",
    )
    replan_scope: Literal["cluster", "groups"] = Field(
        "cluster",
        description="what a re-plan plans: 'cluster', every model; 'groups', only the "
        "planner's groups (paper 3.4, 50 models or more) of the models that triggered it, "
        "within what those hold and what is free: about half a re-plan's cost at 100 "
        "models, 2 % more lost utility on day 10 (autoscaler/faro/replan.py)",
    )
    moves: bool = Field(
        True,
        description="move replicas in a full cluster (ours, issue 31): "
        "a model over its SLO with no free capacity takes a replica from the "
        "model whose loss costs the cluster objective least, when the "
        "objective gains and the donor stays within its SLO with one fewer",
    )
    move_min_gain: float = Field(
        0.01, ge=0, description="the least gain of the cluster objective (window utilities) that pays for a move"
    )
    overload_guard: float | None = Field(
        1.25,
        gt=0,
        description="under heavy overload (the "
        "replicas the observed rates need over this x the "
        "capacity) a long-term plan of a fairness objective may "
        "not cut a model below what its observed rate needs "
        "(ours, autoscaler/faro/guard.py); None: off",
    )
    fair_tiebreak: float = Field(
        1e-3, ge=0, description="weight of mean utility added to 'fair' so equally fair allocations prefer more utility"
    )
    shrink: bool = Field(True, description="run the shrink pass (paper section 4.3)")
    solver: Literal["nlopt", "scipy"] = Field(
        "nlopt", description="COBYLA implementation: NLopt (compiled) or scipy.optimize (pure Python)"
    )
    seed: int = 0

    @field_validator("resources")
    @classmethod
    def _resource_caps(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for name, amount in (v or {}).items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"resources: give {name} as cpus/gpus/memory_gb, not as a custom resource")
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
    models: list[ModelSLO] = Field(default_factory=list, description="the single models")
    pipelines: list[PipelineSLO] = Field(
        default_factory=list,
        description="pipelines, each "
        "with one end-to-end SLO; their stages are models "
        "of the cluster too (faro_serve.pipelines)",
    )

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
        if not self.models and not self.pipelines:
            raise ValueError("give at least one model or pipeline")
        check_unique(self.pipelines)
        check_minimums_fit(self.all_models, Capacity.of_cluster(self.cluster))
        return self

    @property
    def all_models(self) -> list[ModelSLO]:
        """Every model the autoscaler scales: the single models, then each pipeline's stages."""
        return expand(self.models, self.pipelines)


def check_minimums_fit(models: list[ModelSLO], cpus: "float | Capacity", memory_gb: float | None = None) -> None:
    """Raise ValueError when the models' minimum replicas alone exceed the capacity: CPUs
    and memory as given, or every resource of a :class:`~faro_serve.resources.Capacity`."""
    cap = as_capacity(cpus, memory_gb)
    need: dict[str, float] = {}
    for m in models:
        for r, a in demand(m).items():
            need[r] = need.get(r, 0.0) + m.min_replicas * a
    for r in sorted(need, key=lambda r: ({CPU: 0, MEMORY: 1}.get(r, 2), r)):  # CPUs first
        if need[r] > cap[r] + 1e-9:
            raise ValueError(f"the models' min_replicas need {need[r]:g} {unit(r)} but the cluster has {cap[r]:g}")


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
        raise ConfigError(
            f"invalid configuration{f' in {source}' if source else ''}: expected a "
            f"mapping with 'cluster' and 'models', got {type(data).__name__}"
        )
    try:
        return FaroConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def faro_applications(serve_config: Any) -> list[dict[str, Any]]:
    """The applications of a Ray Serve config (``applications``, as serve_config.yaml) that
    run faro-serve's autoscaler (``import_path`` ending ``:autoscaler_app``): where a Serve
    config keeps its SLOs. One rule for every reader (``kuberay``, ``simulate --config``)."""
    apps = serve_config.get("applications") if isinstance(serve_config, dict) else None
    return [
        a
        for a in (apps if isinstance(apps, list) else [])
        if isinstance(a, dict) and str(a.get("import_path", "")).endswith(":autoscaler_app")
    ]


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
