"""``plan(...)``: the one entry point of the Faro decision engine (paper sections 3-4).

The live autoscaler and the simulator both call exactly this. It turns SLOs, forecasts
(samples x window steps of request rates) and the current replicas into an
:class:`Allocation`: per-model replicas and drop rates, with predicted latency and utility.
With ``G > 1`` groups it solves the hierarchical problem of section 3.4 (hierarchy.py):
random groups act as single jobs (summed rates, mean processing time), then each group's
share is split among its models by the same solver; large groups nest. A plan past
``ClusterSpec.plan_deadline_s`` falls back to cheaper steps and says so (``fallback``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from ..config import ClusterSpec, ModelSLO, check_minimums_fit
from ..pipelines import PipelineSLO
from ..resources import CPU, MEMORY, Capacity, demand, usage
from .batched_latency import latency_batched
from .hierarchy import Deadline, make, solve_grouped
from .latency import ESTIMATORS
from .pipeline_plan import PipelineDecision, entry_drops, pipeline_decisions, pipeline_problem, stage_forecasts, units
from .pipeline_problem import PipelineProblem
from .problem import JobInput, Problem
from .solver import solve
from .utility import PENALTY_OBJECTIVES, cluster_objective, phi

# per model, by name or in model order (forecasts, current replicas, processing times, batch shapes)
PerModel: TypeAlias = "Mapping[str, Any] | Iterable[Any]"


@dataclass
class ModelDecision:
    name: str
    replicas: int
    current: int
    drop_rate: float
    utility: float  # predicted window utility (relaxed, cold start included)
    effective_utility: float  # phi(d) * utility
    latency_ms: float  # estimated percentile latency at the window's mean forecast rate
    arrival_rate: float  # window mean forecast, requests/s
    processing_ms: float
    slo_ms: float
    batch_size: int = 1  # the largest batch a replica should take (1: the model does not batch)
    pipeline: str | None = None  # the pipeline this model is a stage of (utility: the pipeline's)


@dataclass
class Allocation:
    objective: str
    objective_value: float
    decisions: list[ModelDecision]
    solve_ms: float
    groups: int
    evaluations: int
    cpus_used: float
    memory_used_gb: float
    notes: list[str] = field(default_factory=list)
    # what the deadline (ClusterSpec.plan_deadline_s) cut short; None: the plan is complete
    fallback: str | None = None
    # one per pipeline planned end to end (pipeline_plan.PipelineDecision); none without
    pipelines: list[PipelineDecision] = field(default_factory=list)

    @property
    def replicas(self) -> dict[str, int]:
        return {d.name: d.replicas for d in self.decisions}

    @property
    def drop_rates(self) -> dict[str, float]:
        return {d.name: d.drop_rate for d in self.decisions}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for d in out["decisions"]:
            if not np.isfinite(d["latency_ms"]):
                d["latency_ms"] = None  # JSON has no infinity
        return out


def normalise_rates(value: npt.ArrayLike, name: str) -> np.ndarray:
    """A forecast as a (samples, steps) array of non-negative requests/s.

    Accepts a number (constant rate), a 1-D sequence (samples of a rate constant over the
    window) or a 2-D (samples x steps) array.
    """
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 0:
        arr = arr.reshape(1, 1)
    elif arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    elif arr.ndim != 2:
        raise ValueError(
            f"forecast for {name!r} must be a number, a list of samples or a "
            f"samples x steps array, got {arr.ndim} dimensions"
        )
    if arr.size == 0:
        raise ValueError(f"forecast for {name!r} is empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"forecast for {name!r} contains NaN or infinity")
    if np.any(arr < 0):
        raise ValueError(f"forecast for {name!r} contains negative rates")
    return arr


def _lookup(mapping: PerModel | None, models: Sequence[ModelSLO], what: str, default: Any = None) -> list[Any]:
    if mapping is None:
        return [default] * len(models)
    if isinstance(mapping, Mapping):
        unknown = set(mapping) - {m.name for m in models}
        if unknown:
            raise ValueError(f"{what} names unknown models: {', '.join(sorted(unknown))}")
        return [mapping.get(m.name, default) for m in models]
    seq = list(mapping)
    if len(seq) != len(models):
        raise ValueError(f"{what} has {len(seq)} entries for {len(models)} models")
    return seq


def _jobs(
    models: Sequence[ModelSLO],
    forecasts: PerModel,
    current: PerModel | None,
    processing_ms: PerModel | None,
    cluster: ClusterSpec,
    batch_shapes: PerModel | None = None,
) -> list[JobInput]:
    fc = _lookup(forecasts, models, "forecasts")
    cur = _lookup(current, models, "current_replicas")
    proc = _lookup(processing_ms, models, "processing_ms")
    shapes = _lookup(batch_shapes, models, "batch_shapes")
    jobs = []
    for m, f, c, p, shape in zip(models, fc, cur, proc, shapes):
        if f is None:
            raise ValueError(f"no forecast for model {m.name!r}")
        p_ms = p if p is not None else m.processing_ms
        if p_ms is None or not np.isfinite(p_ms) or p_ms <= 0:
            raise ValueError(
                f"model {m.name!r} has no processing time: set processing_ms in its SLO or pass a measured value"
            )
        c = m.min_replicas if c is None else int(c)
        if c < 0:
            raise ValueError(f"current replicas of {m.name!r} is negative ({c})")
        bt = m.batching  # a curve passed for a model that does not batch is not used
        if bt is not None:
            shape = bt.shape(m.cpus) if shape is None else shape
            if len(shape) < bt.max_batch_size + 1:
                raise ValueError(
                    f"the batch curve of {m.name!r} stops at batch {len(shape) - 1}, "
                    f"below its max_batch_size {bt.max_batch_size}"
                )
        rates = normalise_rates(f, m.name)
        jobs.append(
            JobInput(
                name=m.name,
                rates=rates,
                proc_s=p_ms / 1e3,
                slo_s=m.slo_ms / 1e3,
                quantile=m.percentile / 100.0,
                priority=m.priority,
                cpus=m.cpus,
                memory_gb=m.memory_gb,
                min_replicas=m.min_replicas,
                max_replicas=m.max_replicas,
                # no traffic forecast, nothing to drop (COBYLA would leave
                # the flat drop variable wherever its steps took it)
                current=c,
                can_drop=m.allow_drop and bool(np.any(rates > 0)),
                batch_shape=None if bt is None else np.asarray(shape, float),
                max_batch=1 if bt is None else bt.max_batch_size,
                concurrency=m.concurrency,
                extra={r: a for r, a in demand(m).items() if r not in (CPU, MEMORY)},
            )
        )
    return jobs


def make_problem(
    models: Sequence[ModelSLO],
    forecasts: PerModel,
    current_replicas: PerModel | None,
    cluster: ClusterSpec,
    *,
    processing_ms: PerModel | None = None,
    capacity: Capacity | None = None,
    pipelines: Sequence[PipelineSLO] = (),
    batch_shapes: PerModel | None = None,
) -> Problem:
    """The un-grouped :class:`Problem` ``plan`` optimises (for tests, benchmarks, analysis);
    ``capacity``: what is available now, capped by the configured one (as in ``plan``)."""
    models = list(models)
    pipelines = list(pipelines)
    if pipelines:
        forecasts = stage_forecasts(models, forecasts, pipelines)
    jobs = _jobs(models, forecasts, current_replicas, processing_ms, cluster, batch_shapes)
    cap = Capacity.of_cluster(cluster)
    if capacity is not None:
        cap = cap.capped_by(capacity)
    if not pipelines:
        return make(jobs, cluster, cap, cluster.resolved_gamma(len(jobs)))
    prob = make(entry_drops(jobs, pipelines), cluster, cap, cluster.resolved_gamma(units(models, pipelines)))
    return pipeline_problem(
        prob,
        pipelines,
        alpha=cluster.alpha,
        rho_max=cluster.rho_max,
        estimator=cluster.estimator,
        window_s=cluster.window_s,
        cold_start_s=cluster.cold_start_s,
    )


def plan(
    models: Sequence[ModelSLO],
    forecasts: PerModel,
    current_replicas: PerModel | None,
    cluster: ClusterSpec,
    *,
    processing_ms: PerModel | None = None,
    capacity_cpus: float | None = None,
    capacity_memory_gb: float | None = None,
    capacity: Capacity | None = None,
    pipelines: Sequence[PipelineSLO] = (),
    batch_shapes: PerModel | None = None,
) -> Allocation:
    """Decide every model's replicas and drop rate for the next window.

    ``forecasts``: per model (mapping by name, or a sequence in model order) a rate in
    requests/s, a list of samples, or a samples x steps array over the window.
    ``current_replicas``: per model (mapping or sequence; missing = min replicas).
    ``processing_ms``: measured per-request processing times overriding the SLO priors.
    ``capacity`` (every resource) or ``capacity_cpus``/``capacity_memory_gb``: the capacity
    available now (e.g. from the Ray cluster), capped by the configured one. Raises
    ValueError on inconsistent input.
    ``pipelines`` (:class:`~faro_serve.pipelines.PipelineSLO`, their stages among ``models``):
    each is one job of the objective, planned end to end (pipeline_plan.py); ``forecasts``
    may then give a pipeline's entry rates under its name (a stage's: entry x fraction).
    ``batch_shapes``: per batching model, a measured batch curve's shape ``f(b)`` for b =
    0..its max_batch_size, overriding its config's (``autoscaler/policies/service.py``).
    """
    t0 = time.perf_counter()
    models = list(models)
    if not models:
        raise ValueError("plan needs at least one model")
    cap = Capacity.of_cluster(cluster).capped_by(Capacity.of(capacity_cpus, capacity_memory_gb))
    if capacity is not None:
        cap = cap.capped_by(capacity)
    check_minimums_fit(models, cap)
    pipelines = list(pipelines)
    if pipelines:
        forecasts = stage_forecasts(models, forecasts, pipelines)
    jobs = _jobs(models, forecasts, current_replicas, processing_ms, cluster, batch_shapes)
    n = len(jobs)
    n_groups = cluster.resolved_groups(n)
    gamma = cluster.resolved_gamma(n)
    if pipelines:
        jobs = entry_drops(jobs, pipelines)
        gamma = cluster.resolved_gamma(units(models, pipelines))

    def problem() -> Problem:
        prob = make(jobs, cluster, cap, gamma)
        if not pipelines:
            return prob
        return pipeline_problem(
            prob,
            pipelines,
            alpha=cluster.alpha,
            rho_max=cluster.rho_max,
            estimator=cluster.estimator,
            window_s=cluster.window_s,
            cold_start_s=cluster.cold_start_s,
        )

    notes: list[str] = []
    evals = 0
    deadline = Deadline(cluster.plan_deadline_s, start=t0)
    if n_groups <= 1:
        prob = problem()
        left = deadline.left()
        x, d, evals = solve(prob, do_shrink=cluster.shrink, backend=cluster.solver, maxtime=left)
        deadline.solves, deadline.skipped = 1, int(left == 0.0)
        deadline.stopped = int(bool(left) and deadline.passed)
        probs = [(prob, list(range(n)), x, d)]
    else:
        full = problem()
        x, d, evals, sizes = solve_grouped(full, n_groups, cluster, cap, deadline, jobs)
        probs = [(full, list(range(n)), x, d)]
        notes.append(
            f"hierarchical: {n_groups} groups of {min(sizes)}-{max(sizes)} models"
            + (
                f" (groups above {cluster.group_max} nested)"
                if max(sizes) > cluster.group_max and not pipelines
                else ""
            )
        )
    fallback = deadline.note()
    if fallback:
        notes.append(fallback)
    reps = np.zeros(n, dtype=int)
    drops = np.zeros(n)
    utils = np.zeros(n)
    batches = np.ones(n, dtype=int)
    for prob, idx, x, d in probs:
        reps[idx] = x
        drops[idx] = d
        utils[idx] = prob.utilities(x.astype(float), d)
        batches[idx] = prob.batch_sizes(x, d)
    cpus_used = float(sum(reps[i] * jobs[i].cpus for i in range(n)))
    mem_used = float(sum(reps[i] * jobs[i].memory_gb for i in range(n)))
    used = usage({m.name: int(r) for m, r in zip(models, reps)}, {m.name: demand(m) for m in models})
    if not cap.fits(used):
        raise AssertionError(f"planner produced an allocation above capacity: {cap.over(used)}")
    eu = phi(drops) * utils
    value = cluster_objective(
        cluster.objective,
        eu if cluster.objective in PENALTY_OBJECTIVES else utils,
        np.array([j.priority for j in jobs]),
        gamma,
        cluster.fair_tiebreak,
    )
    pipe_decisions = []
    if pipelines:
        prob = probs[0][0]
        assert isinstance(prob, PipelineProblem)  # pipelines are planned in one problem
        value = prob.value(reps.astype(float), drops)  # each pipeline counted once
        pipe_decisions = pipeline_decisions(prob, reps, drops, pipelines)
        for pd in pipe_decisions:  # a stage's effective utility is its pipeline's
            for sname in pd.stages:
                eu[[j.name for j in jobs].index(sname)] = pd.effective_utility
    stage_of = {sn: p.name for p in pipelines for sn in p.stage_names}
    est = ESTIMATORS[cluster.estimator]
    decisions = []
    for i, j in enumerate(jobs):
        lam = float(j.rates.mean()) * (1.0 - drops[i])
        servers = int(reps[i]) * j.concurrency
        lat = latency_batched(servers, lam, j.proc_s, j.quantile, cluster.rho_max, est, j.batch_shape, int(batches[i]))
        decisions.append(
            ModelDecision(
                name=j.name,
                replicas=int(reps[i]),
                current=int(j.current),
                drop_rate=round(float(drops[i]), 4),
                utility=float(utils[i]),
                effective_utility=float(eu[i]),
                latency_ms=float(lat) * 1e3,
                arrival_rate=float(j.rates.mean()),
                processing_ms=j.proc_s * 1e3,
                slo_ms=j.slo_s * 1e3,
                batch_size=int(batches[i]),
                pipeline=stage_of.get(j.name),
            )
        )
    return Allocation(
        objective=cluster.objective,
        objective_value=float(value),
        decisions=decisions,
        solve_ms=(time.perf_counter() - t0) * 1e3,
        groups=n_groups,
        evaluations=evals,
        cpus_used=cpus_used,
        memory_used_gb=mem_used,
        notes=notes,
        fallback=fallback,
        pipelines=pipe_decisions,
    )
