"""Your own Ray Serve deployment under Faro (issue 34): the public API.

``scaled(MyDeployment, slo)`` returns the user's deployment with Faro attached, to
``.bind()`` as usual (alone, or inside a composed application):

* the user's class runs unchanged, as a subclass whose ``__call__`` and public methods pass
  through a :class:`~faro_serve.serving.guard.ReplicaGuard` (drop control, at most
  ``slo.concurrency`` requests at once, processing times and failures to the meter);
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
from starlette.requests import Request

from ..config import ClusterSpec, ConfigError, ModelSLO
from ..pipelines import PipelineSLO
from .direct import Meter
from .guard import Dropped, ReplicaGuard, run_user  # noqa: F401 (Dropped re-exported)
from .names import QUIET, meter_name
from .proxy_queue import ProxyQueueRouter

# methods a subclass must not wrap: Serve's own hooks and the object's protocol
_HOOKS = {"reconfigure", "check_health", "record_autoscaling_stats", "bind", "options"}
_SCALED: dict[str, str] = {}  # model -> its deployment, as scaled() was last called in this process


def _is_asgi_call(args: tuple) -> bool:
    return len(args) == 3 and isinstance(args[0], dict) and args[0].get("type") in ("http", "websocket")


def _guarded_method(name: str, fn):
    """A public method of the user's class, through the guard when called over a handle.
    Called by the user's own code inside a request (their route calling ``self.helper()``)
    it runs exactly as written, synchronous or not."""
    if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
        return None  # streaming over a handle: served as the user wrote it (not counted)
    if inspect.iscoroutinefunction(fn):
        async def method(self, *args, **kwargs):
            guard = self._faro_guard
            if guard.nested():
                return await fn(self, *args, **kwargs)
            return await guard.call(fn.__get__(self), *args, **kwargs)
    else:
        def method(self, *args, **kwargs):
            guard = self._faro_guard
            if guard.nested():
                return fn(self, *args, **kwargs)
            # a handle call: Ray awaits the coroutine a synchronous method returns; in
            # Serve's thread-pool mode this thread waits for it on the replica's loop
            return guard.call_from_sync(fn.__get__(self), *args, **kwargs)

    method.__name__, method.__qualname__, method.__doc__ = name, name, fn.__doc__
    return method


def _faro_class(cls: type, name: str, concurrency: int) -> type:
    """The user's class with Faro's guard in front of its entry points."""

    if inspect.iscoroutinefunction(cls.__init__):  # Serve's ingress classes (Ray 2.60)
        async def __init__(self, *args, _faro_meter=None, **kwargs):
            self._faro_guard = ReplicaGuard(_faro_meter, name, concurrency)
            await cls.__init__(self, *args, **kwargs)
    else:
        def __init__(self, *args, _faro_meter=None, **kwargs):
            self._faro_guard = ReplicaGuard(_faro_meter, name, concurrency)
            cls.__init__(self, *args, **kwargs)

    ns: dict = {"__init__": __init__, "__module__": cls.__module__, "__doc__": cls.__doc__}
    # the class's own __call__, if it has one (getattr would find the metaclass's)
    user_call = next((k.__dict__["__call__"] for k in cls.__mro__ if "__call__" in k.__dict__), None)
    if user_call is not None:
        async def __call__(self, *args, **kwargs):
            guard, call = self._faro_guard, user_call.__get__(self)
            if _is_asgi_call(args):
                if args[0]["type"] != "http":  # a websocket: served as written, unmetered
                    return await call(*args)
                return await guard.asgi(call, *args)
            if len(args) == 1 and not kwargs and isinstance(args[0], Request):
                return await guard.request(call, args[0])
            if guard.nested():
                return await run_user(call, *args, **kwargs)
            return await guard.call(call, *args, **kwargs)
        ns["__call__"] = __call__
    for klass in cls.__mro__:
        if klass is object or klass.__module__.startswith("ray."):
            continue
        for attr, fn in vars(klass).items():
            if (attr.startswith("_") or attr in _HOOKS or attr in ns or not inspect.isfunction(fn)):
                continue
            wrapped = _guarded_method(attr, fn)
            if wrapped is not None:
                ns[attr] = wrapped
    return type(cls.__name__, (cls,), ns)


class ScaledDeployment:
    """A user's deployment with Faro attached: ``.bind(*args, **kwargs)`` as Ray's own.
    ``model``: the model's name (its SLO's); what one replica reserves in Ray's terms and
    how many requests it serves at once, as the SLO declares them."""

    def __init__(self, deployment: Deployment, model: str, *, cpus: float = 1.0, gpus: float = 0.0,
                 resources: Mapping[str, float] | None = None, concurrency: int = 1,
                 queue_limit: int = 50, initial_replicas: int | None = 1):
        cls = deployment.func_or_class
        if isinstance(cls, str) or not inspect.isclass(cls):
            raise ConfigError(f"{deployment.name}: Faro scales deployment classes; this deployment "
                              "is a function (wrap it in a class with __call__)")
        self.deployment, self.model, self.cpus = deployment, model, cpus
        actor = dict(deployment.ray_actor_options or {})
        actor.update({"num_cpus": cpus, "num_gpus": gpus})
        if resources:
            actor["resources"] = {**actor.get("resources", {}), **resources}
        router = RequestRouterConfig(request_router_class=ProxyQueueRouter, request_router_kwargs={
            "meter": meter_name(deployment.name), "concurrency": concurrency})
        options = dict(func_or_class=_faro_class(cls, model, concurrency),
                       max_ongoing_requests=concurrency + 1, max_queued_requests=queue_limit,
                       request_router_config=router, ray_actor_options=actor)
        if initial_replicas is not None:  # Faro scales it (a pipeline's ingress: the user)
            options.update(num_replicas=initial_replicas, autoscaling_config=None)
        self._deployment = deployment.options(**options)

    @property
    def name(self) -> str:
        return self.deployment.name

    def bind(self, *args, **kwargs) -> Application:
        meter = Meter.options(name=meter_name(self.deployment.name), logging_config=QUIET)
        return self._deployment.bind(*args, _faro_meter=meter.bind(self.model, replica_cpus=self.cpus),
                                     **kwargs)


def _check_deployment(deployment, where: str) -> Deployment:
    if isinstance(deployment, Application):
        raise ConfigError(f"{where} is a bound application; name the deployment (the class "
                          "decorated with @serve.deployment) and give its arguments to bind() "
                          "(in YAML: init_args, init_kwargs)")
    if not isinstance(deployment, Deployment):
        what = "a class" if inspect.isclass(deployment) else f"a {type(deployment).__name__}"
        raise ConfigError(f"{where} is {what}, not a Ray Serve deployment: decorate it with "
                          "@serve.deployment")
    return deployment


def scaled(deployment, slo: "ModelSLO | PipelineSLO", *, stage: str | None = None,
           queue_limit: int = 50, initial_replicas: int | None = None) -> ScaledDeployment:
    """``deployment`` (a ``@serve.deployment`` class) with Faro attached; ``slo`` names the
    model (``slo.name``), its resources per replica and its concurrency. Bind the result as
    the deployment itself: ``scaled(Classifier, slo).bind(path="model.pt")``.

    With a :class:`~faro_serve.pipelines.PipelineSLO`: ``stage="det"`` scales that stage
    (as a model); without ``stage``, ``deployment`` is the pipeline's ingress, metered
    (arrivals, end-to-end latency) but not scaled: it keeps its own replicas, resources and
    ``max_ongoing_requests`` (give it room: each query holds a slot while its stages run)."""
    _check_deployment(deployment, repr(getattr(deployment, "name", getattr(deployment, "__name__", deployment))))
    if isinstance(slo, PipelineSLO):
        if stage is None:
            return _ingress(deployment, slo, queue_limit)
        try:
            slo = slo.stage_model(stage)
        except KeyError as err:
            raise ConfigError(err.args[0]) from None
    elif stage is not None:
        raise ConfigError(f"stage={stage!r} needs a pipeline (faro_serve.Pipeline), not a model's SLO")
    if not isinstance(slo, ModelSLO):
        raise ConfigError(f"slo must be a faro_serve.SLO or faro_serve.Pipeline (got "
                          f"{type(slo).__name__})")
    if slo.deployment is not None and slo.deployment != deployment.name:
        raise ConfigError(f"model {slo.name!r}: its SLO names deployment {slo.deployment!r} but "
                          f"the deployment is {deployment.name!r}")
    initial = slo.clamp(initial_replicas if initial_replicas is not None else slo.min_replicas)
    _SCALED[slo.name] = deployment.name
    return ScaledDeployment(deployment, slo.name, cpus=slo.cpus, gpus=slo.gpus,
                            resources=slo.resources, concurrency=slo.concurrency,
                            queue_limit=queue_limit, initial_replicas=initial)


def _ingress(deployment: Deployment, pipeline: PipelineSLO, queue_limit: int) -> ScaledDeployment:
    """A pipeline's ingress, metered under the pipeline's name and left at its own scaling."""
    if pipeline.ingress is not None and pipeline.ingress != deployment.name:
        raise ConfigError(f"pipeline {pipeline.name!r}: its ingress is {pipeline.ingress!r} but "
                          f"the deployment is {deployment.name!r}")
    _SCALED[pipeline.name] = deployment.name
    actor = deployment.ray_actor_options or {}
    return ScaledDeployment(deployment, pipeline.name, cpus=float(actor.get("num_cpus", 1.0)),
                            gpus=float(actor.get("num_gpus", 0.0)), resources=actor.get("resources"),
                            concurrency=max(1, int(deployment.max_ongoing_requests)),
                            queue_limit=queue_limit, initial_replicas=None)


def _located(pipeline: PipelineSLO) -> PipelineSLO:
    """``pipeline`` with its ingress and stage deployments as scaled() was given them."""
    doc = pipeline.model_dump(exclude_none=True)
    for s in doc["stages"]:
        if "deployment" not in s and s["name"] in _SCALED:
            s["deployment"] = _SCALED[s["name"]]
    if "ingress" not in doc and pipeline.name in _SCALED:
        doc["ingress"] = _SCALED[pipeline.name]
    return PipelineSLO.model_validate(doc)


def run(apps: Mapping[str, Application], models: Sequence[ModelSLO], cluster: ClusterSpec, *,
        policy: str | None = None, route_prefixes: Mapping[str, str] | None = None,
        **autoscaler_options) -> None:
    """Deploy ``apps`` (application name -> bound application, each at ``/<name>`` unless
    ``route_prefixes`` says otherwise, external scaling on) and the autoscaler over
    ``models``. Each model's ``app`` names its application (default: its name) and its
    ``deployment`` the Serve deployment (default: the one :func:`scaled` was given for it).
    ``models`` may hold :class:`~faro_serve.pipelines.PipelineSLO` s: their stages are
    scaled, their ingress measured (each as :func:`scaled` was given them)."""
    pipelines = [_located(p) for p in models if isinstance(p, PipelineSLO)]
    models = [m if m.deployment or m.name not in _SCALED
              else m.model_copy(update={"deployment": _SCALED[m.name]})
              for m in models if not isinstance(m, PipelineSLO)]
    everything = models + [m for p in pipelines for m in p.stage_models()]
    for p in pipelines:
        if p.app_name not in apps and p.ingress is not None:
            raise ConfigError(f"pipeline {p.name!r} runs in application {p.app_name!r}, which "
                              f"is not among the applications given ({', '.join(apps) or 'none'})")
    for m in everything:
        if m.deployment is None:
            raise ConfigError(f"model {m.name!r}: no deployment was scaled() under this name; "
                              "give the SLO's deployment (the name of its Serve deployment)")
        if m.app_name not in apps:
            raise ConfigError(f"model {m.name!r} runs in application {m.app_name!r}, which is "
                              f"not among the applications given ({', '.join(apps) or 'none'})")
    from autoscaler.loop import capped_capacity

    from ..config import check_minimums_fit
    from .app import run_autoscaler
    from .autoscaler_deployment import ray_capacity

    try:  # Serve would wait for ever for replicas that cannot be placed: say it now
        check_minimums_fit(everything, capped_capacity(cluster, ray_capacity()))
    except ValueError as err:
        raise ConfigError(f"cannot deploy: {err} (Ray's cluster, capped by the config)") from None
    for app_name, app in apps.items():
        prefix = (route_prefixes or {}).get(app_name, f"/{app_name}")
        serve.run(app, name=app_name, route_prefix=prefix, external_scaler_enabled=True,
                  blocking=False)
    run_autoscaler(models, cluster, policy=policy, pipelines=pipelines, **autoscaler_options)
