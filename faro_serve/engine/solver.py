"""Solve a :class:`~faro_serve.engine.problem.Problem` (paper sections 3.4, 4.2, 4.3).

COBYLA (initial step ``rhobeg`` 2) on the relaxed objective, one continuous replica
variable per job plus a drop-rate variable per job that may drop under the penalty
objectives, with one linear constraint per binding resource (CPUs, memory where capped,
GPUs, custom resources); then the integer post-processing of ``integer.py``: the best of
several integer starts, polish, drop rates, shrink.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from scipy.optimize import Bounds, LinearConstraint, minimize

from .integer import balance, fill, level_start, polish, repair, shrink, tune_drops, water_fill
from .problem import Problem

DROP_SCALE = 10.0  # drop-rate variables are scaled so COBYLA's rhobeg of 2 is a 0.2 step
TOL = 1e-9
FloatArray = npt.NDArray[np.float64]


def start_point(prob: Problem) -> FloatArray:
    """Current replicas clipped to bounds, scaled toward the minimums until they fit."""
    x = np.clip(prob.current, prob.lo, prob.hi)
    if prob.fits(x):
        return cast(FloatArray, x)
    extra = x - prob.lo
    # per binding resource, the share of the extra replicas it cannot hold
    over = (x @ prob.need - prob.caps) / np.maximum(extra @ prob.need, TOL)
    shrink = np.clip(1.0 - max(0.0, *over), 0.0, 1.0)
    return cast(FloatArray, prob.lo + extra * shrink)


def _linear_rows(prob: Problem, fx: npt.NDArray[np.intp], x0: FloatArray, n_drop: int) -> tuple[FloatArray, FloatArray]:
    """Capacity constraints ``A v <= b`` over the free replica variables (+ drop variables):
    one row per binding resource (CPUs, memory where capped, GPUs, custom resources)."""
    free = np.zeros(prob.n, bool)
    free[fx] = True
    rows = np.concatenate([prob.need[fx].T, np.zeros((prob.caps.size, n_drop))], axis=1)
    caps = prob.caps - x0[~free] @ prob.need[~free]
    return rows, caps


def _cobyla_nlopt(
    fun: Callable[[FloatArray], float],
    v0: FloatArray,
    lb: FloatArray,
    ub: FloatArray,
    a: FloatArray,
    b: FloatArray,
    rhobeg: float,
    maxeval: int,
    maxtime: float | None = None,
) -> FloatArray:
    import nlopt

    best: list[Any] = [np.inf, v0.copy()]  # [value, point] of the best feasible point

    def obj(v: FloatArray, grad: FloatArray) -> float:
        f = fun(v)
        if f < best[0] and np.all(a @ v <= b + 1e-9):
            best[0], best[1] = f, v.copy()
        return f

    opt = nlopt.opt(nlopt.LN_COBYLA, v0.size)
    opt.set_min_objective(obj)
    opt.set_lower_bounds(lb)
    opt.set_upper_bounds(ub)
    for row, cap in zip(a, b):
        opt.add_inequality_constraint(lambda v, g, row=row, cap=cap: float(row @ v - cap), 1e-9)
    opt.set_initial_step(rhobeg)
    opt.set_xtol_abs(0.02)
    opt.set_maxeval(maxeval)
    if maxtime is not None:
        opt.set_maxtime(max(maxtime, 1e-3))
    try:
        opt.optimize(v0.copy())
    except (nlopt.RoundoffLimited, RuntimeError, ValueError):
        pass  # keep the best feasible point seen so far
    return cast(FloatArray, best[1])


def _cobyla_scipy(
    fun: Callable[[FloatArray], float],
    v0: FloatArray,
    lb: FloatArray,
    ub: FloatArray,
    a: FloatArray,
    b: FloatArray,
    rhobeg: float,
    maxeval: int,
    maxtime: float | None = None,
) -> FloatArray:  # no time limit
    res = minimize(
        fun,
        v0,
        method="COBYLA",
        bounds=Bounds(lb, ub),
        constraints=[LinearConstraint(a, -np.inf, b)],
        options={"rhobeg": rhobeg, "tol": 0.02, "maxiter": maxeval},
    )
    return np.asarray(res.x, float)


# "nlopt" itself is served by sandbox.py (below), which runs "nlopt-inline" in its child
BACKENDS = {"nlopt-inline": _cobyla_nlopt, "scipy": _cobyla_scipy}


def solve_relaxed(
    prob: Problem, rhobeg: float = 2.0, backend: str = "nlopt", maxeval: int | None = None, maxtime: float | None = None
) -> tuple[FloatArray, FloatArray, int]:
    """Continuous optimum of the relaxed objective with COBYLA. Returns ``(x, d, evaluations)``.

    ``backend`` "nlopt" runs Powell's COBYLA compiled (NLopt); "scipy" runs
    ``scipy.optimize.minimize(method="COBYLA")``, which from SciPy 1.16 is a pure-Python
    port (PRIMA) costing about 1 ms per iteration: same algorithm, ~20x slower here.
    "nlopt" runs in a child process with a deadline (``sandbox.py``: NLopt's COBYLA can
    spin forever) and falls back to "scipy" when it stalls; "nlopt-inline" runs it here.
    ``maxtime`` (seconds, the planner's deadline): NLopt stops there with the best feasible
    point so far; at 0, or where NLopt did not answer before it, the start point is
    returned (no evaluations), so the integer starts of :func:`solve` decide.
    """
    if maxtime is not None and maxtime <= 0.0:
        return start_point(prob), np.zeros(prob.n), 0
    if backend == "nlopt":
        import time

        from . import sandbox

        t0 = time.perf_counter()
        got = sandbox.relaxed(prob, rhobeg, maxeval, maxtime=maxtime)
        if got is not None:
            return got
        if maxtime is not None and time.perf_counter() - t0 >= maxtime:  # none left for PRIMA
            return start_point(prob), np.zeros(prob.n), 0
        backend = "scipy"  # NLopt stalled (or its process could not run): PRIMA's COBYLA
    n = prob.n
    free = prob.hi > prob.lo
    drop_idx = np.flatnonzero(prob.can_drop)
    x0 = start_point(prob)
    if not free.any() and drop_idx.size == 0:
        return x0, np.zeros(n), 0
    fx = np.flatnonzero(free)
    count = [0]

    def unpack(v: FloatArray) -> tuple[FloatArray, FloatArray]:
        x = x0.copy()
        x[fx] = v[: fx.size]
        dd = np.zeros(n)
        dd[drop_idx] = v[fx.size :] / DROP_SCALE
        return x, dd

    def neg_value(v: FloatArray) -> float:
        count[0] += 1
        x, dd = unpack(v)
        return -prob.value(x, dd)

    v0 = np.concatenate([x0[fx], np.zeros(drop_idx.size)])
    lb = np.concatenate([prob.lo[fx], np.zeros(drop_idx.size)])
    ub = np.concatenate([prob.hi[fx], np.full(drop_idx.size, DROP_SCALE)])
    a, b = _linear_rows(prob, fx, x0, drop_idx.size)
    # COBYLA costs grow ~cubically with the variables; past a few hundred evaluations the
    # integer starts of integer.py matter more than further relaxed progress.
    budget = maxeval if maxeval is not None else min(100 + 30 * v0.size, 800)
    v = BACKENDS[backend](neg_value, v0, lb, ub, a, b, rhobeg, budget, maxtime)
    x, d = unpack(v)
    return np.clip(x, prob.lo, prob.hi), np.clip(d, 0.0, 1.0), count[0]


def solve(
    prob: Problem,
    *,
    do_shrink: bool = True,
    do_polish: bool = True,
    rhobeg: float = 2.0,
    backend: str = "nlopt",
    maxtime: float | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Integer replicas and drop rates for ``prob``. Returns ``(x, d, evaluations)``.
    ``maxtime``: seconds the relaxed solve may take (the planner's deadline; 0: skip it)."""
    xc, dc, nfev = solve_relaxed(prob, rhobeg=rhobeg, backend=backend, maxtime=maxtime)
    d = np.where(prob.can_drop, dc, 0.0)
    rounded = fill(prob, repair(prob, np.clip(np.floor(xc + 1e-6), prob.lo, prob.hi), d), d)
    # Rounding a relaxed optimum can land far from the integer optimum when the objective
    # has max-min terms; two cheap integer starts guard against that and the best wins.
    candidates = [rounded, fill(prob, prob.lo.copy(), d), fill(prob, water_fill(prob, d), d)]
    if prob.kind in ("fair", "fair_sum", "penalty_fair_sum"):
        lev = level_start(prob, d)
        if lev is not None:
            candidates.append(fill(prob, lev, d))
    if not prob.separable:  # a pipeline's stages: the best split of what it holds, then fill
        candidates = [fill(prob, balance(prob, c, d), d) for c in candidates]
    x = max(candidates, key=lambda c: prob.value(c, d))
    if do_polish and prob.n > 1:
        x = balance(prob, polish(prob, x, d), d)
    if prob.penalty:
        d = tune_drops(prob, x, d)
        x = fill(prob, x, d)
    if do_shrink:
        x = shrink(prob, x, d)
    return x.astype(int), d, nfev
