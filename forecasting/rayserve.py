"""A Ray Serve cluster's own history, read from the Prometheus that scrapes it (issue 48):
what ``faro-serve whatif`` replays, what a shadow autoscaler observes, and the autoscaler's
other restore source, for a cluster that does not run faro-serve (yet).

Ray Serve 2.60 exports, through ``ray.util.metrics`` and Ray's metrics agent (names read
from its source, ``ray/serve/_private/replica.py``, ``deployment_state.py`` and
``request_ingress_metrics.py``; Ray adds the ``ray_`` prefix, Prometheus ``_total`` to
counters):

* ``ray_serve_deployment_request_counter_total``: requests a replica processed, labels
  ``application``, ``deployment``, ``replica``, ``route``: one series per replica, so a
  replica that restarts starts a new series (or resets one);
* ``ray_serve_deployment_processing_latency_ms`` (histogram): the time in the user's code;
* ``ray_serve_http_request_latency_ms`` (histogram, by ``application``): end to end at the
  HTTP proxy, what an SLO is about;
* ``ray_serve_deployment_replica_healthy``: 1 per healthy replica (or the healthy count per
  deployment, by Ray's settings: a ``sum`` is right either way).

Per-minute arrivals come from the request counter read per series at each minute's end,
late by Ray's export and the scrape (``forecasting.serve_counters``, shared with the
autoscaler's Ray-metrics source). A minute Prometheus has no value for while the
deployment ran before and after it is a gap: it is filled from the minutes beside it and
named in :attr:`ServeHistory.notes`, as are a deployment that appears after the range
starts (zero before) and a counter reset.

Each application's deployment options come from Serve's REST API (``GET
/api/serve/applications/`` on the dashboard): :func:`serve_configs`. What is read is a
``forecasting.serve_history.ServeHistory``, which saves to the export ``whatif`` reads.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from .prometheus import MAX_POINTS, api_result
from .serve_counters import by_deployment, counter_minutes, export_lag_s, fill_gaps, query_range, series_grid
from .serve_history import AppLatency, DeploymentHistory, ServeHistory, ServeHistoryError, attach_configs

REQUESTS = "ray_serve_deployment_request_counter_total"
PROCESSING = "ray_serve_deployment_processing_latency_ms"
HTTP_LATENCY = "ray_serve_http_request_latency_ms"
HEALTHY = "ray_serve_deployment_replica_healthy"
QUEUED = "ray_serve_deployment_queued_queries"
ONGOING = "ray_serve_num_ongoing_requests_at_replicas"
# the end-to-end latency histogram at most this many steps over the range (one query per
# application and bucket: a week at per-minute steps would be 25 M points for 100 apps)
LATENCY_STEPS = 480


def read_serve_history(
    url: str,
    minutes: int,
    end: float | None = None,
    dashboard_url: str | None = None,
    timeout_s: float = 60.0,
    lag_s: float | None = None,
) -> ServeHistory:
    """The ``minutes`` completed minutes before ``end`` (default: now) of every Ray Serve
    deployment Prometheus at ``url`` has, with each application's config from the dashboard
    at ``dashboard_url`` (optional); each minute's end read ``lag_s`` later (default:
    :func:`export_lag_s`)."""
    if not 1 <= minutes < MAX_POINTS:
        raise ServeHistoryError(f"minutes must be between 1 and {MAX_POINTS - 1} (got {minutes})")
    base = url.rstrip("/")
    end_t = math.floor((time.time() if end is None else end) / 60.0) * 60.0  # the last minute's end
    first_end = end_t - 60.0 * (minutes - 1)  # the first minute's end
    rng = {"start": first_end, "end": end_t, "step": 60}
    notes: list[str] = []
    lag = export_lag_s(base) if lag_s is None else float(lag_s)
    arr = counter_minutes(base, REQUESTS, first_end, minutes, notes, timeout_s, lag_s=lag)
    if not arr:
        raise ServeHistoryError(
            f"{base}: no Ray Serve requests in the {minutes} minutes before "
            f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(end_t))} UTC "
            f"(no {REQUESTS} series: is Prometheus scraping Ray's metrics?)"
        )
    reps = by_deployment(
        api_result(
            base, "/api/v1/query_range", {"query": f"sum by (application, deployment) ({HEALTHY})", **rng}, timeout_s
        ),
        first_end,
        minutes,
    )
    window = f"{minutes}m"
    buckets = api_result(
        base,
        "/api/v1/query",
        {"query": f"sum by (application, deployment, le) (increase({PROCESSING}_bucket[{window}]))", "time": end_t},
        timeout_s,
    )
    sums = api_result(
        base,
        "/api/v1/query",
        {
            "query": f"sum by (application, deployment) "
            f"(increase({PROCESSING}_sum[{window}])) / sum by "
            f"(application, deployment) (increase({PROCESSING}_count[{window}]))",
            "time": end_t,
        },
        timeout_s,
    )
    proc: dict[tuple[str, str], dict[float, float]] = {}
    for s in buckets:
        m = s.get("metric", {})
        proc.setdefault((m.get("application", ""), m.get("deployment")), {})[float(m.get("le", "inf"))] = float(
            s["value"][1]
        )
    means = {
        (s["metric"].get("application", ""), s["metric"].get("deployment")): float(s["value"][1])
        for s in sums
        if math.isfinite(float(s["value"][1]))
    }
    deps = {}
    for (app, dep), grid in sorted(arr.items()):
        key = f"{app}/{dep}"
        le = sorted(proc.get((app, dep), {}))
        deps[key] = DeploymentHistory(
            application=app,
            deployment=dep,
            arrivals=fill_gaps(grid, key, notes).round(3).tolist(),
            replicas=reps.get((app, dep), np.full(minutes, np.nan)).tolist(),
            processing_le=le,
            processing_counts=[proc[(app, dep)][x] for x in le],
            processing_mean_ms=means.get((app, dep)),
        )
    latency = read_app_latency(base, first_end, end_t, minutes, {d.application for d in deps.values()}, timeout_s)
    read_processing_steps(base, end_t, minutes, deps, timeout_s)
    hist = ServeHistory(
        start=first_end - 60.0, minutes=minutes, deployments=deps, latency=latency, notes=notes, source=base
    )
    if dashboard_url:
        attach_configs(hist, serve_configs(dashboard_url, timeout_s))
    return hist


def read_app_latency(
    base: str, first_end: float, end_t: float, minutes: int, apps: set[str], timeout_s: float = 60.0
) -> dict[str, AppLatency]:
    """Each application's end-to-end latency histogram per step (a minute, or longer so that
    the range has at most :data:`LATENCY_STEPS` steps)."""
    k, step, n = _steps(minutes)
    t0 = end_t - step * (n - 1)
    res = api_result(
        base,
        "/api/v1/query_range",
        {
            "query": f"sum by (application, le) (increase({HTTP_LATENCY}_bucket[{k}m]))",
            "start": t0,
            "end": end_t,
            "step": step,
        },
        timeout_s,
    )
    grids: dict[str, dict[float, np.ndarray]] = {}
    for s in res:
        m = s.get("metric", {})
        if m.get("application") in apps:
            grids.setdefault(m["application"], {})[float(m.get("le", "inf"))] = series_grid(s, t0, n, step)
    out = {}
    for app, by_le in grids.items():
        le = sorted(by_le)
        rows = np.nan_to_num(np.stack([by_le[x] for x in le], axis=1))
        out[app] = AppLatency(le=le, step_s=step, counts=rows.round(3).tolist())
    return out


class ServeMetricsStore:
    """The live loop's other restore source (issue 48): Ray Serve's request counters in
    Prometheus, read only, as the history a new autoscaler forecasts from at its first tick
    where it has no arrival store of its own: a ``forecasting.store.HistorySource``, as the
    SQLite ``ArrivalStore`` is. ``where``: model -> (application, deployment)."""

    def __init__(self, url: str, where: dict[str, tuple[str, str]], keep_days: float = 7.0, timeout_s: float = 10.0):
        self.url = self.path = url.rstrip("/")
        self.where = dict(where)
        self.keep_minutes = min(int(round(keep_days * 1440)), MAX_POINTS - 1)
        self.timeout_s = timeout_s
        self.refused: list[dict[str, str]] = []
        self.lag_s: float | None = None  # read from Prometheus at the first load

    def append_many(self, model: str, rows: Iterable[tuple[float, float]]) -> int:
        return 0  # Prometheus keeps the minutes itself

    def load(self, model: str, minutes: int, end_minute: int | None = None) -> np.ndarray:
        """``model``'s requests in each of the ``minutes`` wall-clock minutes before
        ``end_minute`` (epoch minutes, exclusive; default: the current one); NaN where
        Prometheus has no value."""
        n = min(max(int(minutes), 0), MAX_POINTS - 1)
        out = np.full(n, np.nan)
        if not n:
            return out
        end = math.floor(time.time() / 60.0) if end_minute is None else int(end_minute)
        app, dep = self.where.get(model, (model, "Model"))
        if self.lag_s is None:
            self.lag_s = export_lag_s(self.url, self.timeout_s)
        got = counter_minutes(
            self.url,
            REQUESTS,
            60.0 * (end - n + 1),
            n,
            [],
            self.timeout_s,
            match=f'application="{app}",deployment="{dep}"',
            lag_s=self.lag_s,
        )
        return got.get((app, dep), out)


def _steps(minutes: int) -> tuple[int, float, int]:
    """(minutes per step, step s, steps) of the per-step histograms: a minute, or longer so
    that the range has at most :data:`LATENCY_STEPS` steps."""
    k = max(1, math.ceil(minutes / LATENCY_STEPS))
    return k, 60.0 * k, math.ceil(minutes / k)


def read_processing_steps(
    base: str, end_t: float, minutes: int, deps: dict[str, DeploymentHistory], timeout_s: float = 60.0
) -> None:
    """Each deployment's processing histogram and summed milliseconds per step, into
    ``processing_steps`` and ``processing_step_ms`` (:meth:`DeploymentHistory.quiet_processing`)."""
    k, step, n = _steps(minutes)
    t0 = end_t - step * (n - 1)
    by = "application, deployment"
    buckets = query_range(base, f"sum by ({by}, le) (increase({PROCESSING}_bucket[{k}m]))", t0, end_t, step, timeout_s)
    sums = query_range(base, f"sum by ({by}) (increase({PROCESSING}_sum[{k}m]))", t0, end_t, step, timeout_s)
    grids: dict[str, dict[float, np.ndarray]] = {}
    for s in buckets:
        m = s.get("metric", {})
        grids.setdefault(f"{m.get('application', '')}/{m.get('deployment')}", {})[float(m.get("le", "inf"))] = (
            series_grid(s, t0, n, step)
        )
    ms = {
        f"{s['metric'].get('application', '')}/{s['metric'].get('deployment')}": series_grid(s, t0, n, step)
        for s in sums
    }
    for key, d in deps.items():
        if key not in grids or key not in ms:
            continue
        le = sorted(grids[key])
        d.processing_step_s = step
        d.processing_steps = np.nan_to_num(np.stack([grids[key][x] for x in le], axis=1)).round(3).tolist()
        d.processing_step_ms = np.nan_to_num(ms[key]).round(3).tolist()


# -- Serve's REST API ---------------------------------------------------------------------
CONFIG_FIELDS = (
    "num_replicas",
    "autoscaling_config",
    "max_ongoing_requests",
    "max_queued_requests",
    "ray_actor_options",
)


def dashboard_headers() -> dict[str, str]:
    """Ray's token authentication for the dashboard's REST API, when a token is configured:
    ``RAY_AUTH_TOKEN``, the file ``RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token``."""
    token = os.environ.get("RAY_AUTH_TOKEN")
    if not token:
        path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
        token = path.read_text().strip() if path.is_file() else ""
    return {"Authorization": f"Bearer {token}"} if token else {}


def serve_configs(dashboard_url: str, timeout_s: float = 10.0) -> dict[str, dict[str, Any]]:
    """``{"app/deployment": deployment_config}`` of every running deployment, from Serve's
    REST API (``GET /api/serve/applications/``; the options as deployed, defaults included)."""
    base = dashboard_url.rstrip("/")
    try:
        r = httpx.get(f"{base}/api/serve/applications/", timeout=timeout_s, headers=dashboard_headers())
        doc = r.json()
    except (httpx.HTTPError, httpx.InvalidURL) as err:
        raise ServeHistoryError(f"{base}: cannot read Serve's REST API ({type(err).__name__}: {err})") from None
    except ValueError:
        raise ServeHistoryError(f"{base}: not Ray's dashboard (HTTP {r.status_code}, not JSON)") from None
    if r.status_code != 200 or not isinstance(doc, dict):
        raise ServeHistoryError(f"{base}/api/serve/applications/: HTTP {r.status_code}")
    out = {}
    for app, a in (doc.get("applications") or {}).items():
        for dep, d in (a.get("deployments") or {}).items():
            cfg = d.get("deployment_config") or {}
            out[f"{app}/{dep}"] = {k: cfg.get(k) for k in CONFIG_FIELDS if k in cfg}
    return out
