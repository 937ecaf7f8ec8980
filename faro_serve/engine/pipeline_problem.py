"""Pipelines in the cluster objective (issue 35; docs/pipelines.md).

A pipeline is ONE job of the cluster objective: its utility is the paper's relaxed utility
(eq. 1) of its end-to-end estimate (``pipeline_latency.compose``: max over paths of the
sum of the stages' percentile latencies) against its end-to-end SLO, averaged over the
forecast samples and the window's steps with the cold start, exactly as a model's window
utility is (window.py), and weighted by the pipeline's priority. Its stages are decision
variables like any model's replicas, sharing the capacity with the single models, so the
solver chooses the SLO split among the stages; no stage has an SLO of its own here.

:class:`PipelineProblem` is a :class:`~faro_serve.engine.problem.Problem` whose variables
are every model's replicas (single models and stages) and whose objective counts each
single model and each pipeline once. A stage's value (``job_values``) is its pipeline's;
``single_values`` scores a change of one stage with the others held, which is what the
integer post-processing (integer.py) asks for. Drops (penalty objectives) are the entry
stage's: a query dropped there never reaches the other stages, so every stage's rate is
multiplied by ``1 - d`` and the pipeline's effective utility is ``phi(d) U``.

Pure numpy/Numba, no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from numba import njit

from .latency import latency_row, rho_max_factors
from .pipeline_balance import best_split, level_start
from .pipeline_latency import compose, shares
from .problem import JobInput, Problem
from .utility import cluster_objective, phi


@njit(cache=True)
def stage_latency_table(rates: np.ndarray, keep: np.ndarray, p: float, q: float, rho_max: float,
                        estimator: int, cmax: int, k: int) -> np.ndarray:
    """``L[d, s, t, c]``: a stage's percentile latency (s) at ``c`` replicas of ``k`` servers
    for forecast sample ``s``, step ``t``, when the entry keeps ``keep[d]`` of the queries."""
    n_s, n_t = rates.shape
    out = np.empty((keep.shape[0], n_s, n_t, cmax + 1))
    factors = rho_max_factors(cmax * k, q, rho_max)
    row = np.empty(cmax * k + 1)
    for di in range(keep.shape[0]):
        for s in range(n_s):
            for t in range(n_t):
                latency_row(max(rates[s, t] * keep[di], 0.0), p, q, rho_max, estimator, factors,
                            row)
                for c in range(cmax + 1):
                    out[di, s, t, c] = row[c * k]
    return out


@njit(cache=True)
def step_utilities(inv: np.ndarray, xs: np.ndarray, d: float, drop_grid: np.ndarray,
                   paths: np.ndarray, slo: float, alpha: float) -> np.ndarray:
    """Per window step, the mean over the forecast samples of the relaxed utility of the
    end-to-end estimate at continuous stage replicas ``xs`` and entry drop ``d``.

    ``inv`` is (stages, drops, samples, steps, counts) of 1 / latency: a stage's latency
    between whole counts is interpolated harmonically (1/latency linear, so an unstable
    count, inf, is 0), then linearly between drop-grid points."""
    k, n_d, n_s, n_t, n_c = inv.shape
    n_p = paths.shape[0]
    lo = np.empty(k, np.int64)
    w = np.empty(k)
    for i in range(k):
        x = min(max(xs[i], 0.0), n_c - 1.0)
        lo[i] = min(int(math.floor(x)), max(n_c - 2, 0))
        w[i] = x - lo[i]
    di, wd = 0, 0.0
    if n_d > 1:
        dd = min(max(d, 0.0), 1.0)
        while di < n_d - 2 and drop_grid[di + 1] <= dd:
            di += 1
        span = drop_grid[di + 1] - drop_grid[di]
        wd = min((dd - drop_grid[di]) / span, 1.0) if span > 0 else 0.0
    out = np.zeros(n_t)
    lat = np.empty(k)
    for t in range(n_t):
        for s in range(n_s):
            for i in range(k):
                hi = min(lo[i] + 1, n_c - 1)
                v = (1.0 - w[i]) * inv[i, di, s, t, lo[i]] + w[i] * inv[i, di, s, t, hi]
                if n_d > 1:
                    v2 = (1.0 - w[i]) * inv[i, di + 1, s, t, lo[i]] + w[i] * inv[i, di + 1, s, t, hi]
                    v = (1.0 - wd) * v + wd * v2
                lat[i] = 1.0 / v if v > 0.0 else np.inf
            e2e = 0.0
            for pp in range(n_p):
                tot = 0.0
                for i in range(k):
                    if paths[pp, i] > 0.0:
                        tot += lat[i]
                e2e = max(e2e, tot)
            if np.isfinite(e2e):
                out[t] += 1.0 if e2e <= slo else (slo / e2e) ** alpha
    mean: np.ndarray = out / n_s
    return mean


@dataclass
class PipelineTerm:
    """One pipeline as the objective sees it: its stages' variables and latency tables."""

    name: str
    idx: np.ndarray  # the stages' variable indices in the problem
    paths: np.ndarray  # (paths x stages) 0/1, stages in ``idx`` order
    slo_s: float
    priority: float
    alpha: float
    drop_var: int  # the variable whose drop rate is the pipeline's (its first entry stage)
    lat: np.ndarray  # (stages, drops, samples, steps, counts) seconds
    current: np.ndarray  # the stages' current replicas
    new_fraction: np.ndarray  # per step, the share after the cold start (window.py)
    drop_grid: np.ndarray
    inv: np.ndarray | None = None  # 1 / lat, made at the first evaluation

    def stage_latency(self, xs: np.ndarray, d: float) -> np.ndarray:
        """(stages, samples, steps) latencies at continuous replicas ``xs`` and drop ``d``:
        harmonic interpolation between whole counts (1/latency is linear, inf-safe), then
        linear between drop-grid points."""
        n_c = self.lat.shape[-1]
        xs = np.clip(np.asarray(xs, float), 0.0, n_c - 1.0)
        lo = np.minimum(np.floor(xs).astype(int), max(n_c - 2, 0))
        hi = np.minimum(lo + 1, n_c - 1)
        w = (xs - lo)[:, None, None, None]
        ks = np.arange(xs.size)
        with np.errstate(divide="ignore"):
            inv = (1 - w) / self.lat[ks, :, :, :, lo] + w / self.lat[ks, :, :, :, hi]
        if self.drop_grid.size == 1:
            inv = inv[:, 0]
        else:
            k = int(np.clip(np.searchsorted(self.drop_grid, d, side="right") - 1, 0,
                            self.drop_grid.size - 2))
            span = self.drop_grid[k + 1] - self.drop_grid[k]
            wd = min(max((d - self.drop_grid[k]) / span, 0.0), 1.0)
            inv = (1 - wd) * inv[:, k] + wd * inv[:, k + 1]
        with np.errstate(divide="ignore"):
            return np.where(inv > 0, 1.0 / np.maximum(inv, 1e-300), np.inf)

    def e2e(self, xs: np.ndarray, d: float) -> np.ndarray:
        """(samples, steps) end-to-end estimates."""
        return compose(np.moveaxis(self.stage_latency(xs, d), 0, -1), self.paths)

    def _step_utility(self, xs: np.ndarray, d: float) -> np.ndarray:
        if self.inv is None:
            with np.errstate(divide="ignore"):
                self.inv = np.ascontiguousarray(1.0 / self.lat)
        return step_utilities(self.inv, np.asarray(xs, float), float(d), self.drop_grid,
                              self.paths, self.slo_s, self.alpha)

    def utility(self, xs: np.ndarray, d: float) -> float:
        """Window utility: the cold start holds scale-ups at the current replicas for the
        share ``1 - new_fraction`` of each step (window.py), stage by stage."""
        xs = np.asarray(xs, float)
        new = self._step_utility(xs, d)
        cold = np.minimum(xs, self.current)
        if np.all(cold >= xs):
            return float(new.mean())
        old = self._step_utility(cold, d)
        f = self.new_fraction
        return float(((1 - f) * old + f * new).mean())

    def split(self, xs: np.ndarray, d: float) -> tuple[np.ndarray, np.ndarray]:
        """Each stage's latency averaged over the forecast samples and steps, and its share
        of the end-to-end estimate composed from them (the SLO split the plan implies)."""
        lat = self.stage_latency(xs, d).mean(axis=(1, 2))
        return lat, shares(lat, self.paths)


