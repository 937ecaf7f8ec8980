"""Matched validation, the live side: a local Ray cluster, the synthetic models, one policy
at a time, and the replay (paper section 6.5).

For every policy the models are deployed afresh (one replica each, as the simulator starts),
the autoscaler is deployed with that policy, the fronts' measurements restart so their
minute bins line up with the trace minutes, and the replay sends the slice. Before the
first policy, :func:`calibrate` measures what the simulator must assume about this machine:
the per-request overhead outside the model (HTTP, proxy, router front), how long a replica
stays idle between two queued requests (the router's dispatch round trip, which near
saturation decides whether a queue drains), and how long a new replica takes to serve
(cold start).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

import httpx

from ..config import ModelSLO
from ..ports import free_port
from ..replay.client import ReplayRecords, send_schedule
from ..replay.loadgen import Schedule
from ..replay.replay_report import replay_result
from ..serving.app import autoscaler_app, model_app
from ..serving.names import AUTOSCALER, AUTOSCALER_APP, METER, MODEL
from .calibration import Calibration, calibrate, wait_until
from .comparison import RAY_DEFAULTS, REPLAY_TIMEOUT_S

log = logging.getLogger("faro_serve.validation")


class LiveCluster:
    """A local single-node Ray cluster on free loopback ports with ``capacity`` logical CPUs
    (the synthetic replicas sleep, so 1 CPU per replica fits any number on a small machine)."""

    def __init__(self, capacity: float, data_path: str = "direct"):
        self.capacity = capacity
        self.data_path = data_path  # the models' data path (docs/serving.md)
        self.dashboard = self.base = ""
        self._cluster = None  # RayServeCluster (serving.autoscaler_deployment), once known

    def __enter__(self) -> "LiveCluster":
        import ray
        from ray import serve

        dash, http = free_port(), free_port()
        ray.init(
            address="local",
            num_cpus=int(math.ceil(self.capacity)),
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            dashboard_port=dash,
            log_to_driver=False,
        )
        serve.start(http_options={"host": "127.0.0.1", "port": http})
        self.dashboard = f"http://127.0.0.1:{dash}"
        self.base = f"http://127.0.0.1:{http}"
        return self

    def __exit__(self, *exc) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()

    # -- deployment --------------------------------------------------------------------
    def running(self) -> dict[str, int]:
        """Serving replicas per model: the autoscaler's own view of the cluster."""
        from ..serving.autoscaler_deployment import RayServeCluster

        if self._cluster is None:
            self._cluster = RayServeCluster(self.dashboard)
        return self._cluster.running_replicas()

    def scale(self, name: str, replicas: int) -> None:
        """Set a model's target replicas through the autoscaler's own scaling adapter."""
        self.running()  # makes the cluster adapter
        self._cluster.scale(name, replicas)

    def deploy_models(self, names: list[str], processing: str) -> None:
        from ray import serve

        for i, n in enumerate(names):
            args = {
                "name": n,
                "model": {"kind": "synthetic", "processing": processing, "seed": i},
                "cpus": 1.0,
                "data_path": self.data_path,
            }
            serve.run(model_app(args), name=n, route_prefix=f"/{n}", external_scaler_enabled=True, blocking=False)
        wait_until(lambda: all(self.running().get(n) == 1 for n in names), 180, "the models to serve")

    def deploy_autoscaler(self, config: dict) -> None:
        from ray import serve

        serve.run(
            autoscaler_app({**config, "dashboard_url": self.dashboard}),
            name=AUTOSCALER_APP,
            route_prefix=f"/{AUTOSCALER_APP}",
            blocking=False,
        )
        names = [m["name"] for m in config["models"]]

        def ready():
            try:
                st = httpx.get(f"{self.base}/{AUTOSCALER_APP}/status", timeout=5).json()
            except Exception:
                return False
            return st.get("ticks", 0) >= 1 and all(n in (st.get("models") or {}) for n in names)

        wait_until(ready, 120, f"the {AUTOSCALER} to run")

    def reset_meters(self, names: list[str]) -> None:
        from ray import serve

        for n in names:
            serve.get_deployment_handle(METER, app_name=n).control.remote(reset_stats=True).result(timeout_s=10)

    def delete_all(self) -> None:
        from ray import serve

        # all at once, then wait for all: one at a time, each waits ~3 s for its replicas
        for name in list(serve.status().applications):
            serve.delete(name, _blocking=False)
        wait_until(lambda: not serve.status().applications, 120, "the applications to go")

    def calibrate(self, name: str, n: int = 200, burst: int = 30) -> Calibration:
        """What the simulator must assume about this machine (``calibration.calibrate``)."""
        return calibrate(self, name, n, burst)

    # -- ray-native, ray-tuned: plain Ray Serve under Ray's autoscaler -------------------
    def deploy_native(
        self,
        names: list[str],
        processing: str,
        max_replicas: int,
        autoscaling: dict | None = None,
        options: dict | None = None,
    ) -> None:
        """Every model a plain Ray Serve deployment: ``autoscaling`` over Ray's
        ``autoscaling_config`` defaults, ``options`` its deployment options
        (``max_ongoing_requests``, ``max_queued_requests``)."""
        from ray import serve

        from ..serving.native import native_app

        for i, n in enumerate(names):
            args = {
                "name": n,
                "model": {"kind": "synthetic", "processing": processing, "seed": i},
                "cpus": 1.0,
                **(options or {}),
                "autoscaling_config": {"max_replicas": max_replicas, **(autoscaling or {})},
            }
            serve.run(native_app(args), name=n, route_prefix=f"/{n}", blocking=False)
        wait_until(lambda: all(self.running().get(n) == 1 for n in names), 180, "the models to serve")

    def deploy_ray(self, names: list[str], processing: str, max_replicas: int, settings: dict | None = None) -> dict:
        """The models as a Ray baseline deploys them (``ray-native``, ``ray-tuned``): Ray's
        ``settings`` (``autoscaler.policies.ray_rule.RAY_DEFAULTS`` shape; None: Ray's defaults).
        Returns the settings Ray holds, read back from it."""
        settings = settings or {}
        self.deploy_native(
            names,
            processing,
            max_replicas,
            settings.get("autoscaling_config"),
            {k: v for k, v in settings.items() if k != "autoscaling_config"},
        )
        return self.ray_settings(names[0])

    def ray_settings(self, name: str) -> dict:
        """The settings model ``name``'s deployment runs with, read back from Ray Serve's REST
        API (``GET /api/serve/applications/`` on the dashboard: the config in force, Serve's
        defaults included), as ``autoscaler.policies.ray_rule.RAY_DEFAULTS`` names them."""
        from forecasting.rayserve import dashboard_headers

        r = httpx.get(
            f"{self.dashboard}/api/serve/applications/", timeout=30, trust_env=False, headers=dashboard_headers()
        )
        if r.status_code != 200:
            raise RuntimeError(f"Ray Serve's REST API answered {r.status_code}: {r.text[:200]}")
        doc = r.json()
        try:
            cfg = doc["applications"][name]["deployments"][MODEL]["deployment_config"]
        except KeyError:
            raise RuntimeError(f"Ray Serve reports no deployment {MODEL!r} of application {name!r}") from None
        auto = cfg.get("autoscaling_config") or {}
        return {
            "autoscaling_config": {k: auto.get(k) for k in RAY_DEFAULTS["autoscaling_config"]},
            **{k: cfg.get(k) for k in ("max_ongoing_requests", "max_queued_requests")},
        }

    def native_replicas(self, names: list[str]) -> dict:
        """What Ray's controller holds per model, as the autoscaler's status reports it:
        ``target`` (every replica not stopping, pending ones included) and ``replicas``
        (running)."""
        from ray import serve

        out = {}
        for n, app in serve.status().applications.items():
            dep = app.deployments.get(MODEL)
            if n in names and dep is not None:
                states = {str(getattr(k, "value", k)): v for k, v in dep.replica_states.items()}
                out[n] = {
                    "target": sum(v for k, v in states.items() if k != "STOPPING"),
                    "replicas": int(states.get("RUNNING", 0)),
                }
        return out

    def run_native(
        self,
        schedule: Schedule,
        models: list[ModelSLO],
        capacity: float,
        processing: str,
        policy: str = "ray-native",
        settings: dict | None = None,
        on_done=None,
    ) -> tuple[object, ReplayRecords, dict]:
        """The replay against plain Ray Serve (``policy``: ``ray-native`` or ``ray-tuned``)
        with Ray's ``settings`` (``autoscaler.policies.ray_rule.RAY_DEFAULTS`` shape; None: Ray's
        defaults): no front, no faro autoscaler; Ray decides. The replica counts are read
        from Ray Serve every 2 s into the records' status polls. Returns the result, the
        records and the settings Ray held (read back from it)."""
        import threading

        names = [m.name for m in models]
        held = self.deploy_ray(names, processing, int(capacity), settings)
        polls: list[tuple[float, dict]] = []
        stop = threading.Event()
        t0 = time.time()

        def poll():
            while not stop.wait(2.0):
                try:
                    polls.append(
                        (
                            time.time() - t0,
                            {"policy": policy, "capacity_cpus": capacity, "models": self.native_replicas(names)},
                        )
                    )
                except Exception as err:  # the controller is busy: the next poll
                    log.warning("cannot read the replicas: %s", err)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        try:
            rec = asyncio.run(
                send_schedule(
                    schedule,
                    self.base,
                    max_in_flight=2000,
                    timeout_s=REPLAY_TIMEOUT_S,
                    status_every_s=None,
                    on_done=on_done,
                )
            )
        finally:
            stop.set()
            th.join(timeout=10)
        rec.status_polls = polls
        res = replay_result(
            schedule,
            rec,
            {m.name: m.slo_ms for m in models},
            {m.name: m.percentile for m in models},
            policy=policy,
            capacity=capacity,
        )
        self.delete_all()
        return res, rec, held

    # -- one policy --------------------------------------------------------------------
    def run_policy(
        self,
        policy: str,
        schedule: Schedule,
        models: list[ModelSLO],
        capacity: float,
        processing: str,
        forecaster_dir: str | None,
        calibrate: bool = False,
        on_done=None,
        cluster: dict | None = None,
    ) -> tuple[object, ReplayRecords, Calibration | None]:
        """``cluster``: ClusterSpec fields set over the matched defaults (e.g. ``surge``)."""
        names = [m.name for m in models]
        self.deploy_models(names, processing)
        cal = self.calibrate(names[0]) if calibrate else None
        from .comparison import cluster_spec

        config = {
            "cluster": cluster_spec(capacity).model_dump() | (cluster or {}),
            "models": [m.model_dump() for m in models],
            "policy": policy,
            # 'fallback' or 'shipped' by name, else a trained directory (None: shipped)
            **(
                {"forecaster": forecaster_dir}
                if forecaster_dir in ("fallback", "shipped")
                else {"forecaster_dir": forecaster_dir}
            ),
        }
        # The autoscaler's first decision must not see the calibration's requests (the
        # simulator's first decision sees no history), and the replay's minute bins must
        # start with the replay: measurements restart before and after it starts.
        self.reset_meters(names)
        self.deploy_autoscaler(config)
        self.reset_meters(names)
        rec = asyncio.run(
            send_schedule(
                schedule, self.base, max_in_flight=2000, timeout_s=REPLAY_TIMEOUT_S, status_every_s=2.0, on_done=on_done
            )
        )
        res = replay_result(
            schedule,
            rec,
            {m.name: m.slo_ms for m in models},
            {m.name: m.percentile for m in models},
            policy=policy,
            capacity=capacity,
        )
        self.delete_all()
        return res, rec, cal
