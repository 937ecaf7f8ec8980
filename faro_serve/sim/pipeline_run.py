"""One pipeline's queries in flight through its stages (:class:`PipelineRun`) and a stage's
router and replicas whose requests are those queries (:class:`StageState`).

The per-pipeline kernel of ``pipeline_sim`` (whose docstring states the model: which stages
a query visits, when a child gets it, when it is done or dropped, and why advancing the
stages parents first is exact); :class:`~faro_serve.sim.pipeline_sim.PipelineSet` drives
one :class:`PipelineRun` per pipeline for the runner.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from faro_serve.pipelines import PipelineSLO

from ..distributions import TimeDist
from .kernels import DONE
from .model_state import ModelState


class StageState(ModelState):
    """A stage's router and replicas (a :class:`ModelState`) whose requests are the queries
    of its pipeline: beside each request, the query it belongs to."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.qid = np.empty(0, dtype=np.int64)
        self.scanned = 0  # buffer position: requests before it were reported to the pipeline
        self.frontier_minute = 0  # the pipeline's: every query of earlier minutes is settled

    def add(self, arrival, proc, overhead, u, qid) -> None:
        """Queries reaching the stage (sorted by arrival, none before what it holds)."""
        if arrival.size == 0:
            return
        self.extend(arrival, proc, overhead, u)
        self.qid = np.concatenate([self.qid, qid])

    def newly_settled(self):
        """(query ids, completion instants, served?) of the requests settled since the last
        call: every request before the queue's head (served FIFO: started, so its
        completion is known, or dropped)."""
        hi = self.head() - self.base
        lo = self.scanned
        self.scanned = max(hi, lo)
        sl = slice(lo, hi)
        ok = self.status[sl] == DONE
        return self.qid[sl], self.arr[sl] + self.lat[sl], ok

    def settled_until_minute(self) -> int:
        return self.frontier_minute

    def _trim(self, keep_from_global: int) -> None:
        cut = keep_from_global - self.base
        if cut > 0:
            self.qid = self.qid[cut:]
            self.scanned -= cut
        super()._trim(keep_from_global)