@dataclass
class PipelineProblem(Problem):
    """A :class:`Problem` whose objective counts each pipeline once (module docstring)."""

    terms: list[PipelineTerm] = field(default_factory=list)
    separable = False  # a stage's value depends on the other stages (integer.level_start)
    owner: np.ndarray = field(init=False)  # variable -> objective unit
    unit_priority: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.owner = np.arange(self.n)
        in_pipe = np.zeros(self.n, bool)
        for t in self.terms:
            in_pipe[t.idx] = True
        singles = np.flatnonzero(~in_pipe)
        self.owner = np.full(self.n, -1)
        self.owner[singles] = np.arange(singles.size)
        pri = list(self.priority[singles])
        for k, t in enumerate(self.terms):
            self.owner[t.idx] = singles.size + k
            pri.append(t.priority)
        self.unit_priority = np.array(pri, float)
        self.single_idx = singles

    @property
    def units(self) -> int:
        return self.unit_priority.size

    def _term_values(self, x: np.ndarray, d: np.ndarray, penalty: bool) -> np.ndarray:
        out = np.empty(len(self.terms))
        for k, t in enumerate(self.terms):
            dd = float(d[t.drop_var])
            out[k] = t.utility(x[t.idx], dd) * (float(phi(dd)) if penalty else 1.0)
        return out

    def _per_variable(self, x: np.ndarray, d: np.ndarray, penalty: bool) -> np.ndarray:
        x = np.asarray(x, float)
        d = np.asarray(d, float)
        base = Problem.utilities(self, x, d)
        v = phi(d) * base if penalty else base
        for t, val in zip(self.terms, self._term_values(x, d, penalty)):
            v[t.idx] = val
        return v

    def utilities(self, x: np.ndarray, d: np.ndarray) -> np.ndarray:
        return self._per_variable(x, d, False)

    def job_values(self, x: np.ndarray, d: np.ndarray) -> np.ndarray:
        return self._per_variable(x, d, self.penalty)

    def unit_values(self, x: np.ndarray, d: np.ndarray) -> np.ndarray:
        v = self.job_values(x, d)
        out = np.empty(self.units)
        out[self.owner] = v
        return out

    def value(self, x: np.ndarray, d: np.ndarray) -> float:
        return cluster_objective(self.kind, self.unit_values(x, d), self.unit_priority,
                                 self.gamma, self.fair_tiebreak)

    def single_values(self, x: np.ndarray, x_new: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Per variable, its unit's value when that variable alone takes ``x_new``."""
        x = np.asarray(x, float)
        x_new = np.asarray(x_new, float)
        d = np.asarray(d, float)
        out = Problem.single_values(self, x, x_new, d)
        for t in self.terms:
            dd = float(d[t.drop_var])
            scale = float(phi(dd)) if self.penalty else 1.0
            xs = x[t.idx]
            for s, i in enumerate(t.idx):
                if x_new[i] == x[i]:
                    out[i] = t.utility(xs, dd) * scale
                    continue
                moved = xs.copy()
                moved[s] = x_new[i]
                out[i] = t.utility(moved, dd) * scale
        return out

    def single_change_values(self, v: np.ndarray, v_new: np.ndarray) -> np.ndarray:
        """Objective when variable ``i``'s unit alone moves to ``v_new[i]``: the base rule
        over units (a pipeline counted once), not over variables."""
        vu = np.empty(self.units)
        vu[self.owner] = v
        u = self.owner
        pri = self.unit_priority
        total: np.ndarray = pri @ vu + pri[u] * (v_new - vu[u])
        if self.kind in ("sum", "penalty_sum"):
            return total
        m = vu.size
        if m == 1:
            spread = np.zeros(v.size)
        else:
            order = np.argsort(vu, kind="stable")
            idx = np.arange(m)
            max_excl = np.where(idx == order[-1], vu[order[-2]], vu[order[-1]])[u]
            min_excl = np.where(idx == order[0], vu[order[1]], vu[order[0]])[u]
            spread = np.maximum(max_excl, v_new) - np.minimum(min_excl, v_new)
        if self.kind == "fair":
            return cast(np.ndarray, -spread + self.fair_tiebreak * (vu.sum() + v_new - vu[u]) / m)
        return total - self.gamma * spread

    def trade_down(self, x: np.ndarray, d: np.ndarray, max_rounds: int = 64) -> np.ndarray:
        """Shrink's complement for pipelines: one stage gives up 2 or 3 replicas for one
        more on another stage of its pipeline, while the objective stays unchanged and the
        resources used fall (shrink removes one replica at a time, so it cannot find a
        cheaper split that needs a trade between stages)."""
        x = np.asarray(x, float).copy()
        cur = self.value(x, d)
        def same(v: float) -> bool:
            return abs(v - cur) <= 1e-12 * max(1.0, abs(cur))
        weight = self.need.sum(axis=1)  # a replica's resources, summed (to rank the trades)
        for _ in range(max_rounds):
            best, best_save = None, 1e-12
            for t in self.terms:
                for i in t.idx:
                    for j in t.idx:
                        for k in (2, 3):
                            save = k * weight[i] - weight[j]
                            if i == j or x[i] - k < self.lo[i] or x[j] + 1 > self.hi[j] \
                                    or save <= best_save:
                                continue
                            y = x.copy()
                            y[i] -= k
                            y[j] += 1
                            if self.fits(y) and same(self.value(y, d)):
                                best, best_save = y, save
            if best is None:
                return x
            x = best
        return x

    def balance(self, x: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Each pipeline's replicas re-split among its stages (pipeline_balance.best_split:
        utility, then end-to-end health, within the resources it holds), kept only where the
        cluster objective does not fall."""
        x = np.asarray(x, float).copy()
        cur = self.value(x, d)
        for t in self.terms:
            y = best_split(t, x[t.idx], float(d[t.drop_var]), self.lo[t.idx], self.hi[t.idx],
                           self.need[t.idx])
            if np.array_equal(y, x[t.idx]):
                continue
            z = x.copy()
            z[t.idx] = y
            val = self.value(z, d)
            if self.fits(z) and val >= cur - 1e-12 * max(1.0, abs(cur)):
                x, cur = z, val
        return x

    def level_start(self, d: np.ndarray, max_levels: int = 256) -> np.ndarray | None:
        """integer.level_start with pipelines (pipeline_balance.level_start)."""
        return level_start(self, d, max_levels)

    def subset(self, idx: Iterable[int], cap_cpus: float, cap_mem: float | None, gamma: float,
               extra_caps: dict[str, float] | None = None) -> "Problem":
        """The variables ``idx`` alone (a group): pipelines wholly inside stay terms (the
        planner keeps a pipeline's stages in one group)."""
        idx = list(idx)
        base = Problem.subset(self, idx, cap_cpus, cap_mem, gamma, extra_caps)
        pos = {v: k for k, v in enumerate(idx)}
        terms = []
        for t in self.terms:
            if all(int(i) in pos for i in t.idx):
                terms.append(PipelineTerm(**{**t.__dict__, "idx": np.array([pos[int(i)] for i in t.idx]),
                                             "drop_var": pos[t.drop_var]}))
        if not terms:
            return base
        return PipelineProblem(jobs=base.jobs, tables=base.tables, drop_grid=base.drop_grid,
                               cap_cpus=base.cap_cpus, cap_mem=base.cap_mem, kind=base.kind,
                               gamma=base.gamma, fair_tiebreak=base.fair_tiebreak,
                               batch_tables=base.batch_tables, extra_caps=base.extra_caps,
                               terms=terms)

    def unit_groups(self, n_groups: int, rng: np.random.Generator) -> list[list[int]]:
        """Random groups of units (a pipeline's stages stay together), as variable lists."""
        members: list[list[int]] = [[] for _ in range(self.units)]
        for i, u in enumerate(self.owner):
            members[u].append(i)
        order = rng.permutation(self.units)
        n_groups = min(n_groups, self.units)
        return [sorted(i for u in order[k::n_groups] for i in members[u]) for k in range(n_groups)]


def with_pipelines(prob: Problem, terms: list[PipelineTerm]) -> PipelineProblem:
    """``prob`` with ``terms`` counted as one job each."""
    return PipelineProblem(jobs=prob.jobs, tables=prob.tables, drop_grid=prob.drop_grid,
                           cap_cpus=prob.cap_cpus, cap_mem=prob.cap_mem, kind=prob.kind,
                           gamma=prob.gamma, fair_tiebreak=prob.fair_tiebreak,
                           batch_tables=prob.batch_tables, extra_caps=prob.extra_caps, terms=terms)


def build_term(name: str, stage_jobs: list[JobInput], idx: list[int], paths: np.ndarray,
               slo_s: float, priority: float, alpha: float, rho_max: float, estimator: int,
               new_fraction: np.ndarray, drop_grid: np.ndarray, drop_var: int,
               ceilings: list[int]) -> PipelineTerm:
    """Tabulate a pipeline's stages (``stage_jobs``: their rates already entry x fraction)."""
    keep = 1.0 - drop_grid
    lats = []
    width = max(ceilings) + 1
    for j, cmax in zip(stage_jobs, ceilings):
        tab = stage_latency_table(np.ascontiguousarray(j.rates, float), keep, j.proc_s,
                                  j.quantile, rho_max, estimator, width - 1, j.concurrency)
        lats.append(tab)
    return PipelineTerm(name=name, idx=np.array(idx), paths=paths, slo_s=slo_s,
                        priority=priority, alpha=alpha, drop_var=drop_var,
                        lat=np.stack(lats), current=np.array([j.current for j in stage_jobs], float),
                        new_fraction=new_fraction, drop_grid=drop_grid)
