"""Pipelines in the matched simulator (issue 35): queries that visit a DAG of stages.

A pipeline (:class:`~faro_serve.pipelines.PipelineSLO`) gets its queries at its entry (one
row of the trace counts, drawn as a model's requests are: Poisson per minute, uniform
instants). Each stage is a model of the cluster with its own router queue and replicas,
simulated by the very same :class:`~faro_serve.sim.model_state.ModelState` and numba kernel as a
single model (cold start, queue limit, drop rate, processing time per stage); the policy
scales it like any model. What is added is how a query moves between the stages:

* when its minute starts a query draws, per stage, whether it visits it (a stage is visited
  with probability ``fraction / fraction of its first parent of largest fraction``, by a
  query that visits that parent: so ``fraction`` of the queries visit it), its processing
  time, router overhead and drop draw, from its pipeline's own seeded stream. A run is
  deterministic per seed and does not depend on where the driver cuts time;
* an entry stage gets the query at its arrival; another stage gets it when every parent
  the query visits is done with it (the latest completion: a join waits for all of its
  branches; fan-out children start together when their parent finishes);
* the query is done when every stage it visits is; its end-to-end latency is that instant
  minus its arrival at the entry. A query dropped or refused at any stage (tail drop, the
  drop rate in force, a client timeout) is dropped end to end: it visits no further stage
  (what is already queued on a sibling branch is still served, for nobody).

Between two instants of the driver the stages are advanced in topological order: a parent
first, then the children get the parent's completions that fall before the end of the
interval as their arrivals and are advanced over the same interval. This is exact, not an
approximation of the step: a request's completion is fixed when it starts (the kernel
serves FIFO and the replicas' work is never revised), every request that starts before the
interval's end has started when the parent's call returns, and one that starts later also
completes later. So no child arrival of ``[t0, t1)`` is unknown when the child runs, and
cutting time finer gives the same requests the same latencies (tests/test_sim_pipelines.py
checks it against a 1 s step).

One pipeline's queries in flight and its stages' states are in ``pipeline_run``; here is what
the runner asks of every pipeline (:class:`PipelineSet`), the stages' processing times and
the check of their models; the stages' own rows are summarised in ``sim_result``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from faro_serve.config import ModelSLO
from faro_serve.pipelines import PipelineSLO

from ..distributions import PAPER_PROCESSING, TimeDist
from .pipeline_run import PipelineRun, StageState
from .rates import TickRates


def stage_processing(
    pipelines: Sequence[PipelineSLO], base: TimeDist | None = None, given: Mapping[str, TimeDist] | None = None
) -> dict[str, TimeDist]:
    """Each stage's simulated processing time: ``given[stage]`` when there, else ``base``
    (default: the paper's lognormal) scaled to the stage's ``processing_ms`` (as a scenario
    scales it for its models), else ``base`` as it is."""
    base = base or PAPER_PROCESSING
    out = {}
    for p in pipelines:
        for m in p.stage_models():
            if given and m.name in given:
                out[m.name] = given[m.name]
            elif m.processing_ms is not None:
                out[m.name] = base.scaled_to_mean(m.processing_ms / 1e3)
            else:
                out[m.name] = base
    return out


def check_pipelines(models: Sequence[ModelSLO], pipelines: Sequence[PipelineSLO]) -> list[ModelSLO]:
    """The stage models of ``pipelines`` (ValueError on a name clash with ``models`` or
    between pipelines)."""
    from faro_serve.pipelines import check_unique, expand

    check_unique(pipelines)
    return expand(models, pipelines)[len(models) :]


class PipelineSet:
    """Every pipeline of a run: their stage states (also models of the runner, which scales
    them and builds their observations as a model's) and what the runner asks of them."""

    def __init__(
        self,
        pipelines: Sequence[PipelineSLO],
        stage_states: Mapping[str, StageState],
        processing: Mapping[str, TimeDist],
        overhead: TimeDist,
        seed: int,
        draw: int,
        counts: np.ndarray,
        warm: np.ndarray,
    ):
        """``counts`` and ``warm``: the pipelines' rows (queries at the entry per minute,
        realised; the warm-up history)."""
        self.pipelines = list(pipelines)
        self.states = dict(stage_states)
        n_min = counts.shape[1]
        self.runs = [
            PipelineRun(p, k, stage_states, processing, overhead, seed, draw, n_min)
            for k, p in enumerate(self.pipelines)
        ]
        self.counts, self.warm = counts, warm
        self.rates = TickRates()  # the live meters' arrival-rate window
        self.of_stage = {n: (k, r.col[n]) for k, r in enumerate(self.runs) for n in r.order}
        self.slo_s = np.array([p.slo_ms / 1e3 for p in self.pipelines])
        self.pct = np.array([p.percentile for p in self.pipelines])

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.pipelines]

    def load(self, k: int, arrival: np.ndarray) -> None:
        self.runs[k].load(arrival)

    def run(self, t0: float, t1: float) -> None:
        for r in self.runs:
            r.run(t0, t1)

    def settled_until_minute(self) -> int:
        for r in self.runs:
            r.settle()
        return min(r.settled_until_minute() for r in self.runs)

    # -- what the policy observes ---------------------------------------------------------
    def stage_history(self, name: str, minute_now: int) -> np.ndarray:
        """A stage's arrivals per completed minute: the warm-up's entry counts x its
        fraction (no stage was measured then), then what reached it."""
        k, j = self.of_stage[name]
        fr = self.pipelines[k].stage(name).fraction
        return np.concatenate([self.warm[k] * fr, self.runs[k].stage_counts[j, :minute_now]])

    def future(self, minute_now: int, n: int) -> dict[str, np.ndarray]:
        """The oracle's counts of the coming minutes: each pipeline's, and each stage's
        (the pipeline's x the stage's fraction)."""
        out = {}
        for k, p in enumerate(self.pipelines):
            f = self.counts[k, minute_now : minute_now + n].astype(float)
            out[p.name] = f
            for s in p.stages:
                out[s.name] = f * s.fraction
        return out

    def observations(self, now: float, dt: float, minute_now: int, look_back_s: float) -> dict:
        from autoscaler.contract.policy import PipelineObservation

        out = {}
        for k, (p, r) in enumerate(zip(self.pipelines, self.runs)):
            lat = r.observe(now, look_back_s, p.percentile)
            n = r.end_tick()
            out[p.name] = PipelineObservation(
                name=p.name,
                arrivals_per_min=np.concatenate([self.warm[k], self.counts[k, :minute_now]]).astype(float),
                arrival_rate=self.rates.rate(p.name, dt, n),
                latency_ms=None if math.isnan(lat) else lat * 1e3,
            )
        return out

    # -- metrics -------------------------------------------------------------------------
    def take_settled(self, upto_minute: int):
        """Per pipeline (arrival, end-to-end latency, dropped) of its queries before
        ``upto_minute``, and per stage (arrival, latency, dropped) of its requests."""
        e2e = [r.take_settled(upto_minute) for r in self.runs]
        stages = [self.states[n].take_settled(upto_minute) for r in self.runs for n in r.order]
        return e2e, stages

    @property
    def stage_names(self) -> list[str]:
        return [n for r in self.runs for n in r.order]
