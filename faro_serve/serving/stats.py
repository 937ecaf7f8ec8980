"""What the router front measures for one model, as a pure Ray-free object (paper section 5).

The paper's modified Ray router collects arrival rates, per-request replica processing
time and end-to-end latency continually. :class:`MeterStats` keeps exactly that:

* arrivals: per-second counts over a short ring and per-minute counts over a long history
  (the forecaster's input), counted at arrival, dropped requests included;
* end-to-end latency and replica processing time of completed requests over a sliding
  window (``measures.LOOK_BACK_S``, the reactive look-back), with percentiles on demand;
* drops by reason, in-flight requests.

Times come from the caller (``now`` in seconds), so tests drive it with a fake clock. An
arrival may come late with its own time (the direct data path reports events in batches
from the proxy's router): it still lands in its own second and, if that closed minute is
still in the history, in its own minute.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from ..measures import ARRIVAL_RATE_S, HISTORY_MINUTES, LOOK_BACK_S


class MeterStats:
    def __init__(self, window_s: float = LOOK_BACK_S, history_minutes: int = HISTORY_MINUTES, start: float = 0.0):
        self.window_s = window_s
        self.history_minutes = history_minutes
        self.start = start
        self._minute = 0  # index of the current (open) minute since start
        self._minute_count = 0
        self.minutes: deque[int] = deque(maxlen=history_minutes)  # completed minutes
        self._seconds: dict[int, int] = {}  # second index -> arrivals, the last 60 s
        self._pruned_sec = -1  # the second at which _seconds was last pruned
        self._done: deque[tuple[float, float, float]] = deque()  # (t, latency s, processing s)
        self._proc: deque[tuple[float, float]] = deque()  # (t, processing s) reported alone
        self.in_flight = 0
        self._area = 0.0  # integral of in_flight over time since the last reset
        self._area_t = start  # time of the last in_flight change
        self._mean_since = start  # start of the current averaging period
        self.arrivals_total = 0
        self.completed_total = 0
        self.dropped: dict[str, int] = {}

    # -- recording -----------------------------------------------------------------------
    def _roll(self, now: float) -> None:
        m = int((now - self.start) // 60)
        while self._minute < m:
            self.minutes.append(self._minute_count)
            self._minute_count = 0
            self._minute += 1
        horizon = now - self.window_s
        while self._done and self._done[0][0] < horizon:
            self._done.popleft()
        while self._proc and self._proc[0][0] < horizon:
            self._proc.popleft()
        sec = int(now - self.start)
        if sec != self._pruned_sec:  # per-second counts older than 60 s go, once a second
            self._pruned_sec = sec
            self._seconds = {s: c for s, c in self._seconds.items() if s > sec - 60}

    def arrival(self, now: float, at: float | None = None) -> None:
        """One arrival at ``at`` (default ``now``), recorded at time ``now``."""
        self._roll(now)
        at = now if at is None else min(at, now)
        self.arrivals_total += 1
        m = int((at - self.start) // 60)
        back = self._minute - m  # 0: the open minute; k: the k-th closed minute back
        if back <= 0:
            self._minute_count += 1
        elif back <= len(self.minutes):
            self.minutes[-back] += 1
        sec = int(at - self.start)
        if sec > int(now - self.start) - 60:
            self._seconds[sec] = self._seconds.get(sec, 0) + 1

    def _integrate(self, now: float) -> None:
        if now > self._area_t:
            self._area += self.in_flight * (now - self._area_t)
            self._area_t = now

    def started(self, now: float) -> None:
        self._integrate(now)
        self.in_flight += 1

    def finished(self, now: float) -> None:
        self._integrate(now)
        self.in_flight = max(0, self.in_flight - 1)

    def mean_in_flight(self, now: float, reset: bool = False) -> float:
        """Time-averaged in-flight requests since the last reset (the simulator's
        "ongoing requests" over a tick, which Ray Serve's policy uses)."""
        self._integrate(now)
        span = now - self._mean_since
        mean = self._area / span if span > 0 else float(self.in_flight)
        if reset:
            self._area, self._mean_since = 0.0, now
        return mean

    def completed(self, now: float, latency_s: float, processing_s: float | None) -> None:
        self._roll(now)
        self.completed_total += 1
        self._done.append((now, latency_s, math.nan if processing_s is None else processing_s))

    def processed(self, now: float, processing_s: float) -> None:
        """A replica's processing time reported apart from the request's latency."""
        self._roll(now)
        self._proc.append((now, processing_s))

    def drop(self, now: float, reason: str) -> None:
        self._roll(now)
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    # -- reading -------------------------------------------------------------------------
    def arrival_rate(self, now: float, over_s: float = ARRIVAL_RATE_S) -> float:
        """Requests/s over the last ``over_s`` whole seconds."""
        self._roll(now)
        sec = int(now - self.start)
        n = sum(c for s, c in self._seconds.items() if sec - over_s <= s < sec)
        return n / over_s

    def per_second(self, now: float, seconds: int = 60) -> list[int]:
        self._roll(now)
        sec = int(now - self.start)
        return [self._seconds.get(s, 0) for s in range(sec - seconds, sec)]

    def latency_percentile(self, now: float, q: float) -> float | None:
        """``q``-th percentile (0-100) of end-to-end latency in the window, seconds."""
        self._roll(now)
        if not self._done:
            return None
        return float(np.percentile([d[1] for d in self._done], q))

    def processing(self, now: float) -> dict:
        self._roll(now)
        vals = np.array([d[2] for d in self._done] + [p for _, p in self._proc], float)
        vals = vals[np.isfinite(vals)]
        if vals.size == 0:
            return {"mean_ms": None, "p50_ms": None, "p99_ms": None, "n": 0}
        p50, p99 = np.percentile(vals, [50, 99])
        return {
            "mean_ms": float(vals.mean() * 1e3),
            "p50_ms": float(p50 * 1e3),
            "p99_ms": float(p99 * 1e3),
            "n": int(vals.size),
        }

    def snapshot(self, now: float, percentile: float = 99.0, replicas: int = 0, reset_mean: bool = False) -> dict:
        """Everything the autoscaler reads, JSON-able. Queue length is the requests in
        flight beyond one per serving replica (each replica serves one at a time);
        ``reset_mean`` starts a new averaging period for ``mean_in_flight``."""
        self._roll(now)
        lat = self.latency_percentile(now, percentile)
        lats = [d[1] for d in self._done]
        return {
            "now": now,
            "arrival_rate": self.arrival_rate(now),
            "arrivals_per_min": list(self.minutes),
            "current_minute_count": self._minute_count,
            "current_minute_elapsed_s": (now - self.start) - 60.0 * self._minute,
            "latency_ms": None if lat is None else lat * 1e3,
            "latency_p50_ms": float(np.percentile(lats, 50) * 1e3) if lats else None,
            "latency_mean_ms": float(np.mean(lats) * 1e3) if lats else None,
            "processing": self.processing(now),
            "in_flight": self.in_flight,
            "mean_in_flight": self.mean_in_flight(now, reset=reset_mean),
            "queue_length": max(0, self.in_flight - replicas),
            "arrivals_total": self.arrivals_total,
            "completed_total": self.completed_total,
            "dropped": dict(self.dropped),
        }
