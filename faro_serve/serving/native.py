"""``ray-native``: the models on plain Ray Serve under Ray's own autoscaler, the live baseline.

What faro-serve's users run today, and what a live claim must beat: each model is one Ray
Serve deployment with Ray's ``autoscaling_config`` (Ray's defaults unless set), no router
front and no faro autoscaler; Ray's controller decides the replicas. Replicas take
``cpus`` Ray CPUs each, so on a cluster started with the CPU budget the replicas beyond it
stay pending in Ray, as in a real fixed cluster.

The replica is the HTTP ingress at ``<route_prefix>/predict`` with the same body rules as
faro-serve's paths (413 past the size limit, 400 for a bad JSON body) and the same model
classes, so a replay sends both systems the very same requests. Nothing here drops or
meters: overload queues in Ray, as Ray does it, up to the deployment's
``max_queued_requests`` if set (past it Ray's proxy answers 503 at once; ``ray-tuned``).
"""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from ray import serve

from .names import MODEL  # the deployment faro-serve's tools count replicas of
from .payload import read_payload, run_model
from .schema import ModelAppArgs, parse_args

api = FastAPI(
    title="plain Ray Serve model endpoint (ray-native)",
    description="Inference on a deployment autoscaled by Ray Serve itself.",
)


class NativeAppArgs(ModelAppArgs):
    """``args`` of a ``ray-native`` model application: a model application's, plus Ray's
    ``autoscaling_config`` (merged over ``min_replicas: 1``, ``max_replicas: 100``; every
    other field Ray's default)."""

    autoscaling_config: dict = Field(
        default_factory=dict, description="Ray Serve's autoscaling_config for this deployment"
    )
    max_ongoing_requests: int | None = Field(
        default=None,
        ge=1,
        description="Ray Serve's max_ongoing_requests: requests sent to a replica at once (None: Ray's default, 5)",
    )
    max_queued_requests: int | None = Field(
        default=None,
        ge=-1,
        description="Ray Serve's max_queued_requests: requests queued at "
        "each caller (the proxy) before Ray answers 503 (None: Ray's default, -1, no limit)",
    )


@serve.ingress(api)
class NativeModel:
    def __init__(self, name: str, model_cls: type, model_kwargs: dict, max_body_bytes: int = 8 << 20):
        self.name = name
        self.model = model_cls(**model_kwargs)
        self.max_body_bytes = max_body_bytes

    @api.post(
        "/predict",
        summary="Run the model on one request",
        description='Body: JPEG/PNG bytes, or JSON {"image": base64}.',
    )
    async def predict(self, request: Request):
        payload = await read_payload(request, self.name, self.max_body_bytes)
        if isinstance(payload, JSONResponse):
            return payload
        return await run_model(self.model, self.name, payload)


def native_autoscaling(spec: NativeAppArgs) -> dict:
    return {"min_replicas": 1, "max_replicas": 100, **spec.autoscaling_config}


def native_app(args: dict):
    """``import_path: faro_serve.serving.native:native_app``: one model on plain Ray Serve."""
    from .app import _model_class

    spec = parse_args(NativeAppArgs, args, "ray-native model application args")
    cls, kwargs = _model_class(spec)
    options = {k: v for k in ("max_ongoing_requests", "max_queued_requests") if (v := getattr(spec, k)) is not None}
    dep = serve.deployment(
        NativeModel,
        name=MODEL,
        autoscaling_config=native_autoscaling(spec),
        ray_actor_options=spec.actor_options(),
        **options,
    )
    return dep.bind(spec.name, cls, kwargs, spec.max_body_kb * 1024)
