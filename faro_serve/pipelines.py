"""Pipelines: several models chained or fanned out, with one latency SLO end to end (issue 35).

A pipeline (InferLine's "prediction pipeline", SoCC '20 section 2) is a DAG of stages. Each
stage is a model with its own replicas (a :class:`~faro_serve.config.ModelSLO` in every
other respect); ``after`` names the stages whose output it takes, and ``fraction`` is the
share of the pipeline's queries that visit it (InferLine's scale factor ``s_m``: a
classifier that runs only on the frames a detector flags has ``fraction`` < 1). The SLO
(``slo_ms`` at ``percentile``) is on a query's end-to-end latency: from its arrival at the
entry stages until the last stage it visits is done.

Every stage becomes a model of the cluster (:meth:`PipelineSLO.stage_models`) so that every
policy can scale it; a stage's own ``slo_ms`` is what a policy that plans stages one by one
aims at. Left out, it is the pipeline's SLO split equally along the longest path (the fixed
split baselines use); pipeline-aware policies (Faro, InferLine) plan the end-to-end SLO and
choose the split themselves (docs/pipelines.md).

Pure and Ray-free: the config layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .model_slo import ModelSLO

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class Stage(BaseModel):
    """One stage of a pipeline: a model (its replicas, resources, profile) and its edges.

    Every field of :class:`~faro_serve.config.ModelSLO` is accepted as a flat key (``cpus``,
    ``processing_ms``, ``max_replicas``, ``deployment``, ``batching`` ...) but ``percentile``
    and ``priority``, which are the pipeline's; ``slo_ms`` is optional (see the module)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(
        pattern=_NAME,
        max_length=64,
        description="the stage's model name, unique across the cluster's models and stages",
    )
    after: list[str] = Field(
        default_factory=list,
        description="the stages whose output this stage takes (none: an entry stage, which gets the queries)",
    )
    fraction: float = Field(
        1.0, gt=0, le=1, description="share of the pipeline's queries that visit this stage (InferLine's s_m)"
    )
    slo_ms: float | None = Field(
        None,
        gt=0,
        description="this stage's own target, for "
        "policies that plan stages one by one (default: the "
        "pipeline's SLO split equally along its longest path)",
    )

    @model_validator(mode="after")
    def _model_fields(self) -> "Stage":
        bad = sorted(set(self.model_extra or {}) - set(ModelSLO.model_fields))
        if bad:
            raise ValueError(
                f"stage {self.name!r}: unknown field(s) {', '.join(bad)}; a stage "
                f"takes name, after, fraction, slo_ms and the model fields "
                f"({', '.join(sorted(set(ModelSLO.model_fields) - {'name', 'slo_ms', 'percentile', 'priority', 'pipeline'}))})"
            )
        clash = sorted({"percentile", "priority", "pipeline"} & set(self.model_extra or {}))
        if clash:
            raise ValueError(f"stage {self.name!r}: {', '.join(clash)} belong(s) to the pipeline, not to a stage")
        return self