class PipelineRun:
    """One pipeline's queries in flight and its stages' states (driven by the runner)."""

    def __init__(
        self,
        pipeline: PipelineSLO,
        index: int,
        stage_states: Mapping[str, StageState],
        processing: Mapping[str, TimeDist],
        overhead: TimeDist,
        seed: int,
        draw: int,
        n_minutes: int,
    ):
        self.p = pipeline
        self.name = pipeline.name
        self.order = pipeline.order()
        self.col = {n: j for j, n in enumerate(self.order)}
        self.states = [stage_states[n] for n in self.order]
        self.parents = [[self.col[q] for q in pipeline.stage(n).after] for n in self.order]
        self.lead, self.cond = [], []
        for n, par in zip(self.order, self.parents):
            st = pipeline.stage(n)
            if not par:
                self.lead.append(-1)
                self.cond.append(st.fraction)
            else:  # the first parent of largest fraction (the validator's bound)
                fr = [pipeline.stage(self.order[q]).fraction for q in par]
                k = par[int(np.argmax(fr))]
                self.lead.append(k)
                self.cond.append(min(st.fraction / max(fr), 1.0))
        self.processing = [processing[n] for n in self.order]
        self.overhead = overhead
        self.rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(35, index, draw)))
        S = len(self.order)
        self.S = S
        # the queries in flight (global index = qbase + row)
        self.qbase = 0
        self.qa = np.empty(0)  # arrival at the entry
        self.want = np.empty((0, S), dtype=bool)  # would visit the stage (no drop upstream)
        self.draws = np.empty((3, 0, S))  # processing, overhead, drop draw per stage
        self.done = np.empty((0, S))  # completion at the stage (NaN: not known yet)
        self.fed = np.empty((0, S), dtype=bool)
        self.sdone = np.empty((0, S), dtype=bool)  # settled at the stage
        self.dropped = np.empty(0, dtype=bool)  # dropped at some stage
        self.recorded = np.empty(0, dtype=bool)  # handed to the look-back list
        self.flushed = 0  # global index: queries before it went to the metrics
        self.frontier = 0  # global index of the first query not settled
        self.minutes_loaded = 0
        # settled queries for the look-back: completion instant, latency (s)
        self.recent_c = np.empty(0)
        self.recent_l = np.empty(0)
        # arrivals per minute at each stage (what its router counts)
        self.stage_counts = np.zeros((S, n_minutes))
        self.tick_queries = 0  # queries arrived since the last tick
        self.arrived = 0  # global index of the first query not arrived yet

    # -- arrivals ----------------------------------------------------------------------
    def load(self, arrival: np.ndarray) -> None:
        """The queries of the next minute (sorted), with their per-stage draws; the entry
        stages get theirs."""
        n = arrival.size
        want = np.zeros((n, self.S), dtype=bool)
        draws = np.empty((3, n, self.S))
        for j in range(self.S):
            v = self.rng.uniform(0.0, 1.0, n)
            base = np.ones(n, dtype=bool) if self.lead[j] < 0 else want[:, self.lead[j]]
            want[:, j] = base & (v < self.cond[j])
            draws[0, :, j] = self.processing[j].sample(self.rng, n)
            draws[1, :, j] = self.overhead.sample(self.rng, n)
            draws[2, :, j] = self.rng.uniform(0.0, 1.0, n)
        row0 = self.qa.size
        self.qa = np.concatenate([self.qa, arrival])
        self.want = np.concatenate([self.want, want])
        self.draws = np.concatenate([self.draws, draws], axis=1)
        self.done = np.concatenate([self.done, np.full((n, self.S), np.nan)])
        self.fed = np.concatenate([self.fed, np.zeros((n, self.S), dtype=bool)])
        self.sdone = np.concatenate([self.sdone, np.zeros((n, self.S), dtype=bool)])
        self.dropped = np.concatenate([self.dropped, np.zeros(n, dtype=bool)])
        self.recorded = np.concatenate([self.recorded, np.zeros(n, dtype=bool)])
        m = self.minutes_loaded
        for j in range(self.S):
            if self.lead[j] < 0:
                rows = row0 + np.flatnonzero(want[:, j])
                self._feed(j, rows, self.qa[rows])
                if m < self.stage_counts.shape[1]:
                    self.stage_counts[j, m] += rows.size
        self.minutes_loaded += 1

    def _feed(self, j: int, rows: np.ndarray, at: np.ndarray) -> None:
        self.states[j].add(
            at, self.draws[0, rows, j], self.draws[1, rows, j], self.draws[2, rows, j], rows + self.qbase
        )
        self.fed[rows, j] = True

    # -- time --------------------------------------------------------------------------
    def run(self, t0: float, t1: float) -> None:
        """Advance every stage over ``[t0, t1)``, parents first (``pipeline_sim``'s docstring)."""
        upto = self.qbase + int(np.searchsorted(self.qa, t1, side="left"))
        self.tick_queries += max(upto - self.arrived, 0)
        self.arrived = max(upto, self.arrived)
        for j, st in enumerate(self.states):
            if self.parents[j]:
                self._feed_children(j, t1)
            st.run(t0, t1)
            qid, comp, ok = st.newly_settled()
            if qid.size:
                rows = qid - self.qbase
                self.done[rows[ok], j] = comp[ok]
                self.sdone[rows, j] = True
                self.dropped[rows[~ok]] = True

    def _feed_children(self, j: int, t1: float) -> None:
        lo = self.frontier - self.qbase
        want = self.want[lo:, j] & ~self.fed[lo:, j] & ~self.dropped[lo:]
        if not want.any():
            return
        par = self.parents[j]
        pw = self.want[lo:][:, par]
        pd = self.done[lo:][:, par]
        known = np.all(~pw | ~np.isnan(pd), axis=1)
        with np.errstate(invalid="ignore"):
            at = np.max(np.where(pw, pd, -np.inf), axis=1)
        ready = want & known & (at < t1)
        if not ready.any():
            return
        idx = np.flatnonzero(ready)
        idx = idx[np.argsort(at[idx], kind="stable")]
        self._feed(j, idx + lo, at[idx])
        minute = np.floor(at[idx] / 60.0).astype(np.int64)
        keep = minute < self.stage_counts.shape[1]
        self.stage_counts[j] += np.bincount(minute[keep], minlength=self.stage_counts.shape[1])

    # -- settlement --------------------------------------------------------------------
    def _settled(self, lo: int) -> np.ndarray:
        """Rows from ``lo`` whose queries are settled: every stage they visit has settled
        them (served: completion known; or dropped), except the stages a dropped query
        never reached."""
        drop = self.dropped[lo:]
        open_ = self.want[lo:] & ~self.sdone[lo:] & (self.fed[lo:] | ~drop[:, None])
        return np.asarray(~open_.any(axis=1))

    def completion(self, rows: np.ndarray) -> np.ndarray:
        """When each query was done (its latest stage), for settled rows."""
        d = np.where(self.want[rows], self.done[rows], -np.inf)
        return np.maximum(np.max(d, axis=1, initial=-np.inf), self.qa[rows])

    def settle(self) -> None:
        """Record newly settled queries (for the look-back) and move the frontier."""
        lo = self.frontier - self.qbase
        if lo >= self.qa.size:
            return
        ok = self._settled(lo)
        new = ok & ~self.recorded[lo:]
        rows = np.flatnonzero(new) + lo
        if rows.size:
            self.recorded[rows] = True
            served = rows[~self.dropped[rows]]
            c = self.completion(served)
            self.recent_c = np.concatenate([self.recent_c, c])
            self.recent_l = np.concatenate([self.recent_l, c - self.qa[served]])
        first_open = np.flatnonzero(~ok)
        adv = first_open[0] if first_open.size else ok.size
        self.frontier += int(adv)
        f = self.frontier - self.qbase
        fm = int(self.qa[f] // 60.0) if f < self.qa.size else self.minutes_loaded
        for st in self.states:
            st.frontier_minute = fm

    def settled_until_minute(self) -> int:
        return self.states[0].frontier_minute

    # -- observations ------------------------------------------------------------------
    def observe(self, now: float, look_back_s: float, percentile: float) -> float:
        """SLO-percentile end-to-end latency (s) of the queries done in the look-back; NaN
        when none were (dropped queries excluded, as for a model)."""
        self.settle()
        keep = self.recent_c > now - look_back_s - 1e-9
        self.recent_c, self.recent_l = self.recent_c[keep], self.recent_l[keep]
        sel = self.recent_c <= now
        if not sel.any():
            return math.nan
        return float(np.percentile(self.recent_l[sel], percentile))

    def end_tick(self) -> int:
        n, self.tick_queries = self.tick_queries, 0
        return n

    # -- metrics -----------------------------------------------------------------------
    def take_settled(self, upto_minute: int):
        """Queries not yet reported that arrived before ``upto_minute`` (all settled: the
        frontier is past them): (arrival, end-to-end latency, dropped); then trims."""
        lo = self.flushed - self.qbase
        hi = max(int(np.searchsorted(self.qa, upto_minute * 60.0, side="left")), lo)
        hi = min(hi, self.frontier - self.qbase)
        rows = np.arange(lo, hi)
        arr = self.qa[rows]
        drop = self.dropped[rows]
        lat = np.where(drop, np.inf, self.completion(rows) - arr)
        self.flushed = self.qbase + hi
        self._trim(hi)
        return arr, lat, drop

    def _trim(self, cut: int) -> None:
        if cut <= 0:
            return
        self.qa = self.qa[cut:]
        self.want, self.done, self.fed = self.want[cut:], self.done[cut:], self.fed[cut:]
        self.sdone = self.sdone[cut:]
        self.draws = self.draws[:, cut:]
        self.dropped, self.recorded = self.dropped[cut:], self.recorded[cut:]
        self.qbase += cut
