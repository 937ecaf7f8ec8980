"""InferLine's Estimator: a discrete-event simulation of a pipeline on a sample trace
(SoCC '20, section 4.2).

Given the stages (topological order, parents, visit fraction = the scale factor ``s_m``),
each stage's configuration (replicas, largest batch, the time one batch of ``k`` takes) and
the arrival times of a sample of queries, every query is pushed through the DAG and its
end-to-end latency returned, so the planner can check a tail percentile against the SLO
without deploying anything.

The queueing rule per stage is the simulator's (``faro_serve.sim.kernels.advance``), so
the two agree query for query (tests/test_inferline_pipeline.py): one FIFO queue in front
of the stage's replicas; a request that finds a replica free and the queue empty starts at
once, alone; a replica that frees takes up to ``b`` queued requests as one batch (dynamic
batching); ties go to the lowest-numbered replica. Routing, like InferLine's
"centralized batched queueing system", adds no time (``hold`` can add the replica's
idle gap between two batches).

Conditional flow: a query visits a stage with probability ``fraction / parents' fraction``
(the largest parent fraction), drawn once per (query, stage) from a seeded generator, and
only if it visited at least one parent (entry stages: always considered). A stage starts a
query when every parent it visited has finished (fan-out: children start as soon as their
parent is done). The query is done when every stage it visited is.

Pure numpy + numba, no Ray: the engine layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass(frozen=True)
class StageSpec:
    """One stage of the DAG: its name, the indices of its parents (earlier in the list)
    and its visit fraction (the share of the pipeline's queries that reach it)."""

    name: str
    parents: tuple[int, ...] = ()
    fraction: float = 1.0


@dataclass(frozen=True)
class StageStats:
    visits: int  # queries that visited the stage
    mean_wait_s: float  # mean time from ready to start
    mean_batch: float  # mean size of the batches served
    utilisation: float  # busy time / (replicas x span of the trace)
    p99_s: float  # 99th percentile of (finish - ready) at this stage


@dataclass(frozen=True)
class PipelineRun:
    """Per query: ``latency_s`` (end to end; every query visits an entry stage) and
    ``visits[s, q]``; per stage, :class:`StageStats`."""

    latency_s: np.ndarray
    visits: np.ndarray
    finish_s: np.ndarray  # (stages, queries), NaN where not visited
    stages: dict[str, StageStats]

    def percentile(self, q: float) -> float:
        """The ``q`` (0-100) percentile of the end-to-end latency (inf with no queries)."""
        return float(np.percentile(self.latency_s, q)) if self.latency_s.size else float("inf")


@njit(cache=True)
def _avail(j: int, t: float, on: np.ndarray, off: np.ndarray, ptr: np.ndarray) -> float:
    """The earliest time >= ``t`` at which replica ``j`` is up (``t`` never decreases per
    replica, so the interval pointer only moves forward); inf when it never is again."""
    while ptr[j] < on.shape[1] and off[j, ptr[j]] <= t:
        ptr[j] += 1
    if ptr[j] == on.shape[1]:
        return np.inf
    up: float = max(t, on[j, ptr[j]])
    return up


@njit(cache=True)
def stage_queue_sched(
    ready: np.ndarray, batch: int, batch_time: np.ndarray, hold: float, on: np.ndarray, off: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`stage_queue` with replicas that come and go: replica ``j`` starts batches only
    inside its intervals ``[on[j, i], off[j, i])`` (inf-padded); a batch started runs to
    its end (a replica removed drains, as Ray's graceful shutdown). A queued batch takes
    only the requests arrived by its start."""
    n = ready.shape[0]
    R = on.shape[0]
    start = np.empty(n)
    finish = np.empty(n)
    size = np.empty(n, dtype=np.int64)
    free_at = np.full(R, -np.inf)
    ptr = np.zeros(R, dtype=np.int64)
    qh = 0  # the queue is the sorted requests qh .. i-1
    i = 0
    while qh < n:
        ta = ready[i] if i < n else np.inf
        while qh < i:  # replicas that free before the next arrival take the queue's head
            k = -1
            f = np.inf
            for j in range(R):
                a = _avail(j, max(free_at[j], ready[qh]), on, off, ptr)
                if a < f:
                    f = a
                    k = j
            if k < 0 or f > ta:
                break
            m = 0
            while m < batch and qh + m < i and ready[qh + m] <= f:
                m += 1
            end = f + batch_time[m - 1]
            for j in range(qh, qh + m):
                start[j] = f
                finish[j] = end
                size[j] = m
            free_at[k] = end + hold
            qh += m
        if i >= n:
            if qh < n:  # no replica will ever come up: the rest never finish
                for j in range(qh, n):
                    start[j] = np.inf
                    finish[j] = np.inf
                    size[j] = 1
            break
        if qh == i:  # queue empty: a replica up and free at ta takes it alone
            k = -1
            for j in range(R):
                if _avail(j, max(free_at[j], ta), on, off, ptr) <= ta:
                    if k < 0 or free_at[j] < free_at[k]:
                        k = j
            if k >= 0:
                start[i] = ta
                finish[i] = ta + batch_time[0]
                size[i] = 1
                free_at[k] = finish[i] + hold
                qh += 1
        i += 1
    return start, finish, size


@njit(cache=True)
def stage_queue(
    ready: np.ndarray, replicas: int, batch: int, batch_time: np.ndarray, hold: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One stage: FIFO queue, ``replicas`` servers, batches of up to ``batch``.

    ``ready`` sorted ascending (the times requests reach the stage); ``batch_time[k - 1]``
    the seconds a batch of ``k`` takes. Returns ``(start, finish, batch_of)`` per request
    in the same order. The same rule as the simulator's kernel (module docstring)."""
    on = np.full((replicas, 1), -np.inf)
    off = np.full((replicas, 1), np.inf)
    return stage_queue_sched(ready, batch, batch_time, hold, on, off)


def intervals(times: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A replica-count schedule (``counts[i]`` replicas from ``times[i]`` on; before the
    first time, ``counts[0]``) as per-replica up intervals ``(on, off)``, inf-padded:
    replica ``j`` is up while the count exceeds ``j``."""
    times = np.asarray(times, float)
    counts = np.asarray(counts, int)
    R = max(int(counts.max()), 1)
    ivs: list[list[tuple[float, float]]] = [[] for _ in range(R)]
    for j in range(R):
        up = None
        for i, (t, c) in enumerate(zip(times, counts)):
            t0 = -np.inf if i == 0 else t
            if c > j and up is None:
                up = t0
            elif c <= j and up is not None:
                ivs[j].append((up, t0))
                up = None
        if up is not None:
            ivs[j].append((up, np.inf))
    M = max(1, max(len(v) for v in ivs))
    on, off = np.full((R, M), np.inf), np.full((R, M), np.inf)
    for j, v in enumerate(ivs):
        for i, (a, b) in enumerate(v):
            on[j, i], off[j, i] = a, b
    return on, off


def _mean_count(sched: tuple[np.ndarray, np.ndarray], arr: np.ndarray) -> float:
    """Time-weighted mean replica count of a schedule over the trace's span."""
    times, counts = (np.asarray(x, float) for x in sched)
    if arr.size < 2:
        return float(counts[0])
    lo, hi = float(arr.min()), float(arr.max())
    edges = np.clip(np.append(times, hi), lo, hi)
    edges[0] = lo
    return float(np.sum(counts * np.diff(edges)) / max(hi - lo, 1e-9))


def visit_matrix(stages: Sequence[StageSpec], n: int, seed: int = 0) -> np.ndarray:
    """Which query visits which stage (module docstring), deterministic by ``seed``."""
    u = np.random.default_rng(seed).random((len(stages), n))
    vis = np.zeros((len(stages), n), dtype=bool)
    for s, st in enumerate(stages):
        if st.parents:
            base = np.zeros(n, dtype=bool)
            for p in st.parents:
                base |= vis[p]
            parent = max(stages[p].fraction for p in st.parents)
        else:
            base, parent = np.ones(n, dtype=bool), 1.0
        vis[s] = base & (u[s] < st.fraction / parent)
    return vis


def simulate(
    arrivals: np.ndarray,
    stages: Sequence[StageSpec],
    replicas: Sequence[int],
    batch: Sequence[int],
    batch_time: Sequence[np.ndarray],
    *,
    seed: int = 0,
    hold: float = 0.0,
    visits: np.ndarray | None = None,
    schedules: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
) -> PipelineRun:
    """Every query of ``arrivals`` (seconds, any order) through the pipeline.

    Per stage ``s`` (topological order, parents before children): ``replicas[s]``,
    ``batch[s]`` (largest batch, 1 = none) and ``batch_time[s][k - 1]`` (seconds for a batch
    of ``k``, at least ``batch[s]`` entries). ``visits`` overrides the drawn visit matrix
    (the planner draws it once and reuses it for every configuration it compares).
    ``schedules[s]`` = ``(times, counts)``: stage ``s``'s replicas over time (a tuner's
    decisions, :func:`intervals`), in place of ``replicas[s]``."""
    arr = np.asarray(arrivals, float)
    n, S = arr.size, len(stages)
    for s, st in enumerate(stages):
        if any(p >= s for p in st.parents):
            raise ValueError(f"stage {st.name!r}: parents must come earlier (topological order)")
        if replicas[s] < 1 or batch[s] < 1 or len(batch_time[s]) < batch[s]:
            raise ValueError(
                f"stage {st.name!r}: replicas and batch >= 1, and a time for every batch size up to {batch[s]}"
            )
    vis = visit_matrix(stages, n, seed) if visits is None else np.asarray(visits, bool)
    finish = np.full((S, n), np.nan)
    stats: dict[str, StageStats] = {}
    span = float(arr.max() - arr.min()) if n else 0.0
    for s, st in enumerate(stages):
        idx = np.flatnonzero(vis[s])
        ready = arr[idx].copy()
        for p in st.parents:  # every visited parent must be done
            fp = finish[p, idx]
            ready = np.where(np.isnan(fp), ready, np.maximum(ready, fp))
        order = np.argsort(ready, kind="stable")
        r_sorted = ready[order]
        bt = np.asarray(batch_time[s], float)[: batch[s]]
        sched = schedules[s] if schedules is not None else None
        if sched is None:
            st_s, fin_s, size = stage_queue(r_sorted, int(replicas[s]), int(batch[s]), bt, hold)
        else:
            on, off = intervals(*sched)
            st_s, fin_s, size = stage_queue_sched(r_sorted, int(batch[s]), bt, hold, on, off)
        finish[s, idx[order]] = fin_s
        m = idx.size
        reps = float(replicas[s]) if sched is None else _mean_count(sched, arr)
        if m:
            busy = float(np.sum(bt[size - 1] / size))  # each batch's time once
            stats[st.name] = StageStats(
                visits=int(m),
                mean_wait_s=float(np.mean(st_s - r_sorted)),
                mean_batch=float(m / np.sum(1.0 / size)),
                utilisation=busy / (max(reps, 1e-9) * max(span, float(bt[0]))),
                p99_s=float(np.percentile(fin_s - r_sorted, 99)),
            )
        else:
            stats[st.name] = StageStats(0, 0.0, 0.0, 0.0, 0.0)
    done = np.nanmax(np.where(vis, finish, -np.inf), axis=0) if n else np.empty(0)
    return PipelineRun(latency_s=done - arr, visits=vis, finish_s=finish, stages=stats)
