"""The hierarchical solve of paper section 3.4, nested for large clusters, with a deadline.

Random groups act as single jobs (summed rates, mean processing time) to share the
capacity, then each group's models are solved within their share. The paper's G = 10
keeps every relaxed (COBYLA) solve small up to ~100 models; at 1,000 models its groups
hold 100 models each and one such solve takes seconds (COBYLA's cost grows about
cubically with its variables). So a group of more than ``ClusterSpec.group_max`` models
is itself solved hierarchically, in sub-groups of about 10 (ours, issue 36): the number of
groups grows with the model count while every COBYLA stays at ~10 variables.

:class:`Deadline`: once ``ClusterSpec.plan_deadline_s`` has passed, the remaining relaxed
solves are skipped (their integer starts only); the allocation's ``fallback`` says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ..config import ClusterSpec
from ..resources import CPU, MEMORY, Capacity
from .integer import balance, fill, polish, shrink
from .pipeline_problem import PipelineProblem
from .problem import JobInput, Problem, build_problem
from .solver import solve

BRANCH = 10  # sub-groups of a nested group: the paper's G (section 3.4)


@dataclass
class Deadline:
    """The planner's time budget (``ClusterSpec.plan_deadline_s``; None: no deadline) and
    what it cut: relaxed (COBYLA) solves stopped at it or skipped after it.

    Only COBYLA is cut: the integer steps (starts, fill, polish, shrink) cost O(models)
    each and decide the plan's quality at scale (under 1 s at 1,000 models here)."""

    budget_s: float | None
    start: float = field(default_factory=time.perf_counter)
    solves: int = 0
    skipped: int = 0
    stopped: int = 0

    def left(self) -> float | None:
        """Seconds left (>= 0), None without a deadline."""
        if self.budget_s is None:
            return None
        return max(0.0, self.budget_s - (time.perf_counter() - self.start))

    @property
    def passed(self) -> bool:
        left = self.left()
        return left is not None and left <= 0.0

    def solve(self, prob: Problem, backend: str) -> tuple[np.ndarray, np.ndarray, int]:
        """:func:`solver.solve` (no shrink) within the time left: COBYLA stops at the
        deadline and is skipped once it has passed."""
        left = self.left()
        self.solves += 1
        if left is not None and left <= 0.0:
            self.skipped += 1
        out = solve(prob, do_shrink=False, backend=backend, maxtime=left)
        if left is not None and left > 0.0 and self.passed:
            self.stopped += 1
        return out

    def note(self) -> str | None:
        """What the deadline cut, for ``Allocation.fallback``; None when it cut nothing."""
        if not (self.skipped or self.stopped):
            return None
        took = time.perf_counter() - self.start
        parts = []
        if self.stopped:
            parts.append(f"{self.stopped} relaxed solve(s) ran into it")
        if self.skipped:
            parts.append(f"{self.skipped} of {self.solves} relaxed solve(s) skipped (integer starts only)")
        return f"deadline {self.budget_s:g} s passed ({took:.2f} s so far): " + "; ".join(parts)


def extra_caps(jobs: list[JobInput], cap: Capacity) -> dict[str, float]:
    """The caps on the GPUs and custom resources the jobs need (infinite: not binding)."""
    return {r: cap[r] for j in jobs for r in j.extra}


def make(jobs: list[JobInput], cluster: ClusterSpec, cap: Capacity, gamma: float) -> Problem:
    return build_problem(
        jobs,
        cap_cpus=cap.cpus,
        cap_mem=cap.memory_gb,
        kind=cluster.objective,
        gamma=gamma,
        alpha=cluster.alpha,
        rho_max=cluster.rho_max,
        estimator=cluster.estimator,
        window_s=cluster.window_s,
        cold_start_s=cluster.cold_start_s,
        fair_tiebreak=cluster.fair_tiebreak,
        extra_caps=extra_caps(jobs, cap),
    )


def group_job(members: list[JobInput], k: int) -> JobInput:
    """A group as one job (paper 3.4): summed rates, mean processing time.

    Resources per replica are averaged weighted by minimum replicas, so the group's minimum
    needs exactly what its members' minimums need. The group does not batch (members'
    batching is weighed in their own solve and the cross-group pass). Its
    replicas serve the least concurrency ``k`` of its members; a member of concurrency
    ``k_m`` counts ``p k / k_m`` per request, so its replicas keep their throughput.
    """
    shapes = {m.rates.shape for m in members}
    n_s = max(s[0] for s in shapes)
    n_t = max(s[1] for s in shapes)
    try:
        rates = sum(np.broadcast_to(m.rates, (n_s, n_t)) for m in members)
    except ValueError:
        raise ValueError(f"grouped models need forecasts of compatible shapes (got {sorted(shapes)})") from None
    mins = np.array([m.min_replicas for m in members], float)
    conc = min(m.concurrency for m in members)
    extras = {r for m in members for r in m.extra}
    return JobInput(
        name=f"group{k}",
        rates=np.array(rates),
        proc_s=float(np.mean([m.proc_s * conc / m.concurrency for m in members])),
        slo_s=float(np.mean([m.slo_s for m in members])),
        quantile=max(m.quantile for m in members),
        priority=float(sum(m.priority for m in members)),
        cpus=float(mins @ [m.cpus for m in members] / mins.sum()),
        memory_gb=float(mins @ [m.memory_gb for m in members] / mins.sum()),
        min_replicas=int(mins.sum()),
        max_replicas=sum(m.max_replicas for m in members),
        current=sum(m.current for m in members),
        can_drop=any(m.can_drop for m in members),
        concurrency=conc,
        extra={r: float(mins @ [m.extra.get(r, 0.0) for m in members] / mins.sum()) for r in sorted(extras)},
    )


