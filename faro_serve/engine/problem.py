"""The multi-tenant autoscaling problem as the optimiser sees it (paper sections 3.4, 4.2).

A :class:`Problem` holds, per job, the window-utility table ``W[d, c]`` (see ``window.py``),
its resources, bounds and current replicas, plus the cluster objective. Evaluating the
relaxed objective at any (continuous) replicas and drop rates is a table lookup, so the
solver and every post-processing step share one cheap, exact definition of the objective.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ..resources import CPU, MEMORY
from .batched_latency import BATCH_CHOICES, batch_table
from .latency import ESTIMATORS
from .utility import PENALTY_OBJECTIVES, cluster_objective, phi
from .window import (
    DROP_GRID,
    NO_DROP,
    cold_start_fractions,
    interp_utilities,
    saturation_count,
    step_utility_table,
    window_table,
)


@dataclass
class JobInput:
    """One job (a model, or a group of models) in engine units: seconds and requests/s."""

    name: str
    rates: np.ndarray  # (samples, steps) requests/s
    proc_s: float
    slo_s: float
    quantile: float  # percentile / 100
    priority: float
    cpus: float
    memory_gb: float
    min_replicas: int
    max_replicas: int
    current: int
    can_drop: bool
    # replicas that batch (batched_latency.py): the batch curve's shape f(b) = l(b) / l(1)
    # for b = 0..max_batch, and the largest batch allowed; None and 1: no batching
    batch_shape: np.ndarray | None = None
    max_batch: int = 1
    # requests one replica serves at once: a replica is this many servers of proc_s to the
    # estimator (docs/concurrency.md); 1: the paper's one at a time
    concurrency: int = 1
    # what a replica reserves beyond CPUs and memory: GPUs and Ray custom resources, by
    # Ray's name (faro_serve.resources)
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class Problem:
    jobs: list[JobInput]
    tables: np.ndarray  # (jobs, drops, counts)
    drop_grid: np.ndarray
    cap_cpus: float
    cap_mem: float  # inf when not binding
    kind: str
    gamma: float
    fair_tiebreak: float
    # (jobs, drops, counts): the largest batch behind each W entry (1 for jobs that do not
    # batch); None when no job batches
    batch_tables: np.ndarray | None = None
    # caps on the jobs' ``extra`` resources (GPU, custom); a resource not named is not binding
    extra_caps: dict[str, float] = field(default_factory=dict)
    #: a job's value is its own table row alone (pipeline_problem.PipelineProblem: not so)
    separable = True
    lo: np.ndarray = field(init=False)
    hi: np.ndarray = field(init=False)
    cpus: np.ndarray = field(init=False)
    mem: np.ndarray = field(init=False)
    priority: np.ndarray = field(init=False)
    can_drop: np.ndarray = field(init=False)
    current: np.ndarray = field(init=False)
    # every binding resource: its name, what a replica of each job takes (jobs x resources)
    # and the cap; CPUs first, memory where capped, then GPUs and custom resources
    resource_names: list[str] = field(init=False)
    need: np.ndarray = field(init=False)
    caps: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.lo = np.array([j.min_replicas for j in self.jobs], dtype=float)
        self.hi = np.array([j.max_replicas for j in self.jobs], dtype=float)
        self.cpus = np.array([j.cpus for j in self.jobs], dtype=float)
        self.mem = np.array([j.memory_gb for j in self.jobs], dtype=float)
        self.priority = np.array([j.priority for j in self.jobs], dtype=float)
        self.can_drop = np.array([j.can_drop for j in self.jobs], dtype=bool) & self.penalty
        self.current = np.array([j.current for j in self.jobs], dtype=float)
        self.resource_names, self.need, self.caps = demand_matrix(
            self.jobs, self.cap_cpus, self.cap_mem, self.extra_caps
        )

    @property
    def n(self) -> int:
        return len(self.jobs)

    @property
    def penalty(self) -> bool:
        return self.kind in PENALTY_OBJECTIVES

    def utilities(self, x: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Window utility U of each job (requests that are not dropped)."""
        return interp_utilities(self.tables, np.asarray(x, float), np.asarray(d, float), self.drop_grid)

    def job_values(self, x: np.ndarray, d: np.ndarray) -> np.ndarray:
        """U, or EU = phi(d) U for the penalty objectives: what the objective aggregates."""
        u = self.utilities(x, d)
        return phi(d) * u if self.penalty else u

    def single_values(self, x: np.ndarray, x_new: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Per job, the value (as :meth:`job_values`) when job ``i`` alone takes ``x_new[i]``
        replicas: what the integer post-processing scores single changes with."""
        return self.job_values(x_new, d)

    def value(self, x: np.ndarray, d: np.ndarray) -> float:
        """The relaxed cluster objective (to maximise)."""
        return cluster_objective(self.kind, self.job_values(x, d), self.priority, self.gamma, self.fair_tiebreak)

    def single_change_values(self, v: np.ndarray, v_new: np.ndarray) -> np.ndarray:
        """Objective when job ``i`` alone moves from ``v[i]`` to ``v_new[i]``, for every ``i``.

        ``v`` are the job values (U, or EU for penalty objectives). Vectorised: the max and
        min without job ``i`` come from the top two and bottom two values.
        """
        n = v.size
        pri = self.priority
        total: np.ndarray = pri @ v + pri * (v_new - v)
        if self.kind in ("sum", "penalty_sum"):
            return total
        if n == 1:
            spread = np.zeros(1)
        else:
            order = np.argsort(v, kind="stable")
            idx = np.arange(n)
            max_excl = np.where(idx == order[-1], v[order[-2]], v[order[-1]])
            min_excl = np.where(idx == order[0], v[order[1]], v[order[0]])
            spread = np.maximum(max_excl, v_new) - np.minimum(min_excl, v_new)
        if self.kind == "fair":
            return cast(np.ndarray, -spread + self.fair_tiebreak * (v.sum() + v_new - v) / n)
        return total - self.gamma * spread

    def fits(self, x: np.ndarray, slack: float = 1e-9) -> bool:
        x = np.asarray(x, float)
        return bool(np.all(x @ self.need <= self.caps + slack))

    def subset(
        self,
        idx: Iterable[int],
        cap_cpus: float,
        cap_mem: float | None,
        gamma: float,
        extra_caps: dict[str, float] | None = None,
    ) -> "Problem":
        """The jobs ``idx`` alone within their own capacity (a group of section 3.4).

        The tables are this problem's rows: a job's window utility does not depend on the
        capacity, so a group's solve and the cross-group pass score every job identically.
        """
        idx = list(idx)
        cap_mem_v = np.inf if cap_mem is None else float(cap_mem)
        jobs = [self.jobs[i] for i in idx]
        extra_caps = dict(extra_caps or {})
        ceilings = count_ceiling(jobs, cap_cpus, cap_mem_v, extra_caps)
        jobs = [JobInput(**{**j.__dict__, "max_replicas": c}) for j, c in zip(jobs, ceilings)]
        return Problem(
            jobs=jobs,
            tables=self.tables[idx],
            drop_grid=self.drop_grid,
            cap_cpus=float(cap_cpus),
            cap_mem=cap_mem_v,
            kind=self.kind,
            gamma=gamma,
            fair_tiebreak=self.fair_tiebreak,
            batch_tables=None if self.batch_tables is None else self.batch_tables[idx],
            extra_caps=extra_caps,
        )

    def batch_sizes(self, x: np.ndarray, d: np.ndarray) -> np.ndarray:
        """The largest batch each job should allow at whole replicas ``x`` and drop rates
        ``d``: the one behind its W entry (the nearest drop-grid point)."""
        n = self.n
        if self.batch_tables is None:
            return np.ones(n, dtype=int)
        cols = np.clip(np.asarray(x, dtype=int), 0, self.tables.shape[2] - 1)
        rows = np.abs(self.drop_grid[None, :] - np.asarray(d, float)[:, None]).argmin(axis=1)
        return cast(np.ndarray, self.batch_tables[np.arange(n), rows, cols].astype(int))


def batch_choices(max_batch: int) -> list[int]:
    """The largest batches the planner weighs for a model allowing ``max_batch``: 1, 2, 4,
    ... below it, and it."""
    return sorted({c for c in BATCH_CHOICES if c < max_batch} | {max(1, int(max_batch))})


def demand_matrix(
    jobs: list[JobInput], cap_cpus: float, cap_mem: float, extra_caps: dict[str, float]
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The binding resources: names, per-replica needs (jobs x resources) and caps.

    CPUs always bind; memory where capped; a GPU or custom resource where capped and some
    job needs it (a resource no job uses is no constraint)."""
    names, cols, caps = [CPU], [[j.cpus for j in jobs]], [float(cap_cpus)]
    if np.isfinite(cap_mem):
        names.append(MEMORY)
        cols.append([j.memory_gb for j in jobs])
        caps.append(float(cap_mem))
    for r in sorted(extra_caps):
        col = [float(j.extra.get(r, 0.0)) for j in jobs]
        if np.isfinite(extra_caps[r]) and any(c > 0 for c in col):
            names.append(r)
            cols.append(col)
            caps.append(float(extra_caps[r]))
    return names, np.array(cols, dtype=float).T.reshape(len(jobs), len(names)), np.array(caps)


def count_ceiling(
    jobs: list[JobInput], cap_cpus: float, cap_mem: float, extra_caps: dict[str, float] | None = None
) -> list[int]:
    """Most replicas each job could get: its max, or what is left after everyone's minimum,
    in the scarcest resource it needs."""
    _, need, caps = demand_matrix(jobs, cap_cpus, cap_mem, extra_caps or {})
    lo = np.array([j.min_replicas for j in jobs], dtype=float)
    left = caps - lo @ need
    out = []
    for i, j in enumerate(jobs):
        room = [np.floor(left[r] / need[i, r] + j.min_replicas + 1e-9) for r in range(caps.size) if need[i, r] > 0]
        out.append(int(max(j.min_replicas, min([j.max_replicas, *room]))))
    return out


def build_problem(
    jobs: list[JobInput],
    *,
    cap_cpus: float,
    cap_mem: float | None,
    kind: str,
    gamma: float,
    alpha: float,
    rho_max: float,
    estimator: str,
    window_s: float,
    cold_start_s: float,
    fair_tiebreak: float,
    extra_caps: dict[str, float] | None = None,
) -> Problem:
    """Tabulate every job's window utility and wrap the result as a :class:`Problem`.

    ``extra_caps``: caps on GPUs and custom resources (``JobInput.extra``), by Ray's name."""
    cap_mem_v = np.inf if cap_mem is None else float(cap_mem)
    extra_caps = dict(extra_caps or {})
    ceilings = count_ceiling(jobs, cap_cpus, cap_mem_v, extra_caps)
    jobs = [JobInput(**{**j.__dict__, "max_replicas": c}) for j, c in zip(jobs, ceilings)]
    penalty = kind in PENALTY_OBJECTIVES
    any_drop = penalty and any(j.can_drop for j in jobs)
    grid = DROP_GRID if any_drop else NO_DROP
    est = ESTIMATORS[estimator]
    # Columns past a job's saturation count are all 1 (utility cannot rise further), and
    # the lookups hold the last column beyond a table's end: tabulating only up to it is
    # exact, and far cheaper when the capacity dwarfs what a job needs.
    widths = []
    for j, c in zip(jobs, ceilings):
        rates = np.ascontiguousarray(j.rates, dtype=float)
        sat = saturation_count(float(rates.max()), j.proc_s, j.quantile, j.slo_s, rho_max, est, c, j.concurrency)
        widths.append(max(sat, j.current, j.min_replicas) + 1)
    n_c = max(widths)
    tables = np.zeros((len(jobs), len(grid), n_c))
    batching = any(j.max_batch > 1 and j.batch_shape is not None for j in jobs)
    batch_tables = np.ones((len(jobs), len(grid), n_c), dtype=np.int64) if batching else None
    for i, (j, width) in enumerate(zip(jobs, widths)):
        jgrid = grid if (penalty and j.can_drop) else NO_DROP
        rates = np.ascontiguousarray(j.rates, dtype=float)
        frac = cold_start_fractions(rates.shape[1], window_s, cold_start_s)
        # A batching job: W for every largest batch it may allow, then per entry the best
        # (the planner picks replicas and batch together; batch 1 is always a choice). On a
        # tie (the load needs no larger batch) a larger one is kept where it serves a fifth
        # more and a full batch takes at most half the SLO: a flat (GPU) curve's headroom for
        # a burst, free until the queue forms it; on a CPU's line the smaller stays
        w: np.ndarray | None = None
        wb: np.ndarray | None = None
        shape = j.batch_shape
        thr = None if shape is None else np.arange(len(shape)) / np.maximum(shape, 1e-12)
        for b in batch_choices(j.max_batch if shape is not None else 1):
            if shape is not None and b > 1:
                tab, f_b = batch_table(shape, b, j.quantile), float(shape[b])
                steps = step_utility_table(
                    rates,
                    j.proc_s,
                    j.quantile,
                    j.slo_s,
                    alpha,
                    rho_max,
                    est,
                    width - 1,
                    jgrid,
                    tab,
                    f_b,
                    b,
                    j.concurrency,
                )
            else:
                steps = step_utility_table(
                    rates, j.proc_s, j.quantile, j.slo_s, alpha, rho_max, est, width - 1, jgrid, k=j.concurrency
                )
            wn = window_table(steps, int(j.current), frac)
            if w is None or wb is None:
                w, wb = wn, np.ones(wn.shape, dtype=np.int64)
            else:
                better = wn > w + 1e-9
                if thr is not None and shape is not None and j.proc_s * shape[b] <= 0.5 * j.slo_s:
                    better |= (wn >= w - 1e-9) & (thr[b] >= 1.2 * thr[wb])
                w = np.where(better, wn, w)
                wb = np.where(better, b, wb)
        assert w is not None and wb is not None  # batch 1 is always a choice
        tables[i, : len(jgrid), :width] = w
        tables[i, : len(jgrid), width:] = w[:, -1:]
        if len(jgrid) < len(grid):  # a job that may not drop: same utility at every grid point
            tables[i, len(jgrid) :] = tables[i, 0]
        if batch_tables is not None:
            batch_tables[i, : len(jgrid), :width] = wb
            batch_tables[i, : len(jgrid), width:] = wb[:, -1:]
            if len(jgrid) < len(grid):
                batch_tables[i, len(jgrid) :] = batch_tables[i, 0]
    return Problem(
        jobs=jobs,
        tables=tables,
        drop_grid=grid,
        cap_cpus=float(cap_cpus),
        cap_mem=cap_mem_v,
        kind=kind,
        gamma=gamma,
        fair_tiebreak=fair_tiebreak,
        batch_tables=batch_tables,
        extra_caps=extra_caps,
    )
