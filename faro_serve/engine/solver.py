"""Solve a :class:`~faro_serve.engine.problem.Problem` (paper sections 3.4, 4.2, 4.3).

1. COBYLA (scipy, initial step ``rhobeg`` 2) on the relaxed objective, one continuous
   replica variable per job plus a drop-rate variable per job that may drop under the
   penalty objectives, with the CPU and memory limits as linear constraints.
2. Post-processing into integers: floor, repair to capacity if needed, then hand out the
   leftover capacity one replica at a time to the job with the largest objective gain.
3. Polish (ours, beyond the paper): move single replicas between jobs while that raises the
   objective. It repairs the rare case where the relaxed optimum rounds to a poor integer
   point; it never makes the objective worse.
4. Drop rates snap to the best point of the tabulated grid for the integer replicas.
5. Shrink (section 4.3): jobs give back replicas one at a time while the cluster
   objective stays unchanged.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, minimize

from .problem import Problem

DROP_SCALE = 10.0  # drop-rate variables are scaled so COBYLA's rhobeg of 2 is a 0.2 step
TOL = 1e-9


def start_point(prob: Problem) -> np.ndarray:
    """Current replicas clipped to bounds, scaled toward the minimums until they fit."""
    x = np.clip(prob.current, prob.lo, prob.hi)
    if prob.fits(x):
        return x
    extra = x - prob.lo
    over_cpu = (prob.cpus @ x - prob.cap_cpus) / max(prob.cpus @ extra, TOL)
    over_mem = 0.0
    if np.isfinite(prob.cap_mem):
        over_mem = (prob.mem @ x - prob.cap_mem) / max(prob.mem @ extra, TOL)
    shrink = np.clip(1.0 - max(over_cpu, over_mem), 0.0, 1.0)
    return prob.lo + extra * shrink


def _linear_rows(prob: Problem, fx: np.ndarray, x0: np.ndarray, n_drop: int):
    """Capacity constraints ``A v <= b`` over the free replica variables (+ drop variables)."""
    free = np.zeros(prob.n, bool)
    free[fx] = True
    rows = [np.concatenate([prob.cpus[fx], np.zeros(n_drop)])]
    caps = [prob.cap_cpus - prob.cpus[~free] @ x0[~free]]
    if np.isfinite(prob.cap_mem):
        rows.append(np.concatenate([prob.mem[fx], np.zeros(n_drop)]))
        caps.append(prob.cap_mem - prob.mem[~free] @ x0[~free])
    return np.array(rows), np.array(caps)


def _cobyla_nlopt(fun, v0, lb, ub, a, b, rhobeg, maxeval):
    import nlopt

    best = [np.inf, v0.copy()]

    def obj(v, grad):
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
    try:
        opt.optimize(v0.copy())
    except (nlopt.RoundoffLimited, RuntimeError, ValueError):
        pass  # keep the best feasible point seen so far
    return best[1]


def _cobyla_scipy(fun, v0, lb, ub, a, b, rhobeg, maxeval):
    res = minimize(fun, v0, method="COBYLA", bounds=Bounds(lb, ub),
                   constraints=[LinearConstraint(a, -np.inf, b)],
                   options={"rhobeg": rhobeg, "tol": 0.02, "maxiter": maxeval})
    return np.asarray(res.x, float)


BACKENDS = {"nlopt": _cobyla_nlopt, "scipy": _cobyla_scipy}


def solve_relaxed(prob: Problem, rhobeg: float = 2.0, backend: str = "nlopt",
                  maxeval: int | None = None):
    """Continuous optimum of the relaxed objective with COBYLA. Returns ``(x, d, evaluations)``.

    ``backend`` "nlopt" runs Powell's COBYLA compiled (NLopt); "scipy" runs
    ``scipy.optimize.minimize(method="COBYLA")``, which from SciPy 1.16 is a pure-Python
    port (PRIMA) costing about 1 ms per iteration: same algorithm, ~20x slower here.
    """
    n = prob.n
    free = prob.hi > prob.lo
    drop_idx = np.flatnonzero(prob.can_drop)
    x0 = start_point(prob)
    if not free.any() and drop_idx.size == 0:
        return x0, np.zeros(n), 0
    fx = np.flatnonzero(free)
    count = [0]

    def unpack(v):
        x = x0.copy()
        x[fx] = v[: fx.size]
        dd = np.zeros(n)
        dd[drop_idx] = v[fx.size:] / DROP_SCALE
        return x, dd

    def neg_value(v):
        count[0] += 1
        x, dd = unpack(v)
        return -prob.value(x, dd)

    v0 = np.concatenate([x0[fx], np.zeros(drop_idx.size)])
    lb = np.concatenate([prob.lo[fx], np.zeros(drop_idx.size)])
    ub = np.concatenate([prob.hi[fx], np.full(drop_idx.size, DROP_SCALE)])
    a, b = _linear_rows(prob, fx, x0, drop_idx.size)
    budget = maxeval if maxeval is not None else 100 + 60 * v0.size
    v = BACKENDS[backend](neg_value, v0, lb, ub, a, b, rhobeg, budget)
    x, d = unpack(v)
    return np.clip(x, prob.lo, prob.hi), np.clip(d, 0.0, 1.0), count[0]


def repair(prob: Problem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Remove replicas (smallest objective loss first) until the allocation fits."""
    x = x.copy()
    while not prob.fits(x):
        best, best_val = -1, -np.inf
        for i in np.flatnonzero(x > prob.lo):
            x[i] -= 1
            v = prob.value(x, d)
            x[i] += 1
            if v > best_val:
                best, best_val = i, v
        if best < 0:
            raise ValueError("minimum replicas exceed the cluster capacity")
        x[best] -= 1
    return x


