"""The planner's pipeline glue (issue 35; docs/pipelines.md): stage forecasts from a
pipeline's entry forecast, drops at the entry, the :class:`PipelineProblem`, and what the
plan says about each pipeline (its end-to-end estimate and the SLO split it implies).

Pure numpy, no Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from ..model_slo import ModelSLO
from ..pipelines import PipelineSLO
from .latency import ESTIMATORS
from .pipeline_latency import path_matrix
from .pipeline_problem import PipelineProblem, with_pipelines
from .pipeline_term import build_term
from .problem import JobInput, Problem
from .window import NO_DROP, cold_start_fractions


class StageSplit(TypedDict):
    """A stage in a :class:`PipelineDecision`: replicas, estimated latency (ms; None: unstable)
    and its share of the end-to-end estimate."""

    replicas: int
    latency_ms: float | None
    share: float


@dataclass
class PipelineDecision:
    name: str
    slo_ms: float
    latency_ms: float  # end-to-end estimate from the stages' latencies averaged over the
    # forecast samples and steps (inf: a stage unstable)
    utility: float  # predicted window utility of the pipeline (one job of the objective)
    effective_utility: float
    drop_rate: float  # at the entry stage
    arrival_rate: float  # entry forecast, window mean, queries/s
    # per stage: replicas, estimated latency (ms) and its share of the end-to-end estimate
    stages: dict[str, StageSplit] = field(default_factory=dict)


def stage_forecasts(
    models: Sequence[ModelSLO], forecasts: Mapping[str, Any] | Iterable[Any], pipelines: Sequence[PipelineSLO]
) -> Mapping[str, Any] | Iterable[Any]:
    """``forecasts`` with every stage's rates = its pipeline's entry forecast x the stage's
    fraction, where the forecasts name the pipeline (a mapping); stages keep their own
    forecasts otherwise. The pipeline names are taken out (they are not models)."""
    if not isinstance(forecasts, Mapping):
        return forecasts
    out = dict(forecasts)
    for p in pipelines:
        if p.name not in out:
            continue
        entry = np.asarray(out.pop(p.name), float)
        for s in p.stages:
            out[s.name] = entry * s.fraction
    return out


def entry_drops(jobs: list[JobInput], pipelines: Sequence[PipelineSLO]) -> list[JobInput]:
    """Only a pipeline's first entry stage may drop (its drop rate is the pipeline's)."""
    first = {p.entries[0] for p in pipelines}
    staged = {n for p in pipelines for n in p.stage_names}
    return [
        JobInput(**{**j.__dict__, "can_drop": j.can_drop and j.name in first}) if j.name in staged else j for j in jobs
    ]


def units(models: Sequence[ModelSLO], pipelines: Sequence[PipelineSLO]) -> int:
    """Jobs of the cluster objective: each single model and each pipeline once."""
    staged = {n for p in pipelines for n in p.stage_names}
    return sum(m.name not in staged for m in models) + len(pipelines)


def pipeline_problem(
    base: Problem,
    pipelines: Sequence[PipelineSLO],
    *,
    alpha: float,
    rho_max: float,
    estimator: str,
    window_s: float,
    cold_start_s: float,
) -> PipelineProblem:
    """``base`` (every model's variable, stages included) with each pipeline one job."""
    pos = {j.name: i for i, j in enumerate(base.jobs)}
    terms = []
    for p in pipelines:
        names = p.stage_names
        idx = [pos[n] for n in names]
        sj = [base.jobs[i] for i in idx]
        local = {n: k for k, n in enumerate(names)}
        paths = path_matrix([[local[n] for n in path] for path in p.paths()], len(names))
        drop_var = pos[p.entries[0]]
        grid = base.drop_grid if base.can_drop[drop_var] else NO_DROP
        frac = cold_start_fractions(sj[0].rates.shape[1], window_s, cold_start_s)
        terms.append(
            build_term(
                p.name,
                sj,
                idx,
                paths,
                p.slo_ms / 1e3,
                p.priority,
                alpha,
                rho_max,
                ESTIMATORS[estimator],
                frac,
                grid,
                drop_var,
                [j.max_replicas for j in sj],
            )
        )
    return with_pipelines(base, terms)


def pipeline_decisions(
    prob: PipelineProblem, x: np.ndarray, d: np.ndarray, pipelines: Sequence[PipelineSLO]
) -> list[PipelineDecision]:
    out = []
    xf = np.asarray(x, float)
    eu = prob.job_values(xf, d) if prob.penalty else None
    u = prob.utilities(xf, d)
    for t, p in zip(prob.terms, pipelines):
        dd = float(d[t.drop_var])
        lat, share = t.split(xf[t.idx], dd)
        e2e = float((t.paths @ np.where(np.isfinite(lat), lat, np.inf)).max())
        i0 = int(t.idx[0])
        stages: dict[str, StageSplit] = {
            n: {
                "replicas": int(x[i]),
                "latency_ms": round(float(lat[k]) * 1e3, 3) if np.isfinite(lat[k]) else None,
                "share": round(float(share[k]), 4),
            }
            for k, (n, i) in enumerate(zip(p.stage_names, t.idx))
        }
        out.append(
            PipelineDecision(
                name=p.name,
                slo_ms=p.slo_ms,
                latency_ms=e2e * 1e3,
                utility=float(u[i0]),
                effective_utility=float(eu[i0] if eu is not None else u[i0]),
                drop_rate=round(dd, 4),
                arrival_rate=float(prob.jobs[t.drop_var].rates.mean() / p.stage(p.entries[0]).fraction),
                stages=stages,
            )
        )
    return out
