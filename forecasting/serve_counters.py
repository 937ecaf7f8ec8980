"""Ray Serve's counters in Prometheus, minute by minute (issue 48): the reading that
``forecasting.rayserve`` (a cluster's history) and the autoscaler's Ray-metrics source
(``autoscaler.driving.serve_metrics``) share.

Per-minute arrivals come from the request counter read per series at each minute's end
(:func:`counter_minutes`: resets, replicas that come and go and scrape gaps handled there),
read :func:`export_lag_s` after the minute's end: Ray's metrics agent exports a replica's
counter every 10 s and Prometheus scrapes it at its own interval, so a value in Prometheus
is on average that late. Kept apart from ``rayserve.py`` so that each reads on its own.
"""

from __future__ import annotations

import math
import re
from typing import Any, cast

import httpx
import numpy as np

from .prometheus import api_result

# Ray's metrics agent exports every ``metrics_report_interval_ms`` (10,000 by default), and
# the ``prometheus.yml`` Ray generates scrapes every 10 s
RAY_EXPORT_S = 10.0
RAY_SCRAPE_S = 10.0


# -- Prometheus ---------------------------------------------------------------------------
def query(url: str, q: str, t: float, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """An instant query's result at ``t`` (epoch s)."""
    return api_result(url.rstrip("/"), "/api/v1/query", {"query": q, "time": t}, timeout_s)


def query_range(
    url: str, q: str, start: float, end: float, step: float, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """A range query's result, one value per ``step`` s from ``start`` to ``end``."""
    return api_result(
        url.rstrip("/"), "/api/v1/query_range", {"query": q, "start": start, "end": end, "step": step}, timeout_s
    )


def series_grid(series: dict[str, Any], start: float, n: int, step: float) -> np.ndarray:
    out = np.full(n, np.nan)
    for t, v in series.get("values", []):
        k = int(round((float(t) - start) / step))
        if 0 <= k < n:
            out[k] = float(v)
    return out


def by_deployment(
    result: list[dict[str, Any]], start: float, n: int, step: float = 60.0
) -> dict[tuple[str, str], np.ndarray]:
    out = {}
    for s in result:
        m = s.get("metric", {})
        if m.get("deployment") is not None:
            out[(m.get("application", ""), m["deployment"])] = series_grid(s, start, n, step)
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
    inner = np.isnan(x[first : last + 1])
    if inner.any():
        idx = np.arange(first, last + 1)
        gaps = idx[inner]
        x[gaps] = np.interp(gaps, idx[~inner], x[first : last + 1][~inner])
        notes.append(
            f"{key}: {gaps.size} minute(s) without a scrape (first at minute "
            f"{int(gaps[0])}), filled from the minutes beside them"
        )
    x[:first] = 0.0
    x[last + 1 :] = 0.0
    return cast(np.ndarray, np.maximum(x, 0.0))


def counter_minutes(
    url: str,
    metric: str,
    first_end: float,
    minutes: int,
    notes: list[str],
    timeout_s: float = 60.0,
    match: str = "",
    lag_s: float = 0.0,
) -> dict[tuple[str, str], np.ndarray]:
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
    res = query_range(
        url, f"last_over_time({sel}[1m])", first_end - 60.0, first_end + 60.0 * (minutes - 1), 60, timeout_s
    )
    out: dict[tuple[str, str], np.ndarray] = {}
    resets: dict[tuple[str, str], int] = {}
    gaps: dict[tuple[str, str], tuple[int, int]] = {}
    for series in res:
        m = series.get("metric", {})
        if m.get("deployment") is None:
            continue
        key = (m.get("application", ""), m["deployment"])
        v = series_grid(series, first_end - 60.0, minutes + 1, 60.0)  # at each minute's start and end
        inc = np.full(minutes, np.nan)
        prev = None  # (boundary, value)
        for k in range(minutes + 1):
            if math.isnan(v[k]):
                continue
            if prev is not None:
                j, pv = prev
                d = v[k] - pv if v[k] >= pv else v[k] + _before_reset(url, metric, m, first_end, k, pv, timeout_s)
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
        notes.append(
            f"{app}/{dep}: no scrape for {n - 1} minute(s) after minute {j}: the requests "
            f"counted across the gap are spread over its {n} minutes"
        )
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


def _before_reset(
    url: str, metric: str, labels: dict[str, str], first_end: float, k: int, pv: float, timeout_s: float
) -> float:
    """What a series counted between its value ``pv`` at the start of the minute that ends at
    boundary ``k`` and its reset inside that minute: its highest value there less ``pv``
    (one query, for the rare reset: Ray starts a new series for a new replica)."""
    sel = ",".join(f'{n}="{v}"' for n, v in labels.items() if n != "__name__")
    t = first_end + 60.0 * (k - 1)
    res = query(url, f"max_over_time({metric}{{{sel}}}[1m])", t, timeout_s)
    top = max((float(r["value"][1]) for r in res), default=pv)
    return max(top - pv, 0.0)
