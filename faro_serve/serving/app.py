"""Ray Serve application builders and the Python API (paper section 5, Figure 9).

``serve_config.yaml`` names these builders as ``import_path``:

* ``faro_serve.serving.app:model_app`` for each model: the model deployment (``Model``),
  scaled by the external scaling API, is the HTTP ingress, its queue kept in Ray Serve's
  proxy, and ``Front`` is the model's control plane (``direct.py``, the default
  ``data_path: direct``); with ``data_path: front`` a router front (``Front``) is the
  ingress and sends requests on to the model deployment (``front.py``);
* ``faro_serve.serving.app:autoscaler_app`` once: the autoscaler (``FaroAutoscaler``).

:func:`deploy` does the same from Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from ray import serve
from ray.serve.config import RequestRouterConfig

from ..config import ClusterSpec, ModelSLO
from .direct import DirectModel, Meter
from .front import Front
from .names import AUTOSCALER, AUTOSCALER_APP, METER, MODEL, QUIET
from .proxy_queue import PIPELINE, ProxyQueueRouter
from .routing import IdleFirstRouter
from .schema import ModelAppArgs, parse_autoscaler_config, parse_model_args

# Each replica serves one request at a time (as the paper's M/D/c model and the simulator
# assume). The front's gate queues requests and sends one only when a replica is free; the
# idle-first router picks that replica. A model replica takes up to MODEL_SLOTS requests
# (and serves them one by one) so that Ray's router never probes it before sending. If a
# request ever waits in Ray's router (a replica died under it), the short, nearly flat retry
# backoff hands it over within milliseconds instead of Ray's default of up to 0.5 s.
ROUTER = RequestRouterConfig(initial_backoff_s=0.001, backoff_multiplier=1.5, max_backoff_s=0.01)
MODEL_ROUTER = RequestRouterConfig(
    request_router_class=IdleFirstRouter, initial_backoff_s=0.001, backoff_multiplier=1.5, max_backoff_s=0.01
)
MODEL_SLOTS = 2

# The direct path: the queue waits for completions in the proxy's router, no backoff; a
# replica takes PIPELINE requests, the one it serves and the next.
DIRECT_ROUTER = RequestRouterConfig(request_router_class=ProxyQueueRouter)

# The front runs Ray Serve's documented throughput-optimized mode: its handle to the model
# speaks gRPC, its code and its router run on the replica's own event loop. Direct ingress,
# part of that mode, stays off: the front is reached through Serve's proxy.
FRONT_ACTOR = {
    "num_cpus": 0,
    "runtime_env": {"env_vars": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}},
}


def _model_class(spec: ModelAppArgs) -> tuple[type, dict]:
    """The model class and its arguments; a task with variants: the variant holder."""
    if spec.variants is not None:
        from .variant_model import VariantModel

        variants = {
            spec.initial_variant: _spec_class(spec.model),
            **{n: _spec_class(m) for n, m in spec.variants.items()},
        }
        return VariantModel, {"variants": variants, "initial": spec.initial_variant}
    return _spec_class(spec.model)


def _spec_class(model) -> tuple[type, dict]:
    if model.kind == "synthetic":
        from deployments.synthetic import SyntheticModel

        return SyntheticModel, {"processing": model.processing, "seed": model.seed, "batch_share": model.batch_share}
    from deployments.vision import ImageClassifier

    return ImageClassifier, {
        "arch": model.arch,
        "checkpoint": model.checkpoint,
        "top_k": model.top_k,
        "image_size": model.image_size,
        "threads": model.threads,
        "device": model.device,
        "max_pixels": model.max_pixels,
    }


def model_deployment(args: dict | ModelAppArgs):
    """The model deployment of one model application on the front path (bound, not yet run)."""
    spec = args if isinstance(args, ModelAppArgs) else parse_model_args(args, "model application args")
    cls, kwargs = _model_class(spec)
    dep = serve.deployment(
        cls,
        name=MODEL,
        num_replicas=spec.initial_replicas,
        max_ongoing_requests=MODEL_SLOTS,
        max_queued_requests=spec.queue_limit,
        request_router_config=MODEL_ROUTER,
        ray_actor_options=spec.actor_options(),
    )
    return dep.bind(**kwargs)


def direct_model_app(spec: ModelAppArgs):
    """The direct path: the model replicas serve HTTP, the proxy's router keeps the queue.
    A batching model's replica takes PIPELINE batches: the one it serves and the next."""
    cls, kwargs = _model_class(spec)
    meter = Meter.options(name=METER, logging_config=QUIET).bind(spec.name, replica_cpus=spec.cpus)
    dep = serve.deployment(
        DirectModel,
        name=MODEL,
        num_replicas=spec.initial_replicas,
        max_ongoing_requests=PIPELINE * spec.max_batch_size,
        max_queued_requests=spec.queue_limit,
        request_router_config=DIRECT_ROUTER,
        ray_actor_options=spec.actor_options(),
    )
    return dep.bind(meter, spec.name, cls, kwargs, spec.max_body_kb * 1024, spec.max_batch_size, spec.body_timeout_s)


