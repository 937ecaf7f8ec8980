"""Faro over pipelines (issue 35; docs/pipelines.md): what FaroPolicy does differently once
:meth:`~autoscaler.contract.policy.Policy.attach_pipelines` told it its pipelines.

* Long-term plans forecast each pipeline's entry arrivals (``obs.pipelines[p]``) as Faro
  forecasts a model's; a stage's forecast is the entry's times its ``fraction``, and the
  planner counts each pipeline as one job over its end-to-end SLO (engine.pipeline_plan),
  choosing the stages' replicas, hence the SLO split, jointly.
* The reactive step watches a pipeline's end-to-end latency against its SLO besides its
  stages' own targets (as faro-split does); a pipeline over its SLO for the trigger period
  gets one more replica on its bottleneck stage: the one with the largest share of the
  end-to-end estimate at the stages' current rates and target replicas.
* Surge, moves and re-plans treat stages as models.

Without pipelines every method here is the identity, so Faro is unchanged (the policy
fingerprint, bench.policy_fingerprint, checks it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from autoscaler.contract.policy import ModelObservation, Observation, Policy
from autoscaler.policies.common import Timers
from faro_serve.engine.latency import ESTIMATORS, latency
from faro_serve.engine.pipeline_latency import path_matrix, shares
from forecasting.base import Forecast

if TYPE_CHECKING:
    from faro_serve.engine import Allocation
    from faro_serve.pipelines import PipelineSLO

PIPE = "pipeline:"  # a pipeline's key in the violation timers (model names have no colon)


class PipelineAware(Policy):
    """FaroPolicy's pipeline side (module docstring); a mixin over a Faro policy, whose parts
    it uses are declared below for the type checker."""

    if TYPE_CHECKING:  # FaroPolicy's (hybrid.py), which imports this module
        violating: Timers
        surge_hold: dict[str, float]

        def forecast(self, obs: Observation, seed: int | None = None) -> Forecast: ...
        def _procs(self, obs: Observation) -> dict[str, float]: ...

    def staged(self) -> set[str]:
        return {n for p in self.pipelines for n in p.stage_names}

    def forecast_view(self, obs: Observation) -> Observation:
        """What the forecaster sees: the single models and each pipeline's entry, in place
        of its stages (the observation itself without pipelines)."""
        if not self.pipelines:
            return obs
        staged = self.staged()
        models = {n: o for n, o in obs.models.items() if n not in staged}
        for p in self.pipelines:
            po = obs.pipelines.get(p.name)
            if po is None:  # the meter has not reported it: the entry stage's own arrivals
                e = p.entries[0]
                counts = np.asarray(obs.models[e].arrivals_per_min, float) / p.stage(e).fraction
                rate = obs.models[e].arrival_rate / p.stage(e).fraction
            else:
                counts, rate = np.asarray(po.arrivals_per_min, float), po.arrival_rate
            models[p.name] = ModelObservation(
                name=p.name, replicas=0, target_replicas=0, arrivals_per_min=counts, arrival_rate=rate
            )
        return dataclasses.replace(obs, models=models)

    def forecast_samples(
        self, obs: Observation, seed: int | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """``(samples, predictor)`` by model, stages included (entry x fraction)."""
        fc = self.forecast(self.forecast_view(obs), seed)
        samples, predictor = fc.by_model(), dict(fc.predictor)
        for p in self.pipelines:
            entry = samples.pop(p.name)
            via = predictor.pop(p.name, "?")
            for s in p.stages:
                samples[s.name] = entry * s.fraction
                predictor[s.name] = f"{via} (pipeline {p.name})"
        return samples, predictor

    def judged(self, obs: Observation) -> Iterable[tuple[str, ModelObservation]]:
        """The models the reactive step judges by their own target: every one, stages
        included (a stage by its ``slo_ms``, the equal split unless given): a stage that
        falls behind its share is helped at once, as faro-split would, while its pipeline
        is watched end to end besides (:meth:`watch_pipelines`)."""
        return obs.models.items()

    def watch_pipelines(self, obs: Observation) -> None:
        """Update each pipeline's over-the-SLO timer from its end-to-end latency."""
        for p in self.pipelines:
            po = obs.pipelines.get(p.name)
            over = po is not None and po.latency_ms is not None and po.latency_ms > p.slo_ms
            hold = max(self.surge_hold.get(n, -math.inf) for n in p.stage_names)
            self.violating.update(PIPE + p.name, over and obs.now >= hold, obs.now)

    def stage_latencies(self, obs: Observation, p: PipelineSLO) -> np.ndarray:
        """Each stage's estimated percentile latency (s) at its rate now (the entry's x its
        fraction, or the stage's own when larger) and its target replicas."""
        procs = self._procs(obs)
        po = obs.pipelines.get(p.name)
        est = ESTIMATORS[self.cluster.estimator]
        out = []
        for s in p.stages:
            o = obs.models[s.name]
            m = self.slo[s.name]
            lam = max(o.arrival_rate, (po.arrival_rate * s.fraction) if po else 0.0)
            lam += o.queue_length / self.tick_s
            c = max(o.target_replicas, 1) * m.concurrency
            out.append(latency(c, lam, procs[s.name] / 1e3, p.percentile / 100, self.cluster.rho_max, est))
        return np.array(out)

    def bottleneck(self, obs: Observation, p: PipelineSLO) -> str:
        """The stage with the largest share of the pipeline's end-to-end estimate."""
        local = {n: k for k, n in enumerate(p.stage_names)}
        paths = path_matrix([[local[n] for n in path] for path in p.paths()], len(local))
        lat = self.stage_latencies(obs, p)
        share = shares(lat, paths)
        at_max = [obs.models[n].target_replicas >= self.slo[n].max_replicas for n in p.stage_names]
        share = np.where(at_max, -1.0, share)
        return p.stage_names[int(np.argmax(share))]

    def resolve_due(self, obs: Observation, due: list[str]) -> list[str]:
        """``due`` with each pipeline replaced by its bottleneck stage (once)."""
        if not self.pipelines:
            return due
        by_name = {p.name: p for p in self.pipelines}
        out: list[str] = []
        for n in due:
            if n.startswith(PIPE):
                n = self.bottleneck(obs, by_name[n[len(PIPE) :]])
            if n not in out:
                out.append(n)
        return out

    def pipeline_info(self, alloc: Allocation) -> dict[str, dict[str, Any]]:
        """The plan's view of each pipeline (decision info): end-to-end estimate, utility
        and the split (each stage's latency and share)."""
        out = {}
        for pd in alloc.pipelines:
            d = dataclasses.asdict(pd)
            d["latency_ms"] = round(pd.latency_ms, 2) if math.isfinite(pd.latency_ms) else None
            d["utility"] = round(pd.utility, 4)
            d["effective_utility"] = round(pd.effective_utility, 4)
            d["arrival_rate"] = round(pd.arrival_rate, 4)
            out[pd.name] = d
        return out
