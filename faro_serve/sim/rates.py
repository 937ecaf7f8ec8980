"""Arrival rates as the live meters report them (faro_serve.measures.ARRIVAL_RATE_S).

A live snapshot's ``arrival_rate`` is requests/s over the last ``ARRIVAL_RATE_S`` (10) whole
seconds (serving/stats.py), whatever the autoscaler's tick. The simulator used the last
tick's count over the tick: the same at the default 10 s tick, but with 5 s ticks (the
live benches' ``reactive_interval_s``) it saw a step in load a tick before the live meters
did, so its surge came earlier than live (bench.pipeline_live, docs/pipelines.md). With
ticks of the window or longer the rate is still the last tick's, so every default run is
unchanged.
"""

from __future__ import annotations

from collections import deque

from ..measures import ARRIVAL_RATE_S


class TickRates:
    """Per key (a model, a pipeline), the rate over the last ``window_s`` from tick counts;
    before the first ``window_s`` have passed, the seconds before the start count as idle
    (as the live meters, which run before the load starts)."""

    def __init__(self, window_s: float = ARRIVAL_RATE_S):
        self.window_s = float(window_s)
        self._ticks: dict[str, deque] = {}

    def rate(self, key: str, dt: float, n: float) -> float:
        """Add a tick of ``dt`` seconds with ``n`` arrivals; the rate it makes."""
        if dt <= 0:
            return 0.0
        if dt >= self.window_s - 1e-9:
            self._ticks[key] = deque([(dt, n)])
            return n / dt
        ticks = self._ticks.setdefault(key, deque())
        ticks.append((dt, n))
        span = sum(d for d, _ in ticks)
        while span - ticks[0][0] >= self.window_s - 1e-9:
            span -= ticks.popleft()[0]
        return sum(c for _, c in ticks) / max(span, self.window_s)
