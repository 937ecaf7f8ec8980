"""Your own Ray Serve deployment under Faro (issue 34): the public API.

``scaled(MyDeployment, slo)`` returns the user's deployment with Faro attached, to
``.bind()`` as usual (alone, or inside a composed application):

* the user's class runs unchanged, as a subclass whose ``__call__`` and public methods pass
  through a :class:`~faro_serve.serving.replica_guard.ReplicaGuard` (drop control, at most
  ``slo.concurrency`` requests at once, processing times and failures to the meter); its
  ``@serve.batch`` methods stay Ray's batches, gated, timed and sized by Faro
  (``batch_method.py``, issue 47);
* Faro's request router (``proxy_queue.ProxyQueueRouter``) keeps the queue wherever the
  deployment is called from (Serve's proxy for HTTP, the caller's replica for a handle) and
  measures arrivals and end-to-end latency there; Ray's ``max_queued_requests`` answers 503
  past the queue limit;
* a meter deployment (``direct.Meter``, named :func:`meter_name`) in the same application,
  which the autoscaler reads and controls;
* the replica count is Faro's (the external scaling API): Ray's autoscaling is turned off.

``scaled(Stage, pipeline, stage="name")`` scales a pipeline's stage (issue 35) exactly so;
``scaled(Ingress, pipeline)`` meters the deployment that takes the pipeline's queries (its
router measures arrivals and end-to-end latency) and leaves its replicas as the user set them.

``run(apps, models, cluster)`` deploys the applications and the autoscaler over them
(``models`` may hold pipelines beside single models).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Application, Deployment

from ..config import ClusterSpec, ConfigError, ModelSLO
from ..model_slo import Batching
from ..pipelines import PipelineSLO
from .batch_method import BatchMethod, batch_methods
from .direct import Meter
from .guarded_class import guarded_class
from .names import QUIET, meter_name
from .proxy_queue import PIPELINE, ProxyQueueRouter
from .replica_guard import Dropped, ReplicaGuard, run_user  # noqa: F401 (Dropped re-exported)

_SCALED: dict[str, str] = {}  # model -> its deployment, as scaled() was last called in this process
_BATCHING: dict[str, Batching] = {}  # model -> the batching scaled() found in its deployment


class ScaledDeployment:
    """A user's deployment with Faro attached: ``.bind(*args, **kwargs)`` as Ray's own.
    ``model``: the model's name (its SLO's); what one replica reserves in Ray's terms and
    how many requests it serves at once, as the SLO declares them."""

    def __init__(
        self,
        deployment: Deployment,
        model: str,
        *,
        cpus: float = 1.0,
        gpus: float = 0.0,
        resources: Mapping[str, float] | None = None,
        concurrency: int = 1,
        queue_limit: int = 50,
        initial_replicas: int | None = 1,
        batching: Batching | None = None,
        body_timeout_s: float | None = 5.0,
    ):
        cls = deployment.func_or_class
        if isinstance(cls, str) or not inspect.isclass(cls):
            raise ConfigError(
                f"{deployment.name}: Faro scales deployment classes; this deployment "
                "is a function (wrap it in a class with __call__)"
            )
        self.deployment, self.model, self.cpus = deployment, model, cpus
        self.batch_methods = batch_methods(cls)
        self.batching = detected_batching(deployment.name, self.batch_methods, batching, concurrency)
        actor = dict(deployment.ray_actor_options or {})
        actor.update({"num_cpus": cpus, "num_gpus": gpus})
        if resources:
            actor["resources"] = {**actor.get("resources", {}), **resources}
        ongoing, slots, guard_batching = concurrency + 1, concurrency, None
        if self.batch_methods:
            # the one batch it serves and the next forming, of the largest, per concurrent
            # batch (Ray: at least max_batch_size x max_concurrent_batches); the gate, not
            # the slots, decides what enters the batch
            most = self.batching.max_batch_size
            concurrent = max(m.concurrent for m in self.batch_methods)
            ongoing = slots = PIPELINE * most * concurrent
            guard_batching = {
                "methods": self.batch_methods,
                "max_batch_size": most,
                "concurrent": concurrent,
                "wait_s": self.batching.batch_wait_s,
            }
            concurrency = 1  # to the router: one batch at a time, two batches held (proxy_queue.py)
        router = RequestRouterConfig(
            request_router_class=ProxyQueueRouter,
            request_router_kwargs={"meter": meter_name(deployment.name), "concurrency": concurrency},
        )
        options = dict(
            func_or_class=guarded_class(cls, model, slots, guard_batching, body_timeout_s),
            max_ongoing_requests=ongoing,
            max_queued_requests=queue_limit,
            request_router_config=router,
            ray_actor_options=actor,
        )
        if initial_replicas is not None:  # Faro scales it (a pipeline's ingress: the user)
            options.update(num_replicas=initial_replicas, autoscaling_config=None)
        self._deployment = deployment.options(**options)

    @property
    def name(self) -> str:
        return self.deployment.name

    def bind(self, *args, **kwargs) -> Application:
        meter = Meter.options(name=meter_name(self.deployment.name), logging_config=QUIET)
        return self._deployment.bind(*args, _faro_meter=meter.bind(self.model, replica_cpus=self.cpus), **kwargs)


def detected_batching(
    name: str, methods: list[BatchMethod], declared: Batching | None, concurrency: int
) -> Batching | None:
    """A deployment's batching as Faro runs it: the SLO's ``batching`` where it declares it
    (its largest batch and wait win), else what the ``@serve.batch`` decorator says (the
    largest batch, the wait, the curve measured live); None when it does not batch. A
    ConfigError for an SLO that declares batching over a deployment with no ``@serve.batch``
    method, or a batching deployment that also asks for ``concurrency`` > 1."""
    if not methods:
        if declared is not None:
            raise ConfigError(
                f"{name}: its SLO declares batching but the deployment has no "
                "@serve.batch method (async def that takes a list); drop "
                "'batching' from the SLO or batch with @serve.batch"
            )
        return None
    if concurrency > 1:
        raise ConfigError(
            f"{name}: it batches with @serve.batch (method "
            f"{methods[0].attr!r}): give its SLO concurrency 1 (a replica serves "
            "one batch at a time; Ray's max_concurrent_batches sets more)"
        )
    if declared is not None:
        return declared
    m = max(methods, key=lambda x: x.max_batch_size)
    return Batching(max_batch_size=min(m.max_batch_size, 64), batch_wait_s=min(m.wait_s, 1.0))


def _check_deployment(deployment, where: str) -> Deployment:
    if isinstance(deployment, Application):
        raise ConfigError(
            f"{where} is a bound application; name the deployment (the class "
            "decorated with @serve.deployment) and give its arguments to bind() "
            "(in YAML: init_args, init_kwargs)"
        )
    if not isinstance(deployment, Deployment):
        what = "a class" if inspect.isclass(deployment) else f"a {type(deployment).__name__}"
        raise ConfigError(f"{where} is {what}, not a Ray Serve deployment: decorate it with @serve.deployment")
    return deployment


def scaled(
    deployment,
    slo: "ModelSLO | PipelineSLO",
    *,
    stage: str | None = None,
    queue_limit: int = 50,
    initial_replicas: int | None = None,
    body_timeout_s: float | None = 5.0,
) -> ScaledDeployment:
    """``deployment`` (a ``@serve.deployment`` class) with Faro attached; ``slo`` names the
    model (``slo.name``), its resources per replica and its concurrency. Bind the result as
    the deployment itself: ``scaled(Classifier, slo).bind(path="model.pt")``.

    With a :class:`~faro_serve.pipelines.PipelineSLO`: ``stage="det"`` scales that stage
    (as a model); without ``stage``, ``deployment`` is the pipeline's ingress, metered
    (arrivals, end-to-end latency) but not scaled: it keeps its own replicas, resources and
    ``max_ongoing_requests`` (give it room: each query holds a slot while its stages run).
    ``body_timeout_s``: an HTTP request whose body has not all arrived within this long is
    answered 408 and frees its replica (None: no bound; issue 50)."""
    _check_deployment(deployment, repr(getattr(deployment, "name", getattr(deployment, "__name__", deployment))))
    if isinstance(slo, PipelineSLO):
        if stage is None:
            return _ingress(deployment, slo, queue_limit, body_timeout_s)
        try:
            slo = slo.stage_model(stage)
        except KeyError as err:
            raise ConfigError(err.args[0]) from None
    elif stage is not None:
        raise ConfigError(f"stage={stage!r} needs a pipeline (faro_serve.Pipeline), not a model's SLO")
    if not isinstance(slo, ModelSLO):
        raise ConfigError(f"slo must be a faro_serve.SLO or faro_serve.Pipeline (got {type(slo).__name__})")
    if slo.deployment is not None and slo.deployment != deployment.name:
        raise ConfigError(
            f"model {slo.name!r}: its SLO names deployment {slo.deployment!r} but the deployment is {deployment.name!r}"
        )
    initial = slo.clamp(initial_replicas if initial_replicas is not None else slo.min_replicas)
    _SCALED[slo.name] = deployment.name
    scaled_dep = ScaledDeployment(
        deployment,
        slo.name,
        cpus=slo.cpus,
        gpus=slo.gpus,
        resources=slo.resources,
        concurrency=slo.concurrency,
        queue_limit=queue_limit,
        initial_replicas=initial,
        batching=slo.batching,
        body_timeout_s=body_timeout_s,
    )
    if scaled_dep.batching is not None and slo.batching is None:  # run() fills the SLO in
        _BATCHING[slo.name] = scaled_dep.batching
    return scaled_dep


def _ingress(
    deployment: Deployment, pipeline: PipelineSLO, queue_limit: int, body_timeout_s: float | None = 5.0
) -> ScaledDeployment:
    """A pipeline's ingress, metered under the pipeline's name and left at its own scaling."""
    if pipeline.ingress is not None and pipeline.ingress != deployment.name:
        raise ConfigError(
            f"pipeline {pipeline.name!r}: its ingress is {pipeline.ingress!r} but the deployment is {deployment.name!r}"
        )
    _SCALED[pipeline.name] = deployment.name
    actor = deployment.ray_actor_options or {}
    return ScaledDeployment(
        deployment,
        pipeline.name,
        cpus=float(actor.get("num_cpus", 1.0)),
        gpus=float(actor.get("num_gpus", 0.0)),
        resources=actor.get("resources"),
        concurrency=max(1, int(deployment.max_ongoing_requests)),
        queue_limit=queue_limit,
        initial_replicas=None,
        body_timeout_s=body_timeout_s,
    )


def _located(pipeline: PipelineSLO) -> PipelineSLO:
    """``pipeline`` with its ingress and stage deployments as scaled() was given them."""
    doc = pipeline.model_dump(exclude_none=True)
    for s in doc["stages"]:
        if "deployment" not in s and s["name"] in _SCALED:
            s["deployment"] = _SCALED[s["name"]]
    if "ingress" not in doc and pipeline.name in _SCALED:
        doc["ingress"] = _SCALED[pipeline.name]
    return PipelineSLO.model_validate(doc)


def _located_model(m: ModelSLO) -> ModelSLO:
    """``m`` with its deployment, and the batching its ``@serve.batch`` method says, as
    scaled() found them (where its SLO does not say)."""
    update = {}
    if not m.deployment and m.name in _SCALED:
        update["deployment"] = _SCALED[m.name]
    if m.batching is None and m.name in _BATCHING:
        update["batching"] = _BATCHING[m.name]
    return m.model_copy(update=update) if update else m


def run(
    apps: Mapping[str, Application],
    models: Sequence[ModelSLO],
    cluster: ClusterSpec,
    *,
    policy: str | None = None,
    route_prefixes: Mapping[str, str] | None = None,
    **autoscaler_options,
) -> None:
    """Deploy ``apps`` (application name -> bound application, each at ``/<name>`` unless
    ``route_prefixes`` says otherwise, external scaling on) and the autoscaler over
    ``models``. Each model's ``app`` names its application (default: its name) and its
    ``deployment`` the Serve deployment (default: the one :func:`scaled` was given for it).
    ``models`` may hold :class:`~faro_serve.pipelines.PipelineSLO` s: their stages are
    scaled, their ingress measured (each as :func:`scaled` was given them)."""
    pipelines = [_located(p) for p in models if isinstance(p, PipelineSLO)]
    models = [_located_model(m) for m in models if not isinstance(m, PipelineSLO)]
    everything = models + [m for p in pipelines for m in p.stage_models()]
    for p in pipelines:
        if p.app_name not in apps and p.ingress is not None:
            raise ConfigError(
                f"pipeline {p.name!r} runs in application {p.app_name!r}, which "
                f"is not among the applications given ({', '.join(apps) or 'none'})"
            )
    for m in everything:
        if m.deployment is None:
            raise ConfigError(
                f"model {m.name!r}: no deployment was scaled() under this name; "
                "give the SLO's deployment (the name of its Serve deployment)"
            )
        if m.app_name not in apps:
            raise ConfigError(
                f"model {m.name!r} runs in application {m.app_name!r}, which is "
                f"not among the applications given ({', '.join(apps) or 'none'})"
            )
    from autoscaler.driving.cluster_adapter import capped_capacity

    from ..config import check_minimums_fit
    from .app import run_autoscaler
    from .autoscaler_deployment import ray_capacity

    try:  # Serve would wait for ever for replicas that cannot be placed: say it now
        check_minimums_fit(everything, capped_capacity(cluster, ray_capacity()))
    except ValueError as err:
        raise ConfigError(f"cannot deploy: {err} (Ray's cluster, capped by the config)") from None
    for app_name, app in apps.items():
        prefix = (route_prefixes or {}).get(app_name, f"/{app_name}")
        serve.run(app, name=app_name, route_prefix=prefix, external_scaler_enabled=True, blocking=False)
    run_autoscaler(models, cluster, policy=policy, pipelines=pipelines, **autoscaler_options)
