"""From the relaxed optimum to integer replicas (paper sections 4.2 and 4.3).

* :func:`repair` and :func:`fill`: never exceed capacity, then hand out the leftover one
  replica at a time to the largest objective gain (the paper's post-processing).
* :func:`water_fill` and :func:`level_start`: integer starts for the max-min terms, where
  rounding a relaxed optimum can land far from the integer optimum (ours).
* :func:`polish`: move replicas between jobs while the objective improves (ours).
* :func:`tune_drops`: drop rates snap to the best point of the tabulated grid.
* :func:`shrink`: the paper's shrink pass, right-sizing jobs.
* :func:`balance`: each pipeline's replicas re-split among its stages (pipeline_balance.py),
  which one-variable steps cannot do where a pipeline's utility is flat in each stage.

Single-job changes are scored for all jobs at once with
:meth:`Problem.single_change_values`, so each step costs O(jobs), not O(jobs) objective
evaluations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np

from .problem import Problem

if TYPE_CHECKING:
    from .pipeline_problem import PipelineProblem

TOL = 1e-9


def _values(prob: Problem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    return prob.job_values(x, d)


def _room(prob: Problem, x: np.ndarray) -> np.ndarray:
    """Which jobs can take one more replica within bounds and capacity."""
    used = x @ prob.need  # per binding resource
    return cast(np.ndarray, (x < prob.hi) & np.all(used[None, :] + prob.need <= prob.caps[None, :] + TOL, axis=1))


def repair(prob: Problem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Remove replicas (smallest objective loss first) until the allocation fits."""
    x = x.copy()
    while not prob.fits(x):
        can = x > prob.lo
        if not can.any():
            raise ValueError("minimum replicas exceed the cluster capacity")
        vals = prob.single_change_values(_values(prob, x, d), prob.single_values(x, x - 1, d))
        vals[~can] = -np.inf
        x[int(np.argmax(vals))] -= 1
    return x


