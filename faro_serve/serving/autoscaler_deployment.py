"""The autoscaler as a single-replica Ray Serve deployment: a thin adapter (paper section 5).

Serve restarts it when it crashes or its health check fails; the loop then resumes from the
running replica counts and from the state it saved at its last tick (the policy's timers,
the time of its last plan, drop rates) in a small named Ray actor that outlives the replica
(:class:`ActorStateStore`). It reads each model's router front over handles, scales model
deployments through Ray Serve's external scaling REST API (the model applications set
``external_scaler_enabled``), and answers ``GET /faro/status`` and ``GET /faro/decisions``.
"""

import logging
import threading
import time
from pathlib import Path

import httpx
import ray
from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from ray import serve

from autoscaler.contract.setting import Setting
from autoscaler.driving.loop import AutoscalerLoop
from autoscaler.driving.loop_config import AutoscalerConfig, parse_autoscaler_config
from autoscaler.driving.loop_retraining import forecaster_of
from autoscaler.driving.tick_failures import TickFailures
from faro_serve.resources import Capacity
from forecasting.rayserve import dashboard_headers

from .names import MODEL, meter_name

log = logging.getLogger("faro_serve.autoscaler")


def ray_capacity() -> Capacity:
    """Every resource the connected Ray cluster has now (CPU, memory in GiB, GPU, each
    custom resource); one it does not list, it lacks (the capacity's default 0). Node
    resources (``node:<ip>``) and the object store are no replica's to take: left out."""
    res = ray.cluster_resources()
    caps = {
        k: float(v)
        for k, v in res.items()
        if not k.startswith("node:") and k != "object_store_memory" and k != "memory"
    }
    caps.setdefault("CPU", 0.0)
    caps["memory"] = float(res.get("memory", 0.0)) / 2**30
    return Capacity.from_mapping(caps, default=0.0)


class RayServeCluster:
    """:class:`~autoscaler.driving.cluster_adapter.ClusterAdapter` over public Ray and Ray Serve APIs."""

    def __init__(self, dashboard_url: str, timeout_s: float = 5.0):
        self.url = dashboard_url.rstrip("/")
        self.timeout_s = timeout_s
        self._handles: dict[str, object] = {}
        self.http = httpx.Client(timeout=timeout_s)
        self.where: dict[str, tuple[str, str]] = {}  # model -> (application, deployment)
        self.absent: dict[str, str] = {}  # model -> why it is not running (last look)
        self.deployed_at: dict[str, float] = {}  # model -> when its application was last deployed
        # observe: prometheus (issue 48): the models' reports come from Ray Serve's own
        # metrics (autoscaler/driving/serve_metrics.py), not from faro-serve meters
        self.observer = None
        self.percentile: dict[str, float] = {}
        self.running: dict[str, int] = {}

    def locate(self, models, pipelines=()) -> None:
        """Where each model runs: its SLO's ``app`` and ``deployment`` (faro-serve's own
        model applications: the model's name and ``Model``); and each pipeline's ingress,
        under the pipeline's name (its meter measures the pipeline end to end)."""
        where = {m.name: (m.app_name, m.deployment_name) for m in models}
        self.percentile = {m.name: m.percentile for m in models}
        where.update({p.name: (p.app_name, p.ingress) for p in pipelines if p.ingress is not None})
        if where != self.where:
            self.where, self._handles = where, {}

    def _at(self, name: str) -> tuple[str, str]:
        return self.where.get(name, (name, MODEL))

    def _front(self, name: str):
        if name not in self._handles:
            app, dep = self._at(name)
            self._handles[name] = serve.get_deployment_handle(meter_name(dep), app_name=app)
        return self._handles[name]

    def capacity(self) -> Capacity:
        """Every resource Ray has now (CPU, memory in GiB, GPU, each custom resource); one
        it does not list, the cluster lacks (the capacity's default 0). Node resources
        (``node:<ip>``) and the object store are no replica's to take, so are left out."""
        return ray_capacity()

    def running_replicas(self) -> dict[str, int]:
        """Running replicas of every located model, and of every faro-serve model
        application besides; :attr:`absent` says why a located model is missing."""
        apps = serve.status().applications
        out, absent, deployed = {}, {}, {}
        for name, app in apps.items():
            dep = app.deployments.get(MODEL)
            if dep is not None:
                out[name] = int(dep.replica_states.get("RUNNING", 0))
                deployed[name] = app.last_deployed_time_s
        for name, (app_name, dep_name) in self.where.items():
            out.pop(name, None)
            app = apps.get(app_name)
            dep = None if app is None else app.deployments.get(dep_name)
            if dep is not None:
                out[name] = int(dep.replica_states.get("RUNNING", 0))
                deployed[name] = app.last_deployed_time_s
            elif app is None:
                absent[name] = f"no application {app_name!r} is running"
            else:
                absent[name] = (
                    f"application {app_name!r} has no deployment {dep_name!r} "
                    f"(it has {', '.join(sorted(app.deployments)) or 'none'})"
                )
        self.absent, self.deployed_at, self.running = absent, deployed, out
        return out

    def meter_reports(self, names: list[str]) -> dict[str, dict]:
        if self.observer is not None:  # Ray Serve's metrics in Prometheus, for all at once
            return self.observer.reports(
                {n: self._at(n) for n in names}, self.running, {n: self.percentile.get(n, 99.0) for n in names}
            )
        pending = {}
        for n in names:
            try:
                pending[n] = self._front(n).metrics.remote()
            except Exception as err:
                log.warning("no front for %s: %s", n, err)
        out = {}
        for n, resp in pending.items():
            try:
                out[n] = resp.result(timeout_s=self.timeout_s)
            except Exception as err:
                log.warning("front of %s did not answer: %s", n, err)
                self._handles.pop(n, None)
        return out

    def scale(self, name: str, replicas: int) -> None:
        app, dep = self._at(name)
        r = self.http.post(
            f"{self.url}/api/v1/applications/{app}/deployments/{dep}/scale",
            json={"target_num_replicas": int(replicas)},
            headers=dashboard_headers(),
        )
        if r.status_code != 200:
            raise RuntimeError(f"scaling {name} to {replicas} failed: HTTP {r.status_code} {r.text[:200]}")
        log.info("scaled %s to %d replicas", name, replicas)

    def control(self, name: str, setting: Setting, percentile: float) -> None:
        if self.observer is not None:  # no faro-serve meter to tell: replicas only
            return
        # the meter's control takes the setting's fields by name (MeterControl.control)
        self._front(name).control.remote(percentile=percentile, **setting.to_json()).result(timeout_s=self.timeout_s)


