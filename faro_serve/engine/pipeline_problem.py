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
multiplied by ``1 - d`` and the pipeline's effective utility is ``phi(d) U``. A pipeline's
latency tables and utility kernels are :mod:`.pipeline_term`'s.

Pure numpy/Numba, no Ray.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from .pipeline_balance import best_split, split_menu
from .pipeline_term import PipelineTerm
from .problem import Problem
from .utility import cluster_objective, phi


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
        return cluster_objective(self.kind, self.unit_values(x, d), self.unit_priority, self.gamma, self.fair_tiebreak)

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
                            if i == j or x[i] - k < self.lo[i] or x[j] + 1 > self.hi[j] or save <= best_save:
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
            y = best_split(t, x[t.idx], float(d[t.drop_var]), self.lo[t.idx], self.hi[t.idx], self.need[t.idx])
            if np.array_equal(y, x[t.idx]):
                continue
            z = x.copy()
            z[t.idx] = y
            val = self.value(z, d)
            if self.fits(z) and val >= cur - 1e-12 * max(1.0, abs(cur)):
                x, cur = z, val
        return x

    def level_start(self, d: np.ndarray, max_levels: int = 256) -> np.ndarray | None:
        """integer.level_start with pipelines: for a floor level L every single model gets
        the fewest replicas reaching L and every pipeline its cheapest split reaching L
        (``pipeline_balance.split_menu``); the best L wins. The max-min start the fairness
        objectives need: without it, one-stage steps cannot lift a pipeline whose other
        stage is short, and the solver levels every job down to a pipeline's poor value.
        None when a pipeline has too many splits to list."""
        lo, hi = self.lo.astype(int), self.hi.astype(int)
        menus = []
        for t in self.terms:
            menu = split_menu(t, self.lo[t.idx], self.hi[t.idx], self.need[t.idx], self.caps, float(d[t.drop_var]))
            if menu is None:
                return None
            menus.append(menu)
        s = self.single_idx
        table = self.tables[s, 0, :]
        cols = np.arange(table.shape[1])
        valid = (cols[None, :] >= lo[s, None]) & (cols[None, :] <= hi[s, None])
        levels = np.unique(np.round(np.concatenate([table[valid]] + [m[1] for m in menus]), 12))
        if levels.size > max_levels:
            levels = levels[np.linspace(0, levels.size - 1, max_levels).astype(int)]
        best, best_val = None, -np.inf
        for lev in levels:
            x = np.zeros(self.n)
            ok = valid & (table >= lev - 1e-12)
            if not ok.any(axis=1).all():
                break
            x[s] = ok.argmax(axis=1)
            reach = [np.flatnonzero(m[1] >= lev - 1e-12) for m in menus]
            if any(r.size == 0 for r in reach):
                break
            for t, (ys, _, cost), r in zip(self.terms, menus, reach):
                x[t.idx] = ys[r[np.argmin(cost[r])]]
            if not self.fits(x):
                break
            v = self.value(x, d)
            if v > best_val:
                best, best_val = x, v
        return best

    def subset(
        self,
        idx: Iterable[int],
        cap_cpus: float,
        cap_mem: float | None,
        gamma: float,
        extra_caps: dict[str, float] | None = None,
    ) -> "Problem":
        """The variables ``idx`` alone (a group): pipelines wholly inside stay terms (the
        planner keeps a pipeline's stages in one group)."""
        idx = list(idx)
        base = Problem.subset(self, idx, cap_cpus, cap_mem, gamma, extra_caps)
        pos = {v: k for k, v in enumerate(idx)}
        terms = []
        for t in self.terms:
            if all(int(i) in pos for i in t.idx):
                terms.append(
                    PipelineTerm(
                        **{**t.__dict__, "idx": np.array([pos[int(i)] for i in t.idx]), "drop_var": pos[t.drop_var]}
                    )
                )
        if not terms:
            return base
        return PipelineProblem(
            jobs=base.jobs,
            tables=base.tables,
            drop_grid=base.drop_grid,
            cap_cpus=base.cap_cpus,
            cap_mem=base.cap_mem,
            kind=base.kind,
            gamma=base.gamma,
            fair_tiebreak=base.fair_tiebreak,
            batch_tables=base.batch_tables,
            extra_caps=base.extra_caps,
            terms=terms,
        )

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
    return PipelineProblem(
        jobs=prob.jobs,
        tables=prob.tables,
        drop_grid=prob.drop_grid,
        cap_cpus=prob.cap_cpus,
        cap_mem=prob.cap_mem,
        kind=prob.kind,
        gamma=prob.gamma,
        fair_tiebreak=prob.fair_tiebreak,
        batch_tables=prob.batch_tables,
        extra_caps=prob.extra_caps,
        terms=terms,
    )