def model_app(args: dict):
    """Builder of one model's application (``args``: :class:`ModelAppArgs`)."""
    spec = parse_model_args(args, "model application args")
    if spec.data_path == "direct":
        return direct_model_app(spec)
    front = Front.options(name=METER, ray_actor_options=FRONT_ACTOR)
    return front.bind(
        model_deployment(spec),
        spec.name,
        spec.max_body_kb * 1024,
        queue_limit=spec.queue_limit,
        replica_cpus=spec.cpus,
        body_timeout_s=spec.body_timeout_s,
    )


def autoscaler_app(args: dict):
    """Builder of the autoscaler application (``args``: :class:`AutoscalerConfig`).

    The config travels as the deployment's ``user_config``: a change reaches the running
    autoscaler through ``reconfigure`` and never touches model replicas.
    """
    parse_autoscaler_config(args)  # fail the deploy early, naming the field at fault
    from .autoscaler_deployment import FaroAutoscaler

    return FaroAutoscaler.options(name=AUTOSCALER, user_config=dict(args)).bind()


def deploy(
    models: Sequence[tuple[ModelSLO, dict]],
    cluster: ClusterSpec,
    *,
    policy: str | None = None,
    forecaster_dir: str | None = None,
    blocking: bool = False,
    **autoscaler_options,
) -> dict:
    """Deploy every model and the autoscaler on the connected Ray cluster.

    ``models``: pairs of an SLO and that model's app args without ``name`` (e.g.
    ``{"model": {"kind": "synthetic"}, "cpus": 0.25}``). Returns the routes by model name.
    """
    routes = {}
    for slo, app_args in models:
        args = {"name": slo.name, "cpus": slo.cpus, **app_args}
        serve.run(
            model_app(args), name=slo.name, route_prefix=f"/{slo.name}", external_scaler_enabled=True, blocking=False
        )
        routes[slo.name] = f"/{slo.name}/predict"
    run_autoscaler(
        [m for m, _ in models],
        cluster,
        policy=policy,
        blocking=blocking,
        forecaster_dir=forecaster_dir,
        **autoscaler_options,
    )
    return routes


def run_autoscaler(
    models: Sequence[ModelSLO],
    cluster: ClusterSpec,
    *,
    policy: str | None = None,
    blocking: bool = False,
    pipelines: Sequence = (),
    **autoscaler_options,
) -> None:
    """Run the ``faro`` application over ``models`` and ``pipelines`` (its args:
    :class:`AutoscalerConfig`)."""
    config = {
        "cluster": cluster.model_dump(),
        "models": [m.model_dump() for m in models],
        "pipelines": [p.model_dump(exclude_none=True) for p in pipelines],
        "policy": policy,
        **autoscaler_options,
    }
    serve.run(autoscaler_app(config), name=AUTOSCALER_APP, route_prefix=f"/{AUTOSCALER_APP}", blocking=blocking)