def fill(prob: Problem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Give leftover capacity, one replica at a time, to the largest objective gain.

    When no addition strictly gains (ties in max-min fairness terms), a replica still goes to
    the poorest job whose own utility it raises, if the objective does not drop: it cannot
    widen the spread and lets the next addition lift the minimum.
    """
    x = x.copy()
    cur = prob.value(x, d)
    while True:
        u = prob.utilities(x, d)
        u_up = prob.utilities(np.minimum(x + 1, prob.hi), d)
        best, best_val = -1, cur + TOL
        tie, tie_u = -1, np.inf
        for i in np.flatnonzero(x < prob.hi):
            x[i] += 1
            if prob.fits(x):
                v = prob.value(x, d)
                if v > best_val:
                    best, best_val = i, v
                elif v >= cur - 1e-12 and u_up[i] > u[i] + 1e-12 and u[i] < tie_u:
                    tie, tie_u = i, u[i]
            x[i] -= 1
        if best < 0 and tie < 0:
            return x
        if best < 0:
            best, best_val = tie, None
        x[best] += 1
        cur = prob.value(x, d) if best_val is None else best_val


def water_fill(prob: Problem, d: np.ndarray) -> np.ndarray:
    """Max-min start: from the minimums, always lift the poorest job that can still gain."""
    x = prob.lo.copy()
    while True:
        u = prob.utilities(x, d)
        up = x + 1
        gain = prob.utilities(np.minimum(up, prob.hi), d) - u
        order = np.argsort(u, kind="stable")
        for i in order:
            if x[i] >= prob.hi[i] or gain[i] <= 1e-12:
                continue
            x[i] += 1
            if prob.fits(x):
                break
            x[i] -= 1
        else:
            return x


def polish(prob: Problem, x: np.ndarray, d: np.ndarray, max_moves: int = 64) -> np.ndarray:
    """Move single replicas between jobs while the objective strictly improves."""
    x = x.copy()
    cur = prob.value(x, d)
    for _ in range(max_moves):
        best, best_val = None, cur + TOL
        for i in np.flatnonzero(x > prob.lo):
            x[i] -= 1
            for j in np.flatnonzero(x < prob.hi):
                if j == i:
                    continue
                x[j] += 1
                if prob.fits(x):
                    v = prob.value(x, d)
                    if v > best_val:
                        best, best_val = (i, j), v
                x[j] -= 1
            x[i] += 1
        if best is None:
            break
        x[best[0]] -= 1
        x[best[1]] += 1
        cur = best_val
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
                v = prob.value(x, d)
                if v > cur + TOL:
                    cur, keep, changed = v, g, True
            d[i] = keep
        if not changed:
            break
    return d


def shrink(prob: Problem, x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Paper section 4.3: right-size jobs, giving back replicas one at a time.

    A replica is removed only while the cluster objective stays unchanged (the paper's "until
    the cluster utility changes"): under the fairness objectives a removal that *raises* the
    objective would be levelling a satisfied job down, which is not what shrinking is for.
    Jobs at predicted utility 1 go first, as in the paper; then (ours) jobs below 1 whose
    extra replicas change nothing in the window, e.g. because the cold start, not the
    replica count, caps their utility.
    """
    x = x.copy()
    cur = prob.value(x, d)
    u = prob.utilities(x, d)
    full = [i for i in sorted(range(prob.n), key=lambda k: -x[k]) if u[i] >= 1.0 - 1e-9]
    rest = [i for i in sorted(range(prob.n), key=lambda k: -x[k]) if u[i] < 1.0 - 1e-9]
    for i in full + rest:
        while x[i] > prob.lo[i]:
            x[i] -= 1
            v = prob.value(x, d)
            if abs(v - cur) <= 1e-12 * max(1.0, abs(cur)):
                cur = v
            else:
                x[i] += 1
                break
    return x


def solve(prob: Problem, *, do_shrink: bool = True, do_polish: bool = True,
          rhobeg: float = 2.0, backend: str = "nlopt") -> tuple[np.ndarray, np.ndarray, int]:
    """Integer replicas and drop rates for ``prob``. Returns ``(x, d, evaluations)``."""
    xc, dc, nfev = solve_relaxed(prob, rhobeg=rhobeg, backend=backend)
    d = np.where(prob.can_drop, dc, 0.0)
    rounded = fill(prob, repair(prob, np.clip(np.floor(xc + 1e-6), prob.lo, prob.hi), d), d)
    # Rounding a relaxed optimum can land far from the integer optimum when the objective
    # has max-min terms; two cheap integer starts guard against that and the best wins.
    candidates = [rounded, fill(prob, prob.lo.copy(), d), fill(prob, water_fill(prob, d), d)]
    x = max(candidates, key=lambda c: prob.value(c, d))
    if do_polish and prob.n > 1:
        x = polish(prob, x, d)
    if prob.penalty:
        d = tune_drops(prob, x, d)
        x = fill(prob, x, d)
    if do_shrink:
        x = shrink(prob, x, d)
    return x.astype(int), d, nfev
