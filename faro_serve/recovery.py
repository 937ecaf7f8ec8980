"""How fast a model recovers from a step in load: the surge metrics (issue 18, ours).

Same input as :mod:`faro_serve.metrics`: one record per request (arrival time, end-to-end
latency, dropped), from the simulator or from a live load generator, so a simulated and a
live step are measured by the same code.

* :func:`recovery_time`: seconds from the step until the SLO-percentile latency over a
  sliding window (10 s of arrivals, drops counted as infinitely slow) is under the SLO and
  stays there for the rest of the span (two minutes): the first arrival time from which
  every window meets the SLO. A window is placed by its start, so the figure does not
  include the window's own length; its end comes ``window_s`` later. The span is bounded
  because a model provisioned for its p99 still breaks the SLO in a 10 s window now and
  then (a p99 over about 100 requests is close to their maximum).
* :func:`surge_damage`: requests dropped or slower than the SLO among those that arrived in
  the step's first two minutes.
"""

from __future__ import annotations

import math

import numpy as np


def _latencies(latency_s, dropped) -> np.ndarray:
    return np.where(np.asarray(dropped, bool), np.inf, np.asarray(latency_s, float))


def window_percentiles(
    arrival_s, latency_s, dropped, percentile: float, starts: np.ndarray, window_s: float
) -> np.ndarray:
    """Percentile latency of the requests arriving in ``[t, t + window_s)`` for each start
    ``t``; NaN for an empty window, inf when the percentile falls on a dropped request."""
    arr = np.asarray(arrival_s, float)
    lat = _latencies(latency_s, dropped)
    order = np.argsort(arr, kind="stable")
    arr, lat = arr[order], lat[order]
    lo = np.searchsorted(arr, starts, side="left")
    hi = np.searchsorted(arr, starts + window_s, side="left")
    out = np.full(starts.size, np.nan)
    q = percentile / 100.0
    for k, (a, b) in enumerate(zip(lo, hi)):
        if b > a:
            v = np.sort(lat[a:b])
            h = (v.size - 1) * q  # numpy's 'linear' rule; inf stays inf
            i = int(math.floor(h))
            frac = h - i
            j = min(i + 1, v.size - 1)
            out[k] = (
                v[i] if frac == 0 or v[i] == v[j] else (math.inf if math.isinf(v[j]) else v[i] + (v[j] - v[i]) * frac)
            )
    return out


def recovery_time(
    arrival_s,
    latency_s,
    dropped,
    slo_s: float,
    percentile: float,
    step_s: float,
    *,
    window_s: float = 10.0,
    resolution_s: float = 1.0,
    until_s: float | None = None,
) -> float | None:
    """Seconds from ``step_s`` to the first window start from which every window meets the SLO.

    Windows of ``window_s`` start every ``resolution_s`` from ``step_s`` and end by
    ``until_s`` (default: the last arrival); a window without requests counts as met. 0 means
    the SLO held throughout; None means it was still broken in the last window.
    """
    arr = np.asarray(arrival_s, float)
    end = until_s if until_s is not None else (float(arr.max()) if arr.size else step_s)
    if end - step_s < window_s:
        raise ValueError(
            f"the records end {end - step_s:.1f} s after the step; a recovery "
            f"needs at least one whole {window_s:g} s window"
        )
    starts = np.arange(step_s, end - window_s + 1e-9, resolution_s)
    p = window_percentiles(arr, latency_s, dropped, percentile, starts, window_s)
    bad = np.flatnonzero(~(np.isnan(p) | (p <= slo_s)))
    if bad.size == 0:
        return 0.0
    if bad[-1] == starts.size - 1:
        return None
    return float(starts[bad[-1] + 1] - step_s)


def surge_damage(arrival_s, latency_s, dropped, slo_s: float, step_s: float, span_s: float = 120.0) -> dict:
    """Requests that arrived in ``[step_s, step_s + span_s)``, and how many of them were
    dropped or slower than the SLO."""
    arr = np.asarray(arrival_s, float)
    lat = _latencies(latency_s, dropped)
    sel = (arr >= step_s) & (arr < step_s + span_s)
    drops = int(np.asarray(dropped, bool)[sel].sum())
    slow = int(((lat[sel] > slo_s) & np.isfinite(lat[sel])).sum())
    return {"requests": int(sel.sum()), "dropped": drops, "over_slo": slow, "bad": drops + slow}


def surge_report(
    names,
    model,
    arrival_s,
    latency_s,
    dropped,
    slo_s,
    percentile,
    step_s: float,
    *,
    window_s: float = 10.0,
    span_s: float = 120.0,
) -> dict:
    """Per model: the recovery time within, and the damage of, the first ``span_s`` seconds
    after a step at ``step_s`` (what ``simulate --step-at`` and ``replay --step-at`` write
    to JSON)."""
    model = np.asarray(model, int)
    arr = np.asarray(arrival_s, float)
    slo = np.broadcast_to(np.asarray(slo_s, float), (len(names),))
    pct = np.broadcast_to(np.asarray(percentile, float), (len(names),))
    end = min(step_s + span_s, float(arr.max()) if arr.size else step_s)
    out = {}
    for i, n in enumerate(names):
        sel = model == i
        rec = None
        if end - step_s >= window_s:
            rec = recovery_time(
                arr[sel],
                np.asarray(latency_s)[sel],
                np.asarray(dropped)[sel],
                float(slo[i]),
                float(pct[i]),
                step_s,
                window_s=window_s,
                until_s=end,
            )
        out[n] = {
            "recovery_s": rec,
            **surge_damage(
                arr[sel], np.asarray(latency_s)[sel], np.asarray(dropped)[sel], float(slo[i]), step_s, span_s
            ),
        }
    return {"step_s": step_s, "window_s": window_s, "span_s": span_s, "models": out}
