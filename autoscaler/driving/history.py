"""The live loop's arrival history across restarts (issue 32): the meters' completed minutes
written to a durable :class:`~forecasting.store.ArrivalStore` once per minute, and a meter
history shorter than the store's completed with the store's earlier minutes.

A meter counts minutes from its own start; the loop places them on the wall clock: the
last completed minute ended ``current_minute_elapsed_s`` before the loop read the report.
Each model's minute grid keeps the phase it was first seen with (re-anchored only when it
moves by more than :data:`PHASE_TOLERANCE_S`, i.e. a new meter), so a few milliseconds of
read jitter never shift a minute into its neighbour's slot. Joining aligns by wall-clock
minute, so the minutes both hold are counted once (the meter's). A gap of at most
``max_gap_minutes`` between the store's minutes and the meter's (a model application that
restarted) is filled by linear interpolation; history before a longer gap is stale and left
out. Ray-free; the loop calls :meth:`HistoryKeeper.observe` once per tick.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from autoscaler.driving.driver import MeterSnapshot
from faro_serve.measures import HISTORY_MINUTES
from forecasting.store import HistorySource, epoch_minute

log = logging.getLogger("faro_serve.autoscaler")
PHASE_TOLERANCE_S = 5.0


def fill_short_gaps(values: np.ndarray, max_gap: int, next_value: float | None = None) -> np.ndarray:
    """The tail of ``values`` (NaN: not recorded) after its last run of more than ``max_gap``
    NaNs (counting a run at the end, before ``next_value``), shorter runs interpolated."""
    v = np.asarray(values, float)
    ext = np.append(v, np.nan if next_value is None else next_value)
    start, run = 0, 0
    for i, x in enumerate(ext):
        run = run + 1 if np.isnan(x) else 0
        if run > max_gap:
            start = i + 1
    tail = ext[start:]
    ok = ~np.isnan(tail)
    if not ok.any():
        return np.zeros(0)
    first = int(np.argmax(ok))  # a leading NaN run (cut by the window): left out
    tail, ok = tail[first:], ok[first:]
    idx = np.arange(tail.size)
    filled: np.ndarray = np.interp(idx, idx[ok], tail[ok])
    return filled[:-1] if next_value is not None or np.isnan(ext[-1]) else filled[: v.size - start - first]


class HistoryKeeper:
    """Writes every model's newly completed meter minutes to ``store`` (once per minute) and
    joins the store's earlier minutes to a shorter meter history; ``store``: any
    ``forecasting.store.HistorySource``."""

    def __init__(self, store: HistorySource, keep_minutes: int = HISTORY_MINUTES, max_gap_minutes: int = 5):
        self.store = store
        self.keep_minutes = keep_minutes
        self.max_gap_minutes = max_gap_minutes
        self.grid: dict[str, tuple[float, int]] = {}  # model -> (phase s, epoch-minute offset)
        self.written: dict[str, int] = {}  # model -> newest epoch minute written
        self.joined: dict[str, int] = {}  # model -> minutes taken from the store at the last tick
        self._cache: dict[str, tuple[int, np.ndarray]] = {}  # model -> (meter's first minute, prefix)

    @classmethod
    def carry_on(
        cls, store: HistorySource | None, previous: "HistoryKeeper | None", keep_minutes: int = HISTORY_MINUTES
    ) -> "HistoryKeeper | None":
        """The keeper of a new loop: the previous loop's over the same store (its grids and
        what it wrote carry on), a new one over another store, None without one;
        ``keep_minutes``: the history each model's forecast is given (a day and more with
        the forecaster's daily context)."""
        if store is None:
            return None
        if previous is None or previous.store is not store:
            return cls(store, keep_minutes)
        if previous.keep_minutes != keep_minutes:
            previous.keep_minutes = keep_minutes
            previous._cache.clear()
        return previous

    def observe_safely(
        self, now: float, raw: Mapping[str, Mapping[str, Any]], meters: Mapping[str, MeterSnapshot]
    ) -> dict[str, MeterSnapshot]:
        """:meth:`observe`; a failure is logged and the meters' history used as it is: the
        store must never stop the autoscaler."""
        try:
            return self.observe(now, raw, meters)
        except Exception as err:
            log.warning("arrival history store %s: %s; planning with the meters' history only", self.store.path, err)
            return dict(meters)

    def _last_minute(self, name: str, t_end: float) -> int:
        """The wall-clock minute of the meter's last completed minute, which ended at ``t_end``."""
        phase = t_end % 60.0
        grid = self.grid.get(name)
        if grid is None or abs((phase - grid[0] + 30.0) % 60.0 - 30.0) > PHASE_TOLERANCE_S:
            grid = self.grid[name] = (phase, epoch_minute(phase - 60.0))
            self._cache.pop(name, None)
        return int(round((t_end - grid[0]) / 60.0)) + grid[1]

    def observe(
        self, now: float, raw: Mapping[str, Mapping[str, Any]], meters: Mapping[str, MeterSnapshot]
    ) -> dict[str, MeterSnapshot]:
        """``meters`` (the decoded snapshots of the reports ``raw``, read at ``now``) with each
        model's history joined to the store's; its new completed minutes written. The two
        fields read here were checked when ``meters`` was decoded (``MeterSnapshot.read_meters``)."""
        out = dict(meters)
        for name, snap in meters.items():
            report = raw[name]
            done = np.asarray(report["arrivals_per_min"], float)
            last = self._last_minute(name, now - float(report["current_minute_elapsed_s"]))
            if done.size:
                self._write(name, done, last)
            out[name] = self._join(name, snap, done.size, last - done.size + 1)
        return out

    def _write(self, name: str, done: np.ndarray, last: int) -> None:
        since = self.written.get(name)
        if since is not None and last <= since:
            return  # no new completed minute since the last write
        first = last - done.size + 1
        rows = [(60.0 * m, c) for m, c in zip(range(first, last + 1), done) if since is None or m > since]
        if self.store.append_many(name, rows):
            self.written[name] = last

    def _join(self, name: str, snap: MeterSnapshot, n_done: int, first: int) -> MeterSnapshot:
        """The snapshot with the store's minutes before the meter's first (``first``)."""
        need = self.keep_minutes - snap.arrivals_per_min.size
        if need <= 0:
            self.joined[name] = 0
            return snap
        cached = self._cache.get(name)
        if cached is None or cached[0] != first:
            cached = self._cache[name] = (first, self._prefix(name, snap, first, cached))
        prefix = cached[1][-need:] if need < cached[1].size else cached[1]
        self.joined[name] = int(prefix.size)
        if not prefix.size:
            return snap
        return dataclasses.replace(snap, arrivals_per_min=np.concatenate([prefix, snap.arrivals_per_min]))

    def _prefix(self, name: str, snap: MeterSnapshot, first: int, cached: tuple[int, np.ndarray] | None) -> np.ndarray:
        """The store's minutes before ``first``, gaps filled: the cached prefix extended by
        the minutes the meter's window has moved past since (one a minute: a day of context
        is not read again every minute), or read whole when that is not possible."""
        if cached is not None and 0 < first - cached[0] <= self.keep_minutes and cached[1].size:
            delta = self.store.load(name, first - cached[0], end_minute=first)
            if not np.isnan(delta).any():
                return np.concatenate([cached[1], delta])[-self.keep_minutes :]
        stored = self.store.load(name, self.keep_minutes, end_minute=first)
        nxt = float(snap.arrivals_per_min[0]) if snap.arrivals_per_min.size else None
        return fill_short_gaps(stored, self.max_gap_minutes, nxt)

    def status(self) -> dict[str, Any]:
        """For the loop's status: where the store is, what it refused, what was joined."""
        return {"file": str(self.store.path), "refused": list(self.store.refused), "joined_minutes": dict(self.joined)}