@ray.remote(num_cpus=0, max_restarts=-1)
class _StateKeeper:
    def __init__(self):
        self.state = None

    def save(self, state: dict) -> None:
        self.state = state

    def load(self) -> dict | None:
        return self.state


class ActorStateStore:
    """:class:`~autoscaler.driving.cluster_adapter.StateStore` in a detached named actor, one per autoscaler
    application: it survives the autoscaler replica, so a restarted replica finds the state
    (the loop ignores state that is stale or of another policy). Deleting the application
    (a graceful stop) removes it."""

    def __init__(self, app_name: str, timeout_s: float = 5.0):
        self.name = f"faro-state-{app_name}"
        self.timeout_s = timeout_s
        self._actor = None

    def _keeper(self):
        if self._actor is None:
            self._actor = _StateKeeper.options(name=self.name, lifetime="detached", get_if_exists=True).remote()
        return self._actor

    def load(self) -> dict | None:
        return ray.get(self._keeper().load.remote(), timeout=self.timeout_s)

    def save(self, state: dict) -> None:
        try:
            ray.get(self._keeper().save.remote(state), timeout=self.timeout_s)
        except ray.exceptions.RayActorError:  # removed meanwhile (a rolling update): anew
            self._actor = None
            ray.get(self._keeper().save.remote(state), timeout=self.timeout_s)

    def remove(self) -> None:
        if self._actor is not None:
            ray.kill(self._actor, no_restart=True)
            self._actor = None


class AutoscalerGauges:
    """Prometheus gauges (``ray.util.metrics``, exported with Ray's metrics) of what the
    autoscaler sees and decides each tick, per model; the meters export the request
    counters, latency, queue and drop rate (``control.py``)."""

    FIELDS = {
        "arrival_rate": ("faro_arrival_rate", "arrival rate over the last tick (req/s)"),
        "target": ("faro_replicas_target", "target replicas the autoscaler set"),
        "replicas": ("faro_replicas_serving", "replicas serving"),
        "observed_utility": ("faro_utility_observed", "min(SLO / measured p99, 1)"),
        "predicted_utility": ("faro_utility_planned", "utility the last plan expected"),
        # shadow mode (issue 48): what the autoscaler would set, changing nothing
        "advised_replicas": ("faro_replicas_advised", "replicas the autoscaler would set (shadow mode)"),
        "advised_drop_rate": ("faro_drop_rate_advised", "drop rate the autoscaler would set (shadow mode)"),
    }

    def __init__(self):
        from ray.util import metrics

        self.gauges = {k: metrics.Gauge(name, doc, tag_keys=("model",)) for k, (name, doc) in self.FIELDS.items()}

    def publish(self, record: dict) -> None:
        for name, m in (record.get("models") or {}).items():
            for k, g in self.gauges.items():
                v = (m.get("advised") or {}).get(k.removeprefix("advised_")) if k.startswith("advised_") else m.get(k)
                if v is not None:
                    g.set(float(v), tags={"model": name})


def observer_of(cfg: AutoscalerConfig, current=None):
    """``observe: prometheus``: the reader of Ray Serve's metrics (``current`` kept when it
    reads the same Prometheus for as many minutes); None: the meters."""
    if cfg.observe != "prometheus":
        return None
    from autoscaler.driving.serve_metrics import ServeMetricsObserver

    if (
        current is not None
        and current.url == cfg.prometheus_url.rstrip("/")
        and current.minutes == cfg.history_minutes()
    ):
        return current
    return ServeMetricsObserver(cfg.prometheus_url, cfg.history_minutes())


