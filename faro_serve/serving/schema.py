"""Configuration of the Ray Serve applications, validated like the engine's schema.

``serve_config.yaml`` holds one ``faro`` application (the autoscaler; its ``args`` are an
:class:`AutoscalerConfig`: the cluster, every model's SLO and the policy) and one
application per model (its ``args`` are a :class:`ModelAppArgs`: what to serve and how).
The SLOs live in one place, the autoscaler's config, so that changing one redeploys only
the autoscaler and never restarts model replicas.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autoscaler.driving.loop_config import AutoscalerConfig, parse_autoscaler_config  # noqa: F401 (re-exported)

from ..config import ConfigError, format_validation_error
from ..distributions import PAPER_PROCESSING, parse_dist


class SyntheticModelSpec(BaseModel):
    """A model that sleeps for a drawn processing time: tens of replicas fit on 2 cores."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["synthetic"]
    processing: str = Field(
        str(PAPER_PROCESSING),
        description="seconds: lognorm:SHAPE,LOC,SCALE | const:S | expon:LOC,SCALE (default: the paper's ResNet34)",
    )
    seed: int | None = None
    batch_share: float = Field(
        1.0,
        gt=0,
        le=1,
        description="served in batches: a batch of b takes one drawn time x (share b + 1 - share); 1: no gain",
    )

    @field_validator("processing")
    @classmethod
    def _dist(cls, v: str) -> str:
        parse_dist(v)
        return v


class VisionModelSpec(BaseModel):
    """A torchvision ResNet image classifier (random weights unless a checkpoint is given)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["vision"]
    arch: Literal["resnet18", "resnet34", "resnet50"] = "resnet18"
    checkpoint: str | None = Field(None, description="local state_dict file (.pt/.pth)")
    top_k: int = Field(5, ge=1, le=1000)
    image_size: int = Field(224, ge=32, le=1024)
    threads: int = Field(1, ge=1, le=64, description="torch intra-op threads per replica")
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$",
        description="auto: the GPU the replica holds (gpus > 0), else the CPU; or cpu, cuda, cuda:N",
    )
    max_pixels: int = Field(
        50_000_000,
        ge=1,
        description="an image with more pixels is refused from its header, before decoding (413 too_many_pixels)",
    )


class ModelAppArgs(BaseModel):
    """``args`` of one model application."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description="the model's name: the same as its SLO entry and application",
    )
    model: Annotated[SyntheticModelSpec | VisionModelSpec, Field(discriminator="kind")]
    cpus: float = Field(
        1.0,
        gt=0,
        description="Ray CPUs per replica: must equal the SLO's cpus "
        "(checked when a whole serve config is loaded, and by the autoscaler)",
    )
    gpus: float = Field(0.0, ge=0, description="Ray GPUs per replica: must equal the SLO's gpus")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Ray custom resources per replica: must equal the SLO's resources"
    )
    initial_replicas: int = Field(1, ge=1)
    queue_limit: int = Field(50, ge=1, description="requests queued at the router before 503")
    max_body_kb: int = Field(8192, ge=1, description="larger request bodies get 413")
    body_timeout_s: float | None = Field(
        5.0,
        gt=0,
        description="a request whose body has not "
        "all arrived within this long gets 408 and frees its "
        "replica (null: no bound)",
    )
    data_path: Literal["direct", "front"] = Field(
        "direct",
        description="direct: the model replicas are the HTTP ingress and the queue is "
        "kept in Ray Serve's proxy (one hop, the default); front: requests pass a router front "
        "that also retries a request whose replica died (docs/serving.md, which to pick)",
    )
    variants: dict[str, Annotated[SyntheticModelSpec | VisionModelSpec, Field(discriminator="kind")]] | None = Field(
        None,
        description="the task's other variants by name (INFaaS), each a model spec; `model` "
        "is the variant deployed first, named by `initial_variant`. The autoscaler switches "
        "the variant in force live; direct path only",
    )
    initial_variant: str | None = Field(None, description="the name of `model` among the variants")
    max_batch_size: int = Field(
        1,
        ge=1,
        le=64,
        description="largest batch a replica serves "
        "(serve.batch; the autoscaler or user_config sets the batch in "
        "force up to it); 1: one request at a time. Direct path only",
    )

    def actor_options(self) -> dict:
        """What Ray reserves for one replica: what the planner counts against the capacity."""
        out = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.resources:
            out["resources"] = dict(self.resources)
        return out

    @model_validator(mode="after")
    def _batching_on_the_direct_path(self) -> "ModelAppArgs":
        if self.max_batch_size > 1 and self.data_path != "direct":
            raise ValueError("max_batch_size > 1 needs data_path: direct (the front serves one request per replica)")
        if self.variants is not None:
            if self.data_path != "direct":
                raise ValueError("variants need data_path: direct")
            if self.initial_variant is None:
                raise ValueError("variants need initial_variant: the name of `model`")
            if self.initial_variant in self.variants:
                raise ValueError(
                    f"initial_variant {self.initial_variant!r} is `model`; list only the other variants under variants"
                )
        elif self.initial_variant is not None:
            raise ValueError("initial_variant needs variants")
        return self


def parse_args(cls: type[BaseModel], data, source: str):
    """``data`` validated as ``cls``; a ConfigError naming the field, value and reason."""
    try:
        return cls.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def parse_model_args(data, source: str = "model application args") -> ModelAppArgs:
    return parse_args(ModelAppArgs, data, source)


def check_resources(cfg: AutoscalerConfig, apps: list[ModelAppArgs], source: str) -> None:
    """A ConfigError when a model application's ``cpus`` differs from its SLO's: the planner
    counts the SLO's figure against the capacity while Ray reserves the application's, so a
    mismatch strands or overbooks CPUs. Called wherever a whole serve config is loaded (the
    demo, ``faro-serve kuberay``); the autoscaler checks what the meters report too
    (``faro_serve/meter_report.py``)."""
    slo = {m.name: m for m in cfg.all_models}
    for app in apps:
        if app.name not in slo:
            continue
        m = slo[app.name]
        for what, mine, theirs in (("cpus", app.cpus, m.cpus), ("gpus", app.gpus, m.gpus)):
            if abs(mine - theirs) > 1e-9:
                raise ConfigError(
                    f"{source}: model {app.name!r} has {what} {mine:g} in its "
                    f"application's args but {theirs:g} in the faro "
                    f"application's models; make them agree"
                )
        if dict(app.resources) != dict(m.resources):
            raise ConfigError(
                f"{source}: model {app.name!r} has resources {dict(app.resources)} "
                f"in its application's args but {dict(m.resources)} in the faro "
                f"application's models; make them agree"
            )
