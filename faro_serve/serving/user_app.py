"""Your own deployment under Faro from a Serve config (issue 34): the application builder
``faro_serve.serving.user_app:build``, whose ``args`` name the user's deployment by import
path (Ray's convention) with its init arguments. The SLO itself lives in the ``faro``
application's models, as for faro-serve's own models::

    - name: clf
      route_prefix: /clf
      import_path: faro_serve.serving.user_app:build
      external_scaler_enabled: true
      args: {model: clf, deployment: my_pkg.app:Classifier, init_kwargs: {path: m.pt}, cpus: 0.5}
"""

from __future__ import annotations

import importlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config import ConfigError
from .schema import parse_args
from .user import ScaledDeployment, _check_deployment


class UserAppArgs(BaseModel):
    """``args`` of an application serving a user's deployment under Faro."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        max_length=64,
        description="the model's name: its SLO entry in the faro application",
    )
    deployment: str = Field(
        description="import path of the user's deployment: "
        "'package.module:Name', the class decorated with @serve.deployment"
    )
    init_args: list[Any] = Field(default_factory=list, description="its positional init arguments")
    init_kwargs: dict[str, Any] = Field(default_factory=dict, description="its keyword init arguments")
    cpus: float = Field(1.0, gt=0, description="CPUs per replica: the same as the SLO's cpus")
    gpus: float = Field(0.0, ge=0, description="GPUs per replica: the same as the SLO's gpus")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom resources per replica: the same as the SLO's"
    )
    concurrency: int = Field(1, ge=1, le=1024, description="requests one replica serves at once: the same as the SLO's")
    queue_limit: int = Field(50, ge=1, description="requests queued before 503")
    body_timeout_s: float | None = Field(
        5.0, gt=0, description="a request whose body has not all arrived within this long gets 408 (null: no bound)"
    )
    initial_replicas: int = Field(1, ge=1)

    @field_validator("deployment")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if v.count(":") != 1 or not all(v.split(":")):
            raise ValueError(f"deployment {v!r} is not an import path: write 'package.module:Name'")
        return v


def load_deployment(path: str):
    """The object at ``package.module:Name``; a ConfigError naming what did not import."""
    module, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(module)
    except Exception as err:  # ImportError, or the user's module failing as it imports
        raise ConfigError(
            f"deployment {path!r}: module {module!r} does not import ({type(err).__name__}: {err})"
        ) from None
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"deployment {path!r}: module {module!r} has no {attr!r}")
        obj = getattr(obj, part)
    return _check_deployment(obj, f"deployment {path!r}")


def build(args: dict):
    """Builder of one application serving the user's deployment under Faro."""
    spec = parse_args(UserAppArgs, args, "user application args")
    dep = load_deployment(spec.deployment)
    scaled = ScaledDeployment(
        dep,
        spec.model,
        cpus=spec.cpus,
        gpus=spec.gpus,
        resources=spec.resources,
        concurrency=spec.concurrency,
        queue_limit=spec.queue_limit,
        initial_replicas=spec.initial_replicas,
        body_timeout_s=spec.body_timeout_s,
    )
    return scaled.bind(*spec.init_args, **spec.init_kwargs)