def fill(prob: Problem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Give leftover capacity, one replica at a time, to the largest objective gain.

    When no addition strictly gains (ties in max-min terms), a replica still goes to the
    poorest job whose own utility it raises, if the objective does not drop: it cannot
    widen the spread and lets the next addition lift the minimum.
    """
    x = x.copy()
    while True:
        room = _room(prob, x)
        if not room.any():
            return x
        v = _values(prob, x, d)
        v_up = prob.single_values(x, np.minimum(x + 1, prob.hi), d)
        cur = prob.value(x, d)
        vals = prob.single_change_values(v, v_up)
        vals[~room] = -np.inf
        best = int(np.argmax(vals))
        if vals[best] > cur + TOL:
            x[best] += 1
            continue
        tie = room & (vals >= cur - 1e-12) & (v_up > v + 1e-12)
        if not tie.any():
            return x
        x[int(np.argmin(np.where(tie, v, np.inf)))] += 1


def water_fill(prob: Problem, d: np.ndarray) -> np.ndarray:
    """Max-min start: from the minimums, always lift the poorest job that can still gain."""
    x: np.ndarray = prob.lo.copy()
    while True:
        v = _values(prob, x, d)
        gain = prob.single_values(x, np.minimum(x + 1, prob.hi), d) - v
        ok = _room(prob, x) & (gain > 1e-12)
        if not ok.any():
            return x
        x[int(np.argmin(np.where(ok, v, np.inf)))] += 1


def level_start(prob: Problem, d: np.ndarray, max_levels: int = 256) -> np.ndarray | None:
    """Best max-min start: for a floor level L every job gets the fewest replicas reaching L.

    Utilities rise with replicas, so for the pure spread objective some L gives the exact
    integer optimum (an optimum x* dominates the allocation built from its own minimum).
    Levels come from the tables (at most ``max_levels`` of them, evenly spread).
    """
    if not prob.separable:  # pipelines: a pipeline's value is not one table row
        return cast("PipelineProblem", prob).level_start(d, max_levels)
    lo, hi = prob.lo.astype(int), prob.hi.astype(int)
    table = prob.tables[:, 0, :]
    cols = np.arange(table.shape[1])
    valid = (cols[None, :] >= lo[:, None]) & (cols[None, :] <= hi[:, None])
    levels = np.unique(np.round(table[valid], 12))
    if levels.size > max_levels:
        levels = levels[np.linspace(0, levels.size - 1, max_levels).astype(int)]
    best, best_val = None, -np.inf
    for lev in levels:
        ok = valid & (table >= lev - 1e-12)
        if not ok.any(axis=1).all():
            break  # some job cannot reach this level, nor any higher one
        x = ok.argmax(axis=1).astype(float)
        if not prob.fits(x):
            break  # higher levels need at least as many replicas
        v = prob.value(x, d)
        if v > best_val:
            best, best_val = x, v
    return best


def polish(
    prob: Problem, x: np.ndarray, d: np.ndarray, max_moves: int = 64, width: int = 6, max_step: int = 3
) -> np.ndarray:
    """Move 1..``max_step`` replicas from one job to another while the objective improves.

    Multi-replica moves matter because utility is S-shaped in replicas: a job may gain only
    after two more replicas, with every single move on the way a loss. Only the ``width``
    most promising donors (smallest single-change loss) and receivers (largest gain) are
    paired, so a move costs at most ``width**2 * max_step`` evaluations.
    """
    x = x.copy()
    cur = prob.value(x, d)
    for _ in range(max_moves):
        v = _values(prob, x, d)
        up = prob.single_change_values(v, prob.single_values(x, np.minimum(x + 1, prob.hi), d))
        down = prob.single_change_values(v, prob.single_values(x, np.maximum(x - 1, prob.lo), d))
        up[x >= prob.hi] = -np.inf
        down[x <= prob.lo] = -np.inf
        receivers = np.argsort(-up)[:width]
        donors = np.argsort(-down)[:width]
        best, best_val = None, cur + TOL
        for i in donors:
            if not np.isfinite(down[i]):
                continue
            for j in receivers:
                if j == i or not np.isfinite(up[j]):
                    continue
                for k in range(1, max_step + 1):
                    if x[i] - k < prob.lo[i] or x[j] + k > prob.hi[j]:
                        break
                    x[i] -= k
                    x[j] += k
                    if prob.fits(x):
                        val = prob.value(x, d)
                        if val > best_val:
                            best, best_val = (i, j, k), val
                    x[i] += k
                    x[j] -= k
        if best is None:
            break
        i, j, k = best
        x[i] -= k
        x[j] += k
        x = fill(prob, x, d)
        cur = prob.value(x, d)
    return x


def tune_drops(prob: Problem, x: np.ndarray, d: np.ndarray, passes: int = 2) -> np.ndarray:
    """Coordinate search of each droppable job's drop rate over the tabulated grid."""
    d = d.copy()
    idx = np.flatnonzero(prob.can_drop)
    if idx.size == 0:
        return d
    cur = prob.value(x, d)
    for _ in range(passes):
        changed = False
        for i in idx:
            keep = d[i]
            for g in prob.drop_grid:
                d[i] = g
                val = prob.value(x, d)
                if val > cur + TOL:
                    cur, keep, changed = val, g, True
            d[i] = keep
        if not changed:
            break
    return d


def balance(prob: Problem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Pipelines only (the identity otherwise): the best split of each pipeline's replicas
    among its stages, where the objective does not fall (``PipelineProblem.balance``)."""
    return x if prob.separable else cast("PipelineProblem", prob).balance(x, d)


def shrink(prob: Problem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Paper section 4.3: right-size jobs, giving back replicas one at a time.

    A replica is removed only while the cluster objective stays unchanged (the paper's
    "until the cluster utility changes"): under the fairness objectives a removal that
    *raises* the objective would level a satisfied job down, which is not what shrinking
    is for. Jobs at predicted utility 1 go first, as in the paper; then (ours) jobs below 1
    whose extra replicas change nothing in the window, e.g. because the cold start, not
    the replica count, caps their utility.
    """
    x = x.copy()
    cur = prob.value(x, d)
    u = prob.utilities(x, d)
    by_size = sorted(range(prob.n), key=lambda k: -x[k])
    order = [i for i in by_size if u[i] >= 1.0 - 1e-9] + [i for i in by_size if u[i] < 1.0 - 1e-9]
    for i in order:
        while x[i] > prob.lo[i]:
            x[i] -= 1
            val = prob.value(x, d)
            if abs(val - cur) <= 1e-12 * max(1.0, abs(cur)):
                cur = val
            else:
                x[i] += 1
                break
    if not prob.separable:  # pipelines: trades between a pipeline's stages (pipeline_problem),
        pipes = cast("PipelineProblem", prob)  # then the healthiest split of what is left
        x = pipes.balance(pipes.trade_down(x, d), d)
    return x
