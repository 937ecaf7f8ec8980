"""What a model's meter would report, read instead from Ray Serve's own metrics in
Prometheus (issue 48): how a shadow autoscaler (``observe: prometheus``) sees deployments
that run no faro-serve code, under their own autoscaling.

Each tick builds, per model, the :class:`~faro_serve.meter_report.MeterReport` a meter
sends, from the metrics ``forecasting/rayserve.py`` names: the completed minutes' arrivals
(``increase`` of the request counter per minute, wall-clock minutes, the contiguous ones
after the last gap), the rate over the look-back, the SLO-percentile latency of the
application's HTTP requests at the proxy, the replicas' processing time, and the requests
queued at the handles and in the replicas. The processing time is the service time of the
last half hour (``forecasting.serve_history.service_time_ms``): Ray times a request from when a
replica admits it, so a busy minute's includes the wait for the user's code, which a
planner must not take for service. What a meter knows that Serve does not
export (drops by reason, the data path's queue) is reported empty: these models are planned
as the simulator plans a model, from arrivals, latency and processing time.

The minute history is read once per new completed minute; the rest every tick (a handful
of queries for all models together).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from faro_serve.meter_report import MeterReport, Processing
from forecasting.prometheus import PrometheusError, contiguous_tail
from forecasting.rayserve import HEALTHY, HTTP_LATENCY, ONGOING, PROCESSING, QUEUED, REQUESTS
from forecasting.serve_counters import counter_minutes, export_lag_s, query, query_range
from forecasting.serve_history import service_time_ms

# rates and latency over this window: longer than the meters' 30 s look-back, so that a
# scrape interval of 15 s (Prometheus's default) still gives each window several samples
WINDOW_S = 60
# a minute is complete this long after its end: Ray's metrics agent reports every 10 s and
# Prometheus scrapes every 5-15 s, so a minute read at once would miss its last seconds (a
# plan would forecast from a low last minute); until then it is the open minute. Its end is
# read ``export_lag_s`` later (at most this, for a scrape interval up to 30 s)
LAG_S = 20.0
QUIET_MINUTES = 30


class ServeMetricsObserver:
    """``url``: the Prometheus; ``minutes``: the completed minutes each report carries."""

    def __init__(self, url: str, minutes: int, clock: Callable[[], float] = time.time, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self.minutes = int(minutes)
        self.clock = clock
        self.timeout_s = timeout_s
        self._minutes_at: float | None = None  # the minute the history was read for
        self._history: dict[tuple[str, str], np.ndarray] = {}
        self._service: dict[tuple[str, str], float] = {}
        self.lag_s: float | None = None  # read from Prometheus at the first report

    def _q(self, q: str, t: float) -> list[dict[str, Any]]:
        return query(self.url, q, t, self.timeout_s)

    def _by(self, result: list[dict[str, Any]], label: str = "deployment") -> dict[tuple[str, str], float]:
        out = {}
        for s in result:
            m = s.get("metric", {})
            v = float(s["value"][1])
            if math.isfinite(v):
                out[(m.get("application", ""), m.get(label, ""))] = v
        return out

    def _read_history(self, minute_start: float) -> None:
        if self._minutes_at == minute_start:
            return
        if self.lag_s is None:
            self.lag_s = export_lag_s(self.url, self.timeout_s)
        grids = counter_minutes(
            self.url,
            REQUESTS,
            minute_start - 60.0 * (self.minutes - 1),
            self.minutes,
            [],
            self.timeout_s,
            lag_s=self.lag_s,
        )
        hist = {key: contiguous_tail(g) for key, g in grids.items()}
        self._service = self._read_service(minute_start)
        self._history, self._minutes_at = hist, minute_start

    def _read_service(self, minute_start: float) -> dict[tuple[str, str], float]:
        """Each deployment's service time over the last :data:`QUIET_MINUTES` completed
        minutes (``forecasting.serve_history.service_time_ms``: the wait inside a busy replica
        taken out of Ray's processing time, as ``whatif`` does)."""
        by = "application, deployment"
        first = minute_start - 60.0 * (QUIET_MINUTES - 1)
        grids: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        for name, q in (
            ("n", f"sum by ({by}) (increase({PROCESSING}_count[1m]))"),
            ("ms", f"sum by ({by}) (increase({PROCESSING}_sum[1m]))"),
            ("r", f"sum by ({by}) ({HEALTHY})"),
        ):
            for s in query_range(self.url, q, first, minute_start, 60, self.timeout_s):
                m = s.get("metric", {})
                grid = np.full(QUIET_MINUTES, np.nan)
                for t, v in s.get("values", []):
                    k = int(round((float(t) - first) / 60.0))
                    if 0 <= k < QUIET_MINUTES:
                        grid[k] = float(v)
                grids.setdefault((m.get("application", ""), m.get("deployment", "")), {})[name] = grid
        out = {}
        for key, g in grids.items():
            if "n" in g and "ms" in g:
                st = service_time_ms(np.nan_to_num(g["n"]), np.nan_to_num(g["ms"]), g.get("r", np.ones(QUIET_MINUTES)))
                if st is not None:
                    out[key] = st
        return out

    def reports(
        self, where: Mapping[str, tuple[str, str]], running: Mapping[str, int], percentile: Mapping[str, float]
    ) -> dict[str, dict[str, Any]]:
        """``{model: MeterReport JSON}`` of the models in ``where`` (model -> (application,
        deployment)) that Prometheus has; raises :class:`PrometheusError` when it cannot be
        read (the tick then fails, and says so in the status)."""
        now = self.clock()
        minute_start = math.floor((now - LAG_S) / 60.0) * 60.0  # of the open minute (up to 80 s)
        self._read_history(minute_start)
        w = f"{WINDOW_S}s"
        by = "application, deployment"
        rate = self._by(self._q(f"sum by ({by}) (rate({REQUESTS}[{w}]))", now))
        proc = self._service
        queued = self._by(self._q(f"sum by ({by}) ({QUEUED})", now))
        ongoing = self._by(self._q(f"sum by ({by}) ({ONGOING})", now))
        latency: dict[float, dict[str, float]] = {}
        for pct in sorted(set(percentile.values())) + [50.0]:
            latency[pct] = {
                k[0]: v
                for k, v in self._by(
                    self._q(
                        f"histogram_quantile({pct / 100:g}, sum by (application, le) "
                        f"(rate({HTTP_LATENCY}_bucket[{w}])))",
                        now,
                    ),
                    "application",
                ).items()
            }
        out = {}
        for name, (app, dep) in where.items():
            key = (app, dep)
            if key not in self._history and key not in rate:
                continue
            lam = rate.get(key, 0.0)
            elapsed = now - minute_start
            q, o = queued.get(key, 0.0), ongoing.get(key, 0.0)
            pct = percentile[name]
            out[name] = MeterReport(
                model=name,
                now=now,
                arrival_rate=lam,
                arrivals_per_min=tuple(float(x) for x in self._history.get(key, np.zeros(0))),
                current_minute_count=lam * elapsed,
                current_minute_elapsed_s=elapsed,
                latency_ms=latency[pct].get(app),
                latency_p50_ms=latency[50.0].get(app),
                latency_mean_ms=None,
                processing=Processing(proc.get(key), None, None, int(round(lam * WINDOW_S))),
                in_flight=int(round(q + o)),
                mean_in_flight=q + o,
                queue_length=q,
                arrivals_total=0,
                completed_total=0,
                dropped={},
                drop_rate=0.0,
                replicas=int(running.get(name, 0)),
                percentile=pct,
                setting={},
                waiting=int(round(q)),
                dispatched=0,
                dispatch_capacity=0,
                replica_cpus=None,
                replica_memory_gb=None,
            ).wire()
        return out


__all__ = ["ServeMetricsObserver", "PrometheusError", "WINDOW_S"]
