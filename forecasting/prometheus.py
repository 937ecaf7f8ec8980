"""Per-minute arrivals from a Prometheus server (issue 32: Prometheus as the other history
source): what ``faro-serve forecast train --from http://...`` trains on where a cluster's
metrics are kept in Prometheus rather than (or as well as) the autoscaler's SQLite store.

The model meters publish their arrivals as the counter ``ray_faro_requests_total`` with
``outcome="arrival"`` and a ``model`` label (``faro_serve/serving/control.py``, through
``ray.util.metrics``); one ``query_range`` at a 60 s step of ``increase(...[1m])`` gives each
model's arrivals per minute. A minute Prometheus has no value for (a scrape gap, a model not
running) ends what is used: only each model's contiguous minutes up to its newest, after its
last gap, are returned, as the forecaster wants contiguous minutes. Prometheus answers at most 11,000
points per series: a week of minutes (10,080) fits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, cast

import httpx
import numpy as np

METRIC = "ray_faro_requests_total"
MAX_POINTS = 11_000


class PrometheusError(ValueError):
    """Prometheus could not be read or did not answer as expected (the text says why)."""


def contiguous_tail(grid: np.ndarray) -> np.ndarray:
    """The minutes after the last gap (NaN) up to the newest value: the forecaster wants
    contiguous minutes."""
    seen = np.flatnonzero(~np.isnan(grid))
    if not seen.size:
        return np.zeros(0)
    grid = grid[: seen[-1] + 1]
    gaps = np.flatnonzero(np.isnan(grid))
    return cast(np.ndarray, np.maximum(grid[gaps[-1] + 1 :] if gaps.size else grid, 0.0))


def api_result(base: str, path: str, params: Mapping[str, Any], timeout_s: float) -> list[dict[str, Any]]:
    """``data.result`` of one call to the Prometheus HTTP API at ``base``; every way it can
    fail is one :class:`PrometheusError` naming the server and the query."""
    try:
        r = httpx.get(f"{base}{path}", params=params, timeout=timeout_s)
    except (httpx.HTTPError, httpx.InvalidURL) as err:
        raise PrometheusError(f"{base}: cannot read Prometheus ({type(err).__name__}: {err})") from None
    try:
        doc = r.json()
    except ValueError:
        raise PrometheusError(f"{base}: not a Prometheus API (HTTP {r.status_code}, not JSON)") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        why = doc.get("error", doc) if isinstance(doc, dict) else doc
        raise PrometheusError(f"{base}: the query {params.get('query')!r} failed (HTTP {r.status_code}): {why}")
    return cast("list[dict[str, Any]]", doc.get("data", {}).get("result", []))


def arrivals_query(metric: str = METRIC) -> str:
    return f'sum by (model) (increase({metric}{{outcome="arrival"}}[1m]))'


def prometheus_history(
    url: str, minutes: int = 7 * 1440, end: float | None = None, metric: str = METRIC, timeout_s: float = 30.0
) -> dict[str, np.ndarray]:
    """``{model: per-minute arrivals}`` of the ``minutes`` before ``end`` (default: now) from
    the Prometheus at ``url``, each model's contiguous minutes after its last gap."""
    if not 1 <= minutes < MAX_POINTS:
        raise PrometheusError(f"minutes must be between 1 and {MAX_POINTS - 1} (got {minutes})")
    end = math.floor((time.time() if end is None else end) / 60.0) * 60.0
    start = end - 60.0 * (minutes - 1)
    params: dict[str, str | float] = {"query": arrivals_query(metric), "start": start, "end": end, "step": 60}
    out = {}
    for series in api_result(url.rstrip("/"), "/api/v1/query_range", params, timeout_s):
        model = series.get("metric", {}).get("model")
        if not model:
            continue
        grid = np.full(minutes, np.nan)
        for t, v in series.get("values", []):
            k = int(round((float(t) - start) / 60.0))
            if 0 <= k < minutes:
                grid[k] = max(float(v), 0.0)
        tail = contiguous_tail(grid)  # up to its newest minute (a model stopped earlier ends there)
        if tail.size:
            out[model] = tail
    return out
