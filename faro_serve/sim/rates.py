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
from collections.abc import Sequence

import numpy as np

from ..measures import ARRIVAL_RATE_S


class TickRates:
    """Per key (a model, a pipeline), the rate over the last ``window_s`` from tick counts;
    before the first ``window_s`` have passed, the seconds before the start count as idle
    (as the live meters, which run before the load starts)."""

    def __init__(self, window_s: float = ARRIVAL_RATE_S):
        self.window_s = float(window_s)
        # per key, the ticks' lengths and their counts, oldest first: two deques that the
        # builtin sum adds in the same order as a sum over (length, count) pairs would, but
        # at C speed (this runs per model per tick)
        self._ticks: dict[str, tuple[deque, deque]] = {}
        self._groups: dict[str, tuple[deque, deque]] = {}  # rates(): lengths, count vectors

    def rate(self, key: str, dt: float, n: float) -> float:
        """Add a tick of ``dt`` seconds with ``n`` arrivals; the rate it makes."""
        if dt <= 0:
            return 0.0
        if dt >= self.window_s - 1e-9:
            self._ticks[key] = (deque([dt]), deque([n]))
            return n / dt
        counts, span = self._push(self._ticks, key, dt, n)
        return sum(counts) / max(span, self.window_s)

    def rates(self, group: str, dt: float, counts: Sequence[int]) -> list[float]:
        """``rate(key, dt, n)`` of every key of a ``group`` that always ticks together (a
        run's models), in one pass: the group's tick lengths once, and per tick the vector
        of its counts. The very same floats, as counts are whole numbers, whose sums are
        exact in any order (and a whole number over a float divides as in Python)."""
        c = np.asarray(counts)
        if c.size == 0:
            c = c.astype(np.int64)
        if c.dtype.kind not in "iu":
            raise TypeError(f"counts must be whole numbers (got {c.dtype})")
        if dt <= 0:
            return [0.0] * c.size
        if dt >= self.window_s - 1e-9:
            self._groups[group] = (deque([dt]), deque([c]))
            return (c / dt).tolist()
        vectors, span = self._push(self._groups, group, dt, c)
        return (sum(vectors) / max(span, self.window_s)).tolist()

    def _push(self, store: dict[str, tuple[deque, deque]], key: str, dt: float, count) -> tuple[deque, float]:
        """Add a tick of ``dt`` seconds with ``count`` (a number or a vector) to ``key``'s
        window, drop the ticks that fell out of it; the counts kept and the seconds they span."""
        ticks = store.get(key)
        if ticks is None:
            ticks = store[key] = (deque(), deque())
        lengths, counts = ticks
        lengths.append(dt)
        counts.append(count)
        span = sum(lengths)
        edge = self.window_s - 1e-9
        while span - lengths[0] >= edge:
            span -= lengths.popleft()
            counts.popleft()
        return counts, span