class PipelineSLO(BaseModel):
    """A pipeline of stages with one end-to-end latency SLO."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_NAME, max_length=64, description="unique pipeline name")
    slo_ms: float = Field(gt=0, description="end-to-end latency target in milliseconds")
    percentile: float = Field(99.0, gt=0, lt=100, description="SLO percentile, e.g. 99")
    priority: float = Field(1.0, gt=0, description="weight in the sum objectives")
    stages: list[Stage] = Field(min_length=1, description="the stages, any order")
    app: str | None = Field(
        None,
        pattern=_NAME,
        max_length=64,
        description="the Serve application the pipeline runs in (default: its name); a stage's own app wins",
    )
    ingress: str | None = Field(
        None,
        max_length=128,
        description="the deployment that takes "
        "the pipeline's queries and calls its stages "
        "(faro_serve.scaled(Ingress, pipeline)): its meter measures "
        "arrivals and end-to-end latency; None: the end-to-end latency "
        "is not measured live",
    )

    @model_validator(mode="after")
    def _dag(self) -> "PipelineSLO":
        names = [s.name for s in self.stages]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pipeline {self.name!r}: stage {dup[0]!r} appears twice")
        known = set(names)
        for s in self.stages:
            for p in s.after:
                if p not in known:
                    raise ValueError(
                        f"pipeline {self.name!r}: stage {s.name!r} comes after "
                        f"unknown stage {p!r} (stages: {', '.join(names)})"
                    )
                if p == s.name:
                    raise ValueError(f"pipeline {self.name!r}: stage {s.name!r} comes after itself")
            parent = max((self.stage(p).fraction for p in s.after), default=1.0)
            if s.fraction > parent + 1e-12:
                raise ValueError(
                    f"pipeline {self.name!r}: stage {s.name!r} has fraction "
                    f"{s.fraction:g}, above its parents' ({parent:g}): a stage "
                    f"only sees queries that visited a stage before it"
                )
        self.order()  # raises on a cycle
        self.stage_models()  # each stage a valid model (raises with the model's own checks)
        return self

    @property
    def app_name(self) -> str:
        """The Serve application the pipeline (its ingress, by default its stages) runs in."""
        return self.app or self.name

    def stage_model(self, name: str) -> ModelSLO:
        """Stage ``name`` as a model of the cluster (what ``faro_serve.scaled`` takes)."""
        for m in self.stage_models():
            if m.name == name:
                return m
        raise KeyError(f"pipeline {self.name!r} has no stage {name!r} (stages: {', '.join(self.stage_names)})")

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"pipeline {self.name!r} has no stage {name!r}")

    @property
    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]

    def order(self) -> list[str]:
        """The stages in topological order (parents first; ties in declaration order);
        ValueError naming the stages of a cycle."""
        left = {s.name: set(s.after) for s in self.stages}
        out: list[str] = []
        while left:
            ready = [n for n in self.stage_names if n in left and not left[n]]
            if not ready:
                raise ValueError(f"pipeline {self.name!r}: its stages form a cycle through {', '.join(sorted(left))}")
            for n in ready:
                out.append(n)
                del left[n]
            for deps in left.values():
                deps.difference_update(ready)
        return out

    @property
    def entries(self) -> list[str]:
        """The stages that receive the pipeline's queries."""
        return [s.name for s in self.stages if not s.after]

    @property
    def sinks(self) -> list[str]:
        """The stages no other stage comes after: a query is done when those it visits are."""
        parents = {p for s in self.stages for p in s.after}
        return [s.name for s in self.stages if s.name not in parents]

    def children(self, name: str) -> list[str]:
        return [s.name for s in self.stages if name in s.after]

    def paths(self) -> list[list[str]]:
        """Every entry-to-sink path, each a list of stage names."""
        out: list[list[str]] = []

        def walk(n: str, path: list[str]) -> None:
            kids = self.children(n)
            if not kids:
                out.append(path)
            for k in kids:
                walk(k, path + [k])

        for e in self.entries:
            walk(e, [e])
        return out

    @property
    def depth(self) -> int:
        """Stages on the longest path."""
        return max(len(p) for p in self.paths())

    def equal_split_ms(self) -> float:
        """A stage's share of the SLO under the fixed equal split: SLO / longest path."""
        return self.slo_ms / self.depth

    def stage_models(self) -> list[ModelSLO]:
        """Each stage as a model of the cluster (its ``pipeline`` set to this pipeline)."""
        split = self.equal_split_ms()
        out = []
        for s in self.stages:
            extra = dict(s.model_extra or {})
            extra.setdefault("app", self.app_name)
            out.append(
                ModelSLO(
                    name=s.name,
                    slo_ms=s.slo_ms if s.slo_ms is not None else split,
                    percentile=self.percentile,
                    priority=self.priority,
                    pipeline=self.name,
                    **extra,
                )
            )
        return out


def expand(models: Sequence[ModelSLO], pipelines: Iterable[PipelineSLO]) -> list[ModelSLO]:
    """The cluster's models: the single ones, then every pipeline's stages; ValueError when
    a name is used twice."""
    out = list(models)
    seen = {m.name: "model" for m in out}
    pipelines = list(pipelines)
    for p in pipelines:
        if p.name in seen:
            raise ValueError(
                f"pipeline {p.name!r} has the name of a model: a pipeline's "
                f"name must differ from every model's and stage's"
            )
    for p in pipelines:
        for m in p.stage_models():
            if m.name in seen:
                raise ValueError(f"pipeline {p.name!r}: stage {m.name!r} has the name of another {seen[m.name]}")
            if m.name in {q.name for q in pipelines}:
                raise ValueError(f"pipeline {p.name!r}: stage {m.name!r} has the name of a pipeline")
            seen[m.name] = f"stage (of pipeline {p.name!r})"
            out.append(m)
    return out


def check_unique(pipelines: Sequence[PipelineSLO]) -> None:
    names = [p.name for p in pipelines]
    for n in names:
        if names.count(n) > 1:
            raise ValueError(f"pipeline name {n!r} appears twice")
