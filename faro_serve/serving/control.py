"""The control plane every model's front offers the autoscaler (paper section 5): what was
measured (:meth:`MeterControl.metrics`), the drop rate, target and SLO percentile to
enforce (:meth:`MeterControl.control`), and the Prometheus export through
``ray.util.metrics``, published when the autoscaler reads (every tick) rather than per
request, to keep the data path short.

Both data paths use it: the router front (``front.py``) measures requests itself; on the
direct path (``direct.py``) the proxy's router and the model replicas report to it.
"""

import time

from ray.util import metrics as ray_metrics

from ..measures import LOOK_BACK_S
from ..meter_report import MeterReport, Processing
from .stats import MeterStats


class MeterControl:
    def _init_control(self, name: str, percentile: float, replica_cpus: float | None = None) -> None:
        self.name = name
        self.percentile = percentile
        self.replica_cpus = replica_cpus  # what each model replica reserves (its app's cpus)
        self.stats = MeterStats(start=time.time())
        self.drop_rate = 0.0
        self.replicas = 1
        # batching (issue 20): what the autoscaler set (None: nothing; the replicas keep
        # their user_config)
        self.batch_size: int | None = None
        self.threads: int | None = None
        self.variant: str | None = None  # a task with variants: the one to serve
        self.told: dict = {}  # the setting the autoscaler told (its fields by name), echoed
        self.draining_since: float | None = None  # a shutdown drains the model (drain.py)
        tags = ("model",)
        self._requests = ray_metrics.Counter("faro_requests", "requests by outcome", tag_keys=("model", "outcome"))
        self._latency = ray_metrics.Gauge(
            "faro_latency_ms", f"SLO-percentile end-to-end latency over the last {LOOK_BACK_S:g} s (ms)", tag_keys=tags
        )
        self._queue = ray_metrics.Gauge("faro_queue_length", "requests waiting", tag_keys=tags)
        self._drop = ray_metrics.Gauge("faro_drop_rate", "drop rate in force", tag_keys=tags)
        self._published: dict[str, int] = {}

    def _queue_state(self) -> dict:
        """The data path's queue: ``waiting``, ``dispatched``, ``dispatch_capacity``."""
        raise NotImplementedError

    def metrics(self, reset_mean: bool = True) -> dict:
        """The autoscaler's read, once per tick: the in-flight average restarts with it.
        A :class:`~faro_serve.meter_report.MeterReport` in its JSON form (the schema the
        autoscaler decodes strictly)."""
        snap = self.stats.snapshot(time.time(), self.percentile, self.replicas, reset_mean)
        snap["processing"] = Processing(**snap["processing"])
        report = MeterReport(
            model=self.name,
            drop_rate=self.drop_rate,
            replicas=self.replicas,
            percentile=self.percentile,
            setting=dict(self.told),
            replica_cpus=self.replica_cpus,
            replica_memory_gb=None,  # Ray reserves no memory for a replica
            **self._queue_state(),
            **snap,
        ).wire()
        self._publish(report)
        return report

    def _publish(self, snap: dict) -> None:
        """Prometheus: request counters as deltas since the last read, plus gauges."""
        tags = {"model": self.name}
        counts = {
            "arrival": snap["arrivals_total"],
            "completed": snap["completed_total"],
            **{f"dropped_{k}": v for k, v in snap["dropped"].items()},
            **({"retried": snap["retried"]} if snap.get("retried") is not None else {}),
        }
        for outcome, total in counts.items():
            delta = total - self._published.get(outcome, 0)
            if delta > 0:
                self._requests.inc(delta, tags={**tags, "outcome": outcome})
            self._published[outcome] = total
        self._queue.set(snap["queue_length"], tags=tags)
        if snap["latency_ms"] is not None:
            self._latency.set(snap["latency_ms"], tags=tags)

    # -- drain (issue 50): before Serve stops, what was admitted is answered -------------
    def drain(self) -> dict:
        """From now on the model's new HTTP requests get 503 ``shutting_down``; the answer
        is :meth:`drain_state`. Called by ``faro-serve drain`` (``drain.py``) over a handle;
        idempotent. Requests between a model's own deployments (handle calls of a
        pipeline) are not refused: an admitted request is seen through."""
        if self.draining_since is None:
            self.draining_since = time.time()
        return self.drain_state()

    def drain_state(self) -> dict:
        """``{"model", "draining", "replicas", "told", "busy", "queued"}``: of the replicas
        that report, how many refuse new requests already, how many admitted requests are
        still unanswered, and how many wait in the proxies' queues. Drained: ``told ==
        replicas`` and nothing busy or queued."""
        raise NotImplementedError

    def control(self, percentile: float | None = None, reset_stats: bool = False, **setting) -> dict:
        """Set what the autoscaler decided: the fields of its setting by name
        (``autoscaler.contract.setting.Setting``: drop_rate, replicas, batch_size, threads, variant),
        each through its handler below, and echoed in the report; ``reset_stats`` starts the
        measurements afresh (minute bins from now), as matched validation does to align them
        with a replay. A field with no handler is refused by name: the meter cannot enforce
        what it does not know (a new actuator adds its handler here)."""
        unknown = sorted(k for k in setting if k not in _APPLY)
        if unknown:
            raise ValueError(f"{self.name}: this front cannot enforce {unknown}; it knows {', '.join(_APPLY)}")
        if reset_stats:
            self.stats = MeterStats(start=time.time())
            self._published = {}
        if percentile is not None:
            self.percentile = float(percentile)
        for field, value in setting.items():
            if value is not None:
                self.told[field] = _APPLY[field](self, value)
        return {"drop_rate": self.drop_rate, "replicas": self.replicas}

    # -- the handlers: each applies one field of the setting and returns the value in force
    def _set_drop_rate(self, v) -> float:
        self.drop_rate = min(max(float(v), 0.0), 1.0)
        self._drop.set(self.drop_rate, tags={"model": self.name})
        return self.drop_rate

    def _set_replicas(self, v) -> int:
        self.replicas = max(0, int(v))
        return self.replicas

    def _set_batch_size(self, v) -> int:  # the replicas take it from the meter's answer
        self.batch_size = max(1, int(v))
        return self.batch_size

    def _set_threads(self, v) -> int:  # likewise
        self.threads = max(1, int(v))
        return self.threads

    def _set_variant(self, v) -> str:  # likewise
        self.variant = str(v)
        return self.variant


_APPLY = {
    "drop_rate": MeterControl._set_drop_rate,
    "replicas": MeterControl._set_replicas,
    "batch_size": MeterControl._set_batch_size,
    "threads": MeterControl._set_threads,
    "variant": MeterControl._set_variant,
}
