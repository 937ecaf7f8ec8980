"""One model's SLO and what it runs on: ModelSLO with its batching profile and variants
(paper Table 4; issues 20, 22, 34).

Apart from ``faro_serve.config`` so that pipelines (``faro_serve.pipelines``), which are
made of models, sit between the two: config -> pipelines -> model_slo.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .batch_curve import BatchCurve, linear_shape

#: the processing time planned with where a model has neither a measurement nor a prior (ms)
DEFAULT_PROCESSING_MS = 100.0


class Batching(BaseModel):
    """A model whose replicas serve dynamic batches (issues 20, 47): the largest batch a
    replica takes, how long a batch waits to fill, and the batch latency curve ``l(b)``,
    given one of three ways (``faro_serve/batch_curve.py``):

    * ``profile: PATH``, a file ``faro-serve profile`` saved (its ``curve``, or its
      Sponge fit, or rows of ``batch`` and ``latency_s`` such as the H200 profiles, whose
      per-batch medians become the curve's breakpoints);
    * ``latency_ms``: measured points, ``{1: 3.3, 16: 4.3, 64: 9.5}`` (breakpoints);
    * Sponge's affine model ``l(b, c) = gamma b / c + eps / c + delta b + eta`` (seconds, at
      the replica's ``c`` cores);
    * nothing: the curve is measured live from the batches the replicas serve (until then
      the planner takes it that a batch saves nothing, and lets batches form up to the
      largest so that they are measured).

    The planner weighs batch sizes up to the largest with the replica count
    (engine/batched_latency.py); it uses the curve's shape, not its scale: the measured
    processing time sets the scale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gamma: float | None = Field(None, ge=0, description="s per request, parallel (x b / c)")
    eps: float | None = Field(None, ge=0, description="s per batch, parallel (/ c)")
    delta: float | None = Field(None, ge=0, description="s per request, serial (x b)")
    eta: float | None = Field(None, ge=0, description="s per batch, serial")
    latency_ms: dict[int, float] | None = Field(
        None, description="measured time of a batch of each size (ms), e.g. {1: 3.3, 16: 4.3}"
    )
    max_batch_size: int = Field(16, ge=1, le=64, description="largest batch a replica takes")
    batch_wait_s: float = Field(
        0.0,
        ge=0,
        le=1,
        description="how long a batch that is not full waits for more requests (Ray's batch_wait_timeout_s)",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any) -> Any:
        """``profile: PATH`` reads the curve from a saved profile file (module docstring);
        fields given beside it win."""
        if not isinstance(data, dict) or "profile" not in data:
            return data
        data = dict(data)
        path = Path(data.pop("profile"))
        try:
            saved = json.loads(path.read_text())
            found = _curve_fields(saved)
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"batching profile {path}: not a saved profile (faro-serve profile writes one): {err}"
            ) from None
        mine = {k for k in ("gamma", "eps", "delta", "eta", "latency_ms") if data.get(k) is not None}
        if mine:  # the file's curve is replaced by what is given beside it
            found = {
                k: v
                for k, v in found.items()
                if k not in ("gamma", "eps", "delta", "eta", "latency_ms")
                or (k in mine)
                or (k != "latency_ms" and "latency_ms" not in mine and not mine & {"gamma", "eps"})
            }
        return {**found, **data}

    @model_validator(mode="after")
    def _one_curve(self) -> "Batching":
        affine = [self.gamma, self.eps, self.delta, self.eta]
        if any(v is not None for v in affine):
            if self.latency_ms is not None:
                raise ValueError(
                    "give the batch curve once: gamma/eps/delta/eta (Sponge's "
                    "model) or latency_ms (measured points), not both"
                )
            if sum(v or 0.0 for v in affine) <= 0:
                raise ValueError("a batch profile needs a positive time (gamma, eps, delta, eta all 0)")
        if self.latency_ms is not None:
            bad = {b: t for b, t in self.latency_ms.items() if not (b >= 1 and t > 0)}
            if not self.latency_ms or bad:
                raise ValueError(f"latency_ms needs batch sizes >= 1 with times > 0 (got {bad or '{}'})")
        return self

    @property
    def measured(self) -> bool:
        """No curve given: the replicas' own batches measure it (module docstring)."""
        return self.latency_ms is None and all(v is None for v in (self.gamma, self.eps, self.delta, self.eta))

    def curve(self, cores: float = 1.0) -> BatchCurve | None:
        """The batch latency curve at ``cores`` (Sponge's model: its cores; breakpoints:
        as measured); None when it is to be measured live."""
        if self.latency_ms is not None:
            bs = sorted(self.latency_ms)
            return BatchCurve.from_points(bs, [self.latency_ms[b] / 1e3 for b in bs])
        if self.measured:
            return None
        g, e, d, h = (v or 0.0 for v in (self.gamma, self.eps, self.delta, self.eta))
        return BatchCurve.affine(g / cores + d, e / cores + h)

    def shape(self, cores: float = 1.0, bmax: int | None = None) -> np.ndarray:
        """``f(b) = l(b) / l(1)`` for b = 0..``bmax`` (default: the largest batch); a curve
        still to be measured: ``f(b) = b`` (a batch saves nothing)."""
        bmax = self.max_batch_size if bmax is None else bmax
        c = self.curve(cores)
        return linear_shape(bmax) if c is None else c.shape(bmax)

    def share(self, cores: float) -> float:
        """The share of one request's time ``l(1)`` that each further request of a batch
        adds: ``f(2) - 1`` (Sponge's ``s``; 1 for a curve still to be measured)."""
        return float(self.shape(cores, 2)[2] - 1.0)


