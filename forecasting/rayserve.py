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

Per-minute arrivals come from the request counter read per series at each minute's end
(:func:`counter_minutes`: resets, replicas that come and go and scrape gaps handled there),
read :func:`export_lag_s` after the minute's end: Ray's metrics agent exports a replica's
counter every 10 s and Prometheus scrapes it at its own interval, so a value in Prometheus
is on average that late. A minute Prometheus has no value for while the deployment ran
before and after it is a gap: it is filled from the minutes beside it and named in
:attr:`ServeHistory.notes`, as are a deployment that appears after the range starts (zero
before) and a counter reset.

Each application's deployment options come from Serve's REST API (``GET
/api/serve/applications/`` on the dashboard): :func:`serve_configs`. What is read is a
``forecasting.serve_history.ServeHistory``, which saves to the export ``whatif`` reads.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import httpx
import numpy as np

from .prometheus import MAX_POINTS, api_result
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
# Ray's metrics agent exports every ``metrics_report_interval_ms`` (10,000 by default), and
# the ``prometheus.yml`` Ray generates scrapes every 10 s
RAY_EXPORT_S = 10.0
RAY_SCRAPE_S = 10.0


# -- Prometheus ---------------------------------------------------------------------------
def query(url: str, q: str, t: float, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """An instant query's result at ``t`` (epoch s)."""
    return api_result(url.rstrip("/"), "/api/v1/query", {"query": q, "time": t}, timeout_s)


def query_range(url: str, q: str, start: float, end: float, step: float,
                timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """A range query's result, one value per ``step`` s from ``start`` to ``end``."""
    return api_result(url.rstrip("/"), "/api/v1/query_range",
                {"query": q, "start": start, "end": end, "step": step}, timeout_s)


def _grid(series: dict[str, Any], start: float, n: int, step: float) -> np.ndarray:
    out = np.full(n, np.nan)
    for t, v in series.get("values", []):
        k = int(round((float(t) - start) / step))
        if 0 <= k < n:
            out[k] = float(v)
    return out


def _by_deployment(result: list[dict[str, Any]], start: float, n: int,
                   step: float = 60.0) -> dict[tuple[str, str], np.ndarray]:
    out = {}
    for s in result:
        m = s.get("metric", {})
        if m.get("deployment") is not None:
            out[(m.get("application", ""), m["deployment"])] = _grid(s, start, n, step)
    return out


def fill_gaps(x: np.ndarray, key: str, notes: list[str]) -> np.ndarray:
    """Minutes before the first value are 0 (the deployment did not exist yet, named);
    a gap between values is filled linearly (named); minutes after the last value are 0
    (it was deleted, named)."""
    x = np.asarray(x, float).copy()
    seen = np.flatnonzero(~np.isnan(x))
    if not seen.size:
        return np.zeros_like(x)
    first, last = int(seen[0]), int(seen[-1])
    if first > 0:
        notes.append(f"{key}: appears at minute {first} (no requests counted before)")
    if last < x.size - 1:
        notes.append(f"{key}: no values after minute {last} (taken as no requests)")
    inner = np.isnan(x[first:last + 1])
    if inner.any():
        idx = np.arange(first, last + 1)
        gaps = idx[inner]
        x[gaps] = np.interp(gaps, idx[~inner], x[first:last + 1][~inner])
        notes.append(f"{key}: {gaps.size} minute(s) without a scrape (first at minute "
                     f"{int(gaps[0])}), filled from the minutes beside them")
    x[:first] = 0.0
    x[last + 1:] = 0.0
    return cast(np.ndarray, np.maximum(x, 0.0))


def counter_minutes(url: str, metric: str, first_end: float, minutes: int, notes: list[str],
                    timeout_s: float = 60.0, match: str = "", lag_s: float = 0.0) -> dict[tuple[str, str], np.ndarray]:
    """Per (application, deployment): the counter's increase in each of ``minutes`` minutes,
    the first ending at ``first_end``; NaN where no series of it had a value. Each minute's
    end is read ``lag_s`` later (:func:`export_lag_s`: what Prometheus holds is that late).

    Read per series (one per replica) as ``last_over_time(...[1m])`` at each minute's end,
    so that a replica that stopped inside a minute still counts its last requests; a series
    that appears after the range starts counts from 0 (Ray exports a counter only once it
    has counted, so Prometheus's ``increase`` would miss a new replica's first requests); a
    value below the one before is a reset (a restarted replica) and counts from 0; the
    requests of a series' scrape gap are spread over the gap's minutes."""
    sel = f"{metric}{{{match}}}" if match else metric
    first_end += lag_s
    res = query_range(url, f"last_over_time({sel}[1m])", first_end - 60.0, first_end + 60.0 * (minutes - 1),
                      60, timeout_s)
    out: dict[tuple[str, str], np.ndarray] = {}
    resets: dict[tuple[str, str], int] = {}
    gaps: dict[tuple[str, str], tuple[int, int]] = {}
    for series in res:
        m = series.get("metric", {})
        if m.get("deployment") is None:
            continue
        key = (m.get("application", ""), m["deployment"])
        v = _grid(series, first_end - 60.0, minutes + 1, 60.0)  # at each minute's start and end
        inc = np.full(minutes, np.nan)
        prev = None  # (boundary, value)
        for k in range(minutes + 1):
            if math.isnan(v[k]):
                continue
            if prev is not None:
                j, pv = prev
                d = v[k] - pv if v[k] >= pv else v[k] + _before_reset(url, metric, m, first_end, k, pv,
                                                                     timeout_s)
                if v[k] < pv:
                    resets[key] = resets.get(key, 0) + 1
                inc[j:k] = d / (k - j)
                if k - j > 1:
                    gaps.setdefault(key, (j, k - j))
            elif k > 0:
                inc[k - 1] = v[k]  # a new series: counted from 0
            prev = (k, v[k])
        grid = out.setdefault(key, np.full(minutes, np.nan))
        out[key] = np.where(np.isnan(grid), inc, np.where(np.isnan(inc), grid, grid + inc))
    for (app, dep), n in sorted(resets.items()):
        notes.append(f"{app}/{dep}: {n} counter reset(s) (a replica restarted); counted across")
    for (app, dep), (j, n) in sorted(gaps.items()):
        notes.append(f"{app}/{dep}: no scrape for {n - 1} minute(s) after minute {j}: the requests "
                     f"counted across the gap are spread over its {n} minutes")
    return out


def export_lag_s(url: str, timeout_s: float = 10.0) -> float:
    """How late, on average, a request shows in Ray's counter in Prometheus: half Ray's export
    period plus half the scrape interval (the longest of the active targets'; Ray's generated
    10 s where Prometheus scrapes nothing now, as when it serves an archived TSDB). Measured
    on issue 48's live bench: read at the minute's end, a deployment whose rate fell from 665
    to 94 requests a minute lost 86 requests to the next minute (9 s of its rate)."""
    try:
        r = httpx.get(f"{url.rstrip('/')}/api/v1/targets", params={"state": "active"}, timeout=timeout_s)
        targets = r.json().get("data", {}).get("activeTargets", [])
    except (httpx.HTTPError, ValueError, AttributeError):
        targets = []
    scrapes = [s for s in (_seconds(t.get("scrapeInterval", "")) for t in targets) if s]
    return RAY_EXPORT_S / 2 + (max(scrapes) if scrapes else RAY_SCRAPE_S) / 2


def _seconds(text: str) -> float | None:
    """A Prometheus duration (``5s``, ``1m``, ``1m30s``) in seconds; None if not one."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text or "")
    if not parts or "".join(a + b for a, b in parts) != text:
        return None
    return sum(float(a) * {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}[b] for a, b in parts)


def _before_reset(url: str, metric: str, labels: dict[str, str], first_end: float, k: int, pv: float,
                  timeout_s: float) -> float:
    """What a series counted between its value ``pv`` at the start of the minute that ends at
    boundary ``k`` and its reset inside that minute: its highest value there less ``pv``
    (one query, for the rare reset: Ray starts a new series for a new replica)."""
    sel = ",".join(f'{n}="{v}"' for n, v in labels.items() if n != "__name__")
    t = first_end + 60.0 * (k - 1)
    res = query(url, f"max_over_time({metric}{{{sel}}}[1m])", t, timeout_s)
    top = max((float(r["value"][1]) for r in res), default=pv)
    return max(top - pv, 0.0)


def read_serve_history(url: str, minutes: int, end: float | None = None,
                       dashboard_url: str | None = None, timeout_s: float = 60.0,
                       lag_s: float | None = None) -> ServeHistory:
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
        raise ServeHistoryError(f"{base}: no Ray Serve requests in the {minutes} minutes before "
                                f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(end_t))} UTC "
                                f"(no {REQUESTS} series: is Prometheus scraping Ray's metrics?)")
    reps = _by_deployment(api_result(base, "/api/v1/query_range",
                               {"query": f"sum by (application, deployment) ({HEALTHY})", **rng}, timeout_s),
                          first_end, minutes)
    window = f"{minutes}m"
    buckets = api_result(base, "/api/v1/query", {"query": f"sum by (application, deployment, le) "
                                                    f"(increase({PROCESSING}_bucket[{window}]))", "time": end_t},
                   timeout_s)
    sums = api_result(base, "/api/v1/query", {"query": f"sum by (application, deployment) "
                                                 f"(increase({PROCESSING}_sum[{window}])) / sum by "
                                                 f"(application, deployment) (increase({PROCESSING}_count[{window}]))",
                                        "time": end_t}, timeout_s)
    proc: dict[tuple[str, str], dict[float, float]] = {}
    for s in buckets:
        m = s.get("metric", {})
        proc.setdefault((m.get("application", ""), m.get("deployment")), {})[float(m.get("le", "inf"))] = \
            float(s["value"][1])
    means = {(s["metric"].get("application", ""), s["metric"].get("deployment")): float(s["value"][1])
             for s in sums if math.isfinite(float(s["value"][1]))}
    deps = {}
    for (app, dep), grid in sorted(arr.items()):
        key = f"{app}/{dep}"
        le = sorted(proc.get((app, dep), {}))
        deps[key] = DeploymentHistory(
            application=app, deployment=dep, arrivals=fill_gaps(grid, key, notes).round(3).tolist(),
            replicas=reps.get((app, dep), np.full(minutes, np.nan)).tolist(),
            processing_le=le, processing_counts=[proc[(app, dep)][x] for x in le],
            processing_mean_ms=means.get((app, dep)))
    latency = read_app_latency(base, first_end, end_t, minutes, {d.application for d in deps.values()},
                               timeout_s)
    read_processing_steps(base, end_t, minutes, deps, timeout_s)
    hist = ServeHistory(start=first_end - 60.0, minutes=minutes, deployments=deps, latency=latency,
                        notes=notes, source=base)
    if dashboard_url:
        attach_configs(hist, serve_configs(dashboard_url, timeout_s))
    return hist


def read_app_latency(base: str, first_end: float, end_t: float, minutes: int, apps: set[str],
                     timeout_s: float = 60.0) -> dict[str, AppLatency]:
    """Each application's end-to-end latency histogram per step (a minute, or longer so that
    the range has at most :data:`LATENCY_STEPS` steps)."""
    k, step, n = _steps(minutes)
    t0 = end_t - step * (n - 1)
    res = api_result(base, "/api/v1/query_range",
               {"query": f"sum by (application, le) (increase({HTTP_LATENCY}_bucket[{k}m]))",
                "start": t0, "end": end_t, "step": step}, timeout_s)
    grids: dict[str, dict[float, np.ndarray]] = {}
    for s in res:
        m = s.get("metric", {})
        if m.get("application") in apps:
            grids.setdefault(m["application"], {})[float(m.get("le", "inf"))] = _grid(s, t0, n, step)
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

    def __init__(self, url: str, where: dict[str, tuple[str, str]], keep_days: float = 7.0,
                 timeout_s: float = 10.0):
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
        got = counter_minutes(self.url, REQUESTS, 60.0 * (end - n + 1), n, [], self.timeout_s,
                              match=f'application="{app}",deployment="{dep}"', lag_s=self.lag_s)
        return got.get((app, dep), out)


def _steps(minutes: int) -> tuple[int, float, int]:
    """(minutes per step, step s, steps) of the per-step histograms: a minute, or longer so
    that the range has at most :data:`LATENCY_STEPS` steps."""
    k = max(1, math.ceil(minutes / LATENCY_STEPS))
    return k, 60.0 * k, math.ceil(minutes / k)


def read_processing_steps(base: str, end_t: float, minutes: int, deps: dict[str, DeploymentHistory],
                          timeout_s: float = 60.0) -> None:
    """Each deployment's processing histogram and summed milliseconds per step, into
    ``processing_steps`` and ``processing_step_ms`` (:meth:`DeploymentHistory.quiet_processing`)."""
    k, step, n = _steps(minutes)
    t0 = end_t - step * (n - 1)
    by = "application, deployment"
    buckets = query_range(base, f"sum by ({by}, le) (increase({PROCESSING}_bucket[{k}m]))", t0, end_t, step,
                          timeout_s)
    sums = query_range(base, f"sum by ({by}) (increase({PROCESSING}_sum[{k}m]))", t0, end_t, step, timeout_s)
    grids: dict[str, dict[float, np.ndarray]] = {}
    for s in buckets:
        m = s.get("metric", {})
        grids.setdefault(f"{m.get('application', '')}/{m.get('deployment')}", {})[float(m.get("le", "inf"))] = \
            _grid(s, t0, n, step)
    ms = {f"{s['metric'].get('application', '')}/{s['metric'].get('deployment')}": _grid(s, t0, n, step)
          for s in sums}
    for key, d in deps.items():
        if key not in grids or key not in ms:
            continue
        le = sorted(grids[key])
        d.processing_step_s = step
        d.processing_steps = np.nan_to_num(np.stack([grids[key][x] for x in le], axis=1)).round(3).tolist()
        d.processing_step_ms = np.nan_to_num(ms[key]).round(3).tolist()


# -- Serve's REST API ---------------------------------------------------------------------
CONFIG_FIELDS = ("num_replicas", "autoscaling_config", "max_ongoing_requests", "max_queued_requests",
                 "ray_actor_options")


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