def open_history(cfg: AutoscalerConfig, current=None):
    """The arrival store of ``history_dir`` (None: none); ``current`` kept when it is the
    same directory. A refused file is moved aside inside (``forecasting.store``); a
    directory that cannot be created is logged and the loop runs without a store. Without
    ``history_dir`` but with ``prometheus_url``: Ray Serve's request counters there, read
    only (``forecasting.rayserve.ServeMetricsStore``, issue 48)."""
    if not cfg.history_dir:
        if cfg.prometheus_url:
            from forecasting.rayserve import ServeMetricsStore

            where = {m.name: (m.app_name, m.deployment_name) for m in cfg.all_models}
            if (
                isinstance(current, ServeMetricsStore)
                and current.url == cfg.prometheus_url.rstrip("/")
                and current.where == where
            ):
                return current
            return ServeMetricsStore(cfg.prometheus_url, where, cfg.history_days)
        return None
    import sqlite3

    from forecasting.store import ArrivalStore

    path = Path(cfg.history_dir).expanduser()
    if (
        isinstance(current, ArrivalStore)
        and current.path.parent == path
        and current.keep_minutes == round(cfg.history_days * 1440)
    ):
        return current
    try:
        return ArrivalStore(path, keep_days=cfg.history_days)
    except (OSError, ValueError, sqlite3.Error) as err:  # e.g. unwritable, or locked past 5 s
        log.error("cannot open the arrival history store in %s: %s; running without it", path, err)
        return None


api = FastAPI(title="faro-serve autoscaler", description="Status and decisions of the Faro autoscaler.")
# The status page at GET /faro/: static HTML whose script reads /faro/status and
# /faro/decisions every 2 s; no build step.
STATUS_PAGE = (Path(__file__).parent / "status_page.html").read_text()


@serve.deployment(
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=64,
    health_check_period_s=5,
    health_check_timeout_s=30,
)
@serve.ingress(api)
class FaroAutoscaler:
    def __init__(self):
        self.loop: AutoscalerLoop | None = None
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.failures = TickFailures()  # shown by /status until a decision is applied again
        self.store = ActorStateStore(serve.get_replica_context().app_name)
        self.gauges = AutoscalerGauges()
        self.forecaster_why: str | None = None

    def reconfigure(self, config: dict) -> None:
        """New settings (e.g. an SLO or the objective) take effect without any restart."""
        cfg = parse_autoscaler_config(config)
        forecaster, self.forecaster_why = forecaster_of(cfg)
        with self.lock:
            cluster = self.loop.cluster if self.loop else RayServeCluster(cfg.dashboard_url)
            if self.loop and self.loop.cfg.dashboard_url != cfg.dashboard_url:
                cluster = RayServeCluster(cfg.dashboard_url)
            cluster.locate(cfg.all_models, cfg.pipelines)
            cluster.observer = observer_of(cfg, cluster.observer)
            history = open_history(cfg, self.loop.keeper.store if self.loop and self.loop.keeper else None)
            self.loop = AutoscalerLoop(cfg, cluster, forecaster, previous=self.loop, store=self.store, history=history)
        log.info("autoscaler configured: policy %s, %d models", self.loop.policy.name, len(cfg.all_models))
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="faro-autoscaler", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            t0 = time.time()
            with self.lock:
                loop = self.loop
            try:
                record = loop.step()
                self.gauges.publish(record)
                self.failures.ok(record)
            except Exception as err:
                self.failures.fail(err)
                log.exception("autoscaler tick failed (%d in a row)", self.failures.in_a_row)
            self.stopping.wait(max(0.5, loop.tick_s - (time.time() - t0)))

    def check_health(self) -> None:
        if self.thread is not None and not self.thread.is_alive():
            raise RuntimeError("the autoscaler loop stopped")
        if self.failures.in_a_row >= 30:
            raise RuntimeError(f"{self.failures.in_a_row} autoscaler ticks failed in a row")

    def __del__(self):
        """A graceful stop (the application deleted or redeployed): the saved state goes
        too; a crash never gets here, so a restarted replica finds it."""
        self.stopping.set()
        try:
            self.store.remove()
        except Exception:
            pass

    @api.get("/status", summary="Per model: SLO, rate, observed latency, replicas, utility")
    def status(self) -> dict:
        with self.lock:
            if not self.loop:
                return {"models": {}}
            # which forecaster the policy plans with, and why (each model's plan names the
            # predictor that served it: "predictor")
            out = {**self.loop.status(), "forecaster": self.forecaster_why}
        failures = self.failures.status()
        if failures:
            out["tick_errors"] = failures
        return out

    @api.get("/", response_class=HTMLResponse, summary="The status page (refreshes itself)")
    def page(self) -> HTMLResponse:
        return HTMLResponse(STATUS_PAGE)

    @api.get("/state", summary="What the autoscaler saves every tick to carry on after a restart")
    def state(self) -> dict:
        with self.lock:
            return self.loop.state() if self.loop else {}

    @api.get("/decisions", summary="The most recent decisions (newest last)")
    def decisions(self, limit: int = 20) -> list:
        with self.lock:
            return list(self.loop.history)[-max(1, min(limit, 500)) :] if self.loop else []