def _curve_fields(saved: dict) -> dict:
    """The curve of a saved profile file, as Batching's fields."""
    if "curve" in saved:  # faro-serve profile of a deployment: breakpoints in seconds
        pts = BatchCurve.from_dict(saved["curve"]).points
        return {"latency_ms": {int(round(b)): t * 1e3 for b, t in pts if float(b).is_integer()}}
    if "profile" in saved:  # faro-serve profile's Sponge fit (batch x threads)
        return {k: saved["profile"][k] for k in ("gamma", "eps", "delta", "eta") if k in saved["profile"]}
    rows = saved["rows"]  # measured rows: batch, latency_s (and dtype: fp32 where present)
    dtypes = [r.get("dtype") for r in rows]
    keep = "fp32" if "fp32" in dtypes else dtypes[0]
    rows = [r for r in rows if r.get("dtype") == keep]
    if not rows:
        raise ValueError("no rows")
    curve = BatchCurve.from_points([r["batch"] for r in rows], [r["latency_s"] for r in rows])
    return {"latency_ms": {int(round(b)): t * 1e3 for b, t in curve.points}}


class Variant(BaseModel):
    """One variant of a model's task (INFaaS, ATC '21): an architecture with its accuracy, its
    time alone on the model's replica and, if it batches, its batch profile (each batch size
    up to the profile's largest is then a variant of its own, as in INFaaS)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)
    accuracy: float = Field(gt=0, le=100, description="top-1 accuracy, %")
    processing_ms: float = Field(gt=0, description="one request alone on the replica's cpus")
    batching: Batching | None = None
    load_s: float | None = Field(
        None, ge=0, description="time to load it on a replica (default: the cluster's cold start)"
    )


class ModelSLO(BaseModel):
    """One served model and its latency SLO."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description="unique model name (letters, digits, '_', '-', '.')",
    )
    slo_ms: float = Field(gt=0, description="latency target in milliseconds")
    percentile: float = Field(99.0, gt=0, lt=100, description="SLO percentile k, e.g. 99")
    priority: float = Field(1.0, gt=0, description="weight pi in the sum objectives")
    min_replicas: int = Field(1, ge=1, description="never scaled below this")
    max_replicas: int = Field(100, ge=1, description="never scaled above this")
    cpus: float = Field(1.0, gt=0, description="vCPU per replica")
    memory_gb: float = Field(1.0, gt=0, description="GiB of memory per replica")
    gpus: float = Field(0.0, ge=0, description="GPUs per replica, fractions allowed (Ray's num_gpus)")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Ray custom resources per replica, e.g. {accelerator_type:A10G: 0.001}"
    )
    concurrency: int = Field(
        1,
        ge=1,
        le=1024,
        description="requests one replica serves at once "
        "(Ray's max_ongoing_requests); the planner counts a replica as "
        "this many servers of the processing time (docs/concurrency.md); "
        "1: the paper's M/D/c, one at a time",
    )
    app: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description="the Serve application the model runs in (default: its name)",
    )
    deployment: str | None = Field(
        None,
        max_length=128,
        description="the deployment Faro scales in that application (default: faro-serve's own, 'Model')",
    )
    processing_ms: float | None = Field(
        None, gt=0, description="prior per-request processing time; replaced by measurements at run time"
    )
    allow_drop: bool = Field(True, description="penalty objectives may drop this model's requests")
    batching: Batching | None = Field(
        None, description="the replicas serve dynamic batches (profile and largest batch); None: one request at a time"
    )
    variants: list[Variant] | None = Field(
        None, description="variants of this model's task (INFaaS); the first is the one deployed"
    )
    min_accuracy: float | None = Field(
        None,
        gt=0,
        le=100,
        description="the task's accuracy target for variant selection (default: the first variant's)",
    )
    pipeline: str | None = Field(
        None,
        description="the pipeline this model is a stage of (set by PipelineSLO.stage_models; None: a single model)",
    )

    @model_validator(mode="after")
    def _bounds(self) -> "ModelSLO":
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})")
        if self.variants is not None:
            names = [v.name for v in self.variants]
            if not names or len(set(names)) != len(names):
                raise ValueError(f"variants need distinct names, at least one (got {names})")
            acc = self.min_accuracy if self.min_accuracy is not None else self.variants[0].accuracy
            if not any(v.accuracy >= acc and v.processing_ms < self.slo_ms for v in self.variants):
                raise ValueError(f"no variant reaches accuracy {acc:g} within slo_ms {self.slo_ms:g}")
        elif self.min_accuracy is not None:
            raise ValueError("min_accuracy needs variants")
        if self.concurrency > 1 and (self.batching is not None or any(v.batching for v in self.variants or ())):
            raise ValueError(
                f"concurrency {self.concurrency} with batching: a replica either "
                "serves its requests in batches (one batch at a time, the batch "
                "profile's time) or serves up to concurrency requests side by side, "
                "each in the measured time; the planner models each alone, not "
                "both at once (docs/concurrency.md). Set concurrency 1 or drop "
                "batching"
            )
        if self.processing_ms is not None and self.processing_ms >= self.slo_ms:
            raise ValueError(
                f"processing_ms ({self.processing_ms:g}) must be below slo_ms "
                f"({self.slo_ms:g}): no replica count could meet the SLO"
            )
        return self

    def planning_ms(self, measured_ms: float | None = None) -> float:
        """The processing time to plan with (ms): the measured mean, else this model's prior
        ``processing_ms``, else :data:`DEFAULT_PROCESSING_MS` (every policy and the engine
        take this one fallback)."""
        return measured_ms or self.processing_ms or DEFAULT_PROCESSING_MS

    @field_validator("resources")
    @classmethod
    def _custom_resources(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(f"resources: give {name} as cpus/gpus/memory_gb, not as a custom resource")
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
        # min(max(r, lo), hi) without the calls (this runs per model per tick); lo <= hi is validated
        r, lo, hi = int(replicas), self.min_replicas, self.max_replicas
        return lo if r < lo else hi if r > hi else r

    def variant(self, name: str) -> Variant:
        """The variant called ``name``; ValueError when the model has no such variant."""
        for v in self.variants or ():
            if v.name == name:
                return v
        raise ValueError(f"model {self.name!r} has no variant {name!r}")