def group_budgets(top: Problem, gx: np.ndarray) -> np.ndarray:
    """Each group's budget of every binding resource (groups x ``top.resource_names``): the
    whole capacity, shared in proportion to the group-level allocation's CPUs.

    A group solved as one pooled queue needs fewer replicas than its members' separate
    queues do, so handing out only the group-level counts would starve members while
    capacity sits idle. Budgets never fall below a group's minimums; each member solve then
    shrinks to what its models need.
    """
    min_cpu = top.lo * top.cpus
    want_cpu = gx * top.cpus
    share = (want_cpu - min_cpu) / max((want_cpu - min_cpu).sum(), 1e-12)
    mins = top.lo[:, None] * top.need
    return cast(np.ndarray, mins + np.maximum(top.caps - mins.sum(axis=0), 0.0)[None, :] * share[:, None])


def random_groups(n: int, n_groups: int, rng: np.random.Generator) -> list[list[int]]:
    """The paper's random groups (section 3.4) of jobs ``0..n-1``: ``n_groups`` of them,
    sizes within one, each sorted. :func:`model_groups` gives a cluster's own."""
    order = rng.permutation(n)
    return [sorted(order[k::n_groups].tolist()) for k in range(n_groups)]


def model_groups(n: int, cluster: ClusterSpec) -> list[list[int]]:
    """The top-level groups the planner solves ``n`` models (jobs) in, in model order:
    what :func:`solve_grouped` draws first (one group below ``ClusterSpec.groups``' 50).
    A re-plan that plans only some groups (``ClusterSpec.replan_scope``) reads them here."""
    g = cluster.resolved_groups(n)
    if g <= 1:
        return [list(range(n))]
    return random_groups(n, g, np.random.default_rng(cluster.seed))


def solve_grouped(
    full: Problem,
    n_groups: int,
    cluster: ClusterSpec,
    cap: Capacity,
    deadline: Deadline,
    jobs: list[JobInput] | None = None,
    outer: bool = True,
) -> tuple[np.ndarray, np.ndarray, int, list[int]]:
    """The hierarchical solve (paper section 3.4), then one pass over the whole cluster.

    Random groups are solved as single jobs to share the capacity, then each group's
    models within its share (a group above ``cluster.group_max`` models: recursively, in
    at most :data:`BRANCH` sub-groups). The shares are fixed before any group is solved,
    so a group whose pooled queue under-states its members' needs can starve a model while
    another group leaves capacity idle. The cross-group pass therefore runs the ungrouped
    path's integer machinery on all models at once: leftover capacity goes to the largest
    gain in the cluster objective, replicas move between models of different groups while
    that gains, and only then (``outer``) does shrink right-size. Each step costs
    O(models), so grouping keeps its speed-up over solving all models in one COBYLA.
    ``jobs``: the models as given (``full.jobs`` have their ceilings applied). Returns
    ``(x, d, evaluations, group sizes)``.
    """
    jobs = full.jobs if jobs is None else jobs
    n = len(jobs)
    rng = np.random.default_rng(cluster.seed)
    nested = not isinstance(full, PipelineProblem)
    if isinstance(full, PipelineProblem):  # a pipeline's stages stay in one group
        groups = full.unit_groups(n_groups, rng)
        n_groups = len(groups)
    else:
        groups = random_groups(n, n_groups, rng)
    gamma = float(n_groups) if cluster.gamma is None else cluster.gamma
    top = make([group_job([jobs[i] for i in g], k) for k, g in enumerate(groups)], cluster, cap, gamma)
    gx, _, evals = deadline.solve(top, cluster.solver)
    budgets = group_budgets(top, gx.astype(float))
    x = np.zeros(n)
    d = np.zeros(n)
    for k, g in enumerate(groups):
        b = dict(zip(top.resource_names, budgets[k].tolist()))
        sub = full.subset(
            g,
            b[CPU],
            b.get(MEMORY),
            float(len(g)) if cluster.gamma is None else cluster.gamma,
            extra_caps={r: v for r, v in b.items() if r not in (CPU, MEMORY)},
        )
        if nested and len(g) > cluster.group_max:
            xg, dg, ev, _ = solve_grouped(
                sub, min(BRANCH, math.ceil(len(g) / BRANCH)), cluster, Capacity.from_mapping(b), deadline, outer=False
            )
        else:
            xg, dg, ev = deadline.solve(sub, cluster.solver)
        evals += ev
        x[g] = xg
        d[g] = dg
    x = balance(full, polish(full, fill(full, balance(full, x, d), d), d, max_moves=4 * n), d)
    if outer and cluster.shrink:
        x = shrink(full, x, d)
    return x.astype(int), d, evals, [len(g) for g in groups]
