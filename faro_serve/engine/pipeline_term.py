"""A pipeline as the cluster objective sees it (issue 35; docs/pipelines.md): its stages'
latency tables and the Numba kernels that score a choice of stage replicas against the
end-to-end SLO (the paper's relaxed utility, eq. 1, of ``pipeline_latency.compose``).

Kept apart from :mod:`.pipeline_problem`, which counts these terms in the cluster
objective, so that the per-pipeline math reads on its own. Pure numpy/Numba, no Ray.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from .latency import latency_row, rho_max_factors
from .pipeline_latency import compose, shares
from .problem import JobInput


@njit(cache=True)
def stage_latency_table(
    rates: np.ndarray, keep: np.ndarray, p: float, q: float, rho_max: float, estimator: int, cmax: int, k: int
) -> np.ndarray:
    """``L[d, s, t, c]``: a stage's percentile latency (s) at ``c`` replicas of ``k`` servers
    for forecast sample ``s``, step ``t``, when the entry keeps ``keep[d]`` of the queries."""
    n_s, n_t = rates.shape
    out = np.empty((keep.shape[0], n_s, n_t, cmax + 1))
    factors = rho_max_factors(cmax * k, q, rho_max)
    row = np.empty(cmax * k + 1)
    for di in range(keep.shape[0]):
        for s in range(n_s):
            for t in range(n_t):
                latency_row(max(rates[s, t] * keep[di], 0.0), p, q, rho_max, estimator, factors, row)
                for c in range(cmax + 1):
                    out[di, s, t, c] = row[c * k]
    return out


@njit(cache=True)
def step_utilities(
    inv: np.ndarray, xs: np.ndarray, d: float, drop_grid: np.ndarray, paths: np.ndarray, slo: float, alpha: float
) -> np.ndarray:
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
            k = int(np.clip(np.searchsorted(self.drop_grid, d, side="right") - 1, 0, self.drop_grid.size - 2))
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
        return step_utilities(
            self.inv, np.asarray(xs, float), float(d), self.drop_grid, self.paths, self.slo_s, self.alpha
        )

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


def build_term(
    name: str,
    stage_jobs: list[JobInput],
    idx: list[int],
    paths: np.ndarray,
    slo_s: float,
    priority: float,
    alpha: float,
    rho_max: float,
    estimator: int,
    new_fraction: np.ndarray,
    drop_grid: np.ndarray,
    drop_var: int,
    ceilings: list[int],
) -> PipelineTerm:
    """Tabulate a pipeline's stages (``stage_jobs``: their rates already entry x fraction)."""
    keep = 1.0 - drop_grid
    lats = []
    width = max(ceilings) + 1
    for j, cmax in zip(stage_jobs, ceilings):
        tab = stage_latency_table(
            np.ascontiguousarray(j.rates, float),
            keep,
            j.proc_s,
            j.quantile,
            rho_max,
            estimator,
            width - 1,
            j.concurrency,
        )
        lats.append(tab)
    return PipelineTerm(
        name=name,
        idx=np.array(idx),
        paths=paths,
        slo_s=slo_s,
        priority=priority,
        alpha=alpha,
        drop_var=drop_var,
        lat=np.stack(lats),
        current=np.array([j.current for j in stage_jobs], float),
        new_fraction=new_fraction,
        drop_grid=drop_grid,
    )
