"""Faro's hybrid autoscaler as a :class:`~autoscaler.contract.policy.Policy` (paper section 4.4).

* Long-term, every ``long_term_interval_s`` (300 s): forecast the next window (420 s) from
  the per-minute arrival history, call :func:`faro_serve.engine.plan`, and set replicas and
  drop rates for every model at once.
* Short-term, every tick (10 s): a model whose observed percentile latency has broken its
  SLO for ``reactive_trigger_s`` (30 s) gets one more replica, only within free capacity,
  never a scale-down (the long-term part owns downscaling).
* Surge and the surge plan (ours; ``autoscaler.faro.surge``, on by default): a model whose rate
  jumps far past what its replicas serve (or, new, past what it has) gets what it needs at
  once; when the surging models do not all fit, the whole cluster is planned again at the
  rates seen now.
* Re-plan on surprise (ours, issue 31; ``replan`` and ``replan_latency``, on by default):
  between the plans, a model whose rate over the last ``replan_trigger_s`` leaves the last
  plan's forecast band (p10..p90, widened), or that is over its SLO for the trigger period,
  makes the whole cluster be planned again at once, with a fresh forecast re-levelled to
  the rates seen now; never within ``replan_gap_s`` of the last plan, never under heavy
  overload, and never cutting a saturated model (``autoscaler.faro.replan``, ``guard``).
* Moves (ours, issue 31; ``moves``, on by default): a model over its SLO for the trigger
  period that the full cluster cannot give one more replica takes one from the model whose
  loss costs the cluster objective least, when the objective gains over the time left to
  the next plan; the donor stays within its SLO with one fewer, and no replica moves back
  before the next plan.
* Pipelines (issue 35; ``autoscaler.faro.pipeline_aware``): with pipelines attached, each is
  planned as one job over its end-to-end SLO, and judged reactively end to end.

In which order these parts run each tick: ``autoscaler.faro.composition``.

The oracle variant plans with the true future arrivals (simulator only): the same
optimiser without forecast error, the bound the others are measured against.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from autoscaler.contract.policy import Decision, ModelPlan, Observation, Policy
from autoscaler.faro import composition
from autoscaler.faro.guard import heavy_overload, keep_saturated
from autoscaler.faro.pipeline_aware import PipelineAware
from autoscaler.faro.replan import band_of, bands_of, prune_changes, relevel, replan_scope, scoped_capacity, surprise
from autoscaler.faro.surge import SurgeAware
from autoscaler.policies.common import Timers, fallback_for, faro_policy_name, forecast_or_fallback
from autoscaler.policies.service import Service, service_of
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import Allocation, plan
from faro_serve.resources import CPU, fits_in, resource_names, usage
from forecasting.base import Forecast, Forecaster

log = logging.getLogger(__name__)

REPLAN_SEED = 1_000_003  # re-plans' forecasts draw from seeds of their own


class FaroPolicy(SurgeAware, PipelineAware, Policy):
    """Hybrid long-term predictive + short-term reactive Faro autoscaler."""

    state_fields = (
        "last_long_term",
        "violating",
        "surge_hold",
        "decisions",
        "band",
        "recent",
        "last_replan",
        "moved",
        "planned_blind",
    )

    def __init__(
        self,
        models: Sequence[ModelSLO],
        cluster: ClusterSpec,
        forecaster: Forecaster | None = None,
        *,
        reactive: bool = True,
        n_samples: int = 100,
        name: str | None = None,
    ):
        super().__init__(models, cluster)
        self.name = name or faro_policy_name(cluster.objective)
        self.forecaster, self.fallback = fallback_for(forecaster, max(1, round(cluster.window_s / 60)))
        self.reactive = reactive
        self.n_samples = n_samples
        self.last_long_term = -math.inf
        self.violating = Timers()  # models over their SLO since (the reactive trigger)
        self.surge_hold: dict[str, float] = {}  # model -> until when its reactive step waits
        self.decisions = 0
        self.band: dict[str, tuple[float, float, float]] = {}  # model -> the last plan's forecast p10, p50, p90 (req/s)
        self.recent: dict[str, list[float]] = {}  # model -> the last ticks' arrival rates (req/s)
        self.last_replan = -math.inf
        self.moved: dict[str, str] = {}  # model -> "in" / "out": moved since the last plan
        self.planned_blind = False  # the last long-term plan had no model's history

    def forecast(self, obs: Observation, seed: int | None = None) -> Forecast:
        seed = self.decisions if seed is None else seed
        return forecast_or_fallback(self.forecaster, self.fallback, obs, self.n_samples, seed)

    def decide(self, obs: Observation) -> Decision | None:
        """One tick: the parts in the order ``autoscaler.faro.composition`` gives."""
        return composition.decide(self, obs)

    def long_term(self, obs: Observation) -> Decision:
        self.last_long_term = obs.now
        self.violating.since.clear()
        self.moved.clear()
        self.planned_blind = all(len(o.arrivals_per_min) == 0 for o in obs.models.values())
        samples, predictor = self.forecast_samples(obs)
        self.decisions += 1
        return self._plan(obs, samples, predictor, "long_term")

    def services(self, obs: Observation) -> dict[str, Service]:
        """Per model how its replicas serve (``service.py``): one request's time, measured
        else the prior, and a batching model's batch curve, declared or measured."""
        return {m.name: service_of(m, obs.models[m.name]) for m in self.models}

    def _procs(self, obs: Observation) -> dict[str, float]:
        """Per model the processing time (ms) of one request alone."""
        return {n: s.processing_ms for n, s in self.services(obs).items()}

    def _shapes(self, obs: Observation) -> dict[str, np.ndarray]:
        """The batching models' batch curves as the plan weighs them."""
        return {n: s.shape for n, s in self.services(obs).items() if s.shape is not None}

    def _plan(
        self,
        obs: Observation,
        samples: dict[str, np.ndarray],
        predictor: dict[str, str],
        kind: str,
        models: Sequence[ModelSLO] | None = None,
        cluster: ClusterSpec | None = None,
    ) -> Decision:
        """Plan every model at once for the window from ``samples`` (req/s, samples x steps);
        ``models``: only these (a re-plan's scope, ``obs`` its own, ``cluster`` its spec),
        the others' bands kept."""
        models = self.models if models is None else list(models)
        svcs = {m.name: service_of(m, obs.models[m.name]) for m in models}
        procs = {n: s.processing_ms for n, s in svcs.items()}
        current = {n: o.target_replicas for n, o in obs.models.items()}
        alloc = plan(
            models,
            samples,
            current,
            self.cluster if cluster is None else cluster,
            processing_ms=procs,
            capacity=obs.capacity,
            pipelines=self.pipelines,
            batch_shapes={n: s.shape for n, s in svcs.items() if s.shape is not None},
        )
        self.band = bands_of(samples) if len(models) == len(self.models) else {**self.band, **bands_of(samples)}
        info = {
            "objective": alloc.objective,
            "objective_value": round(alloc.objective_value, 6),
            "solve_ms": round(alloc.solve_ms, 2),
            "groups": alloc.groups,
            "bound": self._binding(alloc, obs),
            "models": {
                d.name: {
                    "predictor": predictor.get(d.name, "?"),
                    "forecast_mean_rps": round(float(samples[d.name].mean()), 4),
                    "forecast_p90_rps": self.band[d.name][2],
                    "forecast_rps": dict(zip(("p10", "p50", "p90"), self.band[d.name])),
                    "processing_ms": round(d.processing_ms, 3),
                    "current": d.current,
                    "replicas": d.replicas,
                    "drop_rate": d.drop_rate,
                    "utility": round(d.utility, 4),
                    "batch_size": d.batch_size,
                    "latency_ms": round(d.latency_ms, 2) if math.isfinite(d.latency_ms) else None,
                }
                for d in alloc.decisions
            },
        }
        if alloc.fallback:  # the plan ran past ClusterSpec.plan_deadline_s (issue 36)
            info["fallback"] = alloc.fallback
        if alloc.pipelines:
            info["pipelines"] = self.pipeline_info(alloc)
        plan_ = {
            d.name: ModelPlan(
                d.replicas, d.utility, d.latency_ms if math.isfinite(d.latency_ms) else None, predictor.get(d.name, "?")
            )
            for d in alloc.decisions
        }
        # a batch curve still to be measured: batches of the largest form, and are measured
        batches = {
            d.name: d.batch_size if svcs[d.name].curve_known else svcs[d.name].bmax
            for d in alloc.decisions
            if self.slo[d.name].batching
        }
        return Decision(alloc.replicas, alloc.drop_rates, kind, info, plan_, batch_sizes=batches)

    def _binding(self, alloc: Allocation, obs: Observation) -> dict[str, Any]:
        """Which constraint held the plan back: the capacity (models short of utility 1 and
        no room for one more of their replicas) or a model's ``max_replicas``."""
        short = [d for d in alloc.decisions if d.utility < 1 - 1e-9]
        dem = self.demand
        free = obs.capacity.free(usage(alloc.replicas, dem), resource_names(dem))
        at_max = [d.name for d in short if d.replicas >= self.slo[d.name].max_replicas]
        room = [d.name for d in short if d.name not in at_max and fits_in(free, dem[d.name])]
        return {
            "capacity": bool(short) and len(room) < len(short) - len(at_max),
            "free_cpus": round(free[CPU], 3),
            "max_replicas": at_max,
            "short_of_slo": [d.name for d in short],
        }

    def short_term(self, obs: Observation) -> Decision | None:
        """The short-term step (``composition.short_term``): re-plan, one more replica,
        larger batches and moves for the models over their SLO; never fewer."""
        return composition.short_term(self, obs)

    def with_larger_batches(self, obs: Observation, due: list[str], d: Decision | None) -> Decision | None:
        """A batching model over its SLO whose batch in force is below its largest, where
        full batches of the largest serve at least a fifth more (a flat, GPU-like curve),
        also gets its largest batch at once: more throughput for no replica (issue 47)."""
        raised = []
        for n in due:
            svc, o = service_of(self.slo[n], obs.models[n]), obs.models[n]
            b = max(int(o.batch_size), 1)
            if (
                svc.shape is not None
                and svc.curve_known
                and b < svc.bmax
                and svc.saturation_rate(svc.bmax) >= 1.2 * svc.saturation_rate(b)
            ):
                d = d or Decision({}, {}, "reactive", {})
                d.set(n, batch_size=svc.bmax)
                raised.append(n)
        if raised and d is not None:  # d is set wherever a batch was raised
            d.info["batch_raised"] = raised
        return d

    # -- re-plan on surprise, moves (autoscaler.faro.replan) -----------------------------------
    def _ticks(self) -> int:
        return max(1, round(self.cluster.replan_trigger_s / self.tick_s))

    def _remember_rates(self, obs: Observation) -> None:
        if not (self.cluster.replan or self.cluster.moves):
            return
        k = self._ticks()
        for n, o in obs.models.items():
            self.recent[n] = (self.recent.get(n, []) + [round(float(o.arrival_rate), 6)])[-k:]

    def fresh_rate(self, n: str) -> float | None:
        """``n``'s mean arrival rate over the last ``replan_trigger_s`` (None: too few ticks)."""
        r = self.recent.get(n, [])
        return float(np.mean(r)) if len(r) >= self._ticks() else None

    def replan(self, obs: Observation, due: list[str]) -> Decision | None:
        """Plan the whole cluster again when a model's rate left its forecast band (or,
        with ``replan_latency``, a model is ``due``: over its SLO for the trigger period),
        at most once per ``replan_gap_s`` after the last plan."""
        c = self.cluster
        if obs.now - max(self.last_long_term, self.last_replan) < c.replan_gap_s - 1e-9:
            return None
        if heavy_overload(obs, self.slo, c):
            # no share meets the SLOs: re-plans would chase every model's misses (day 8 at 16
            # replicas lost 7.49 -> 8.64 with them); the long-term plan and its guard decide
            return None
        why = {}
        for n in obs.models:
            rate = self.fresh_rate(n)
            if rate is None or n not in self.band:
                continue
            side = surprise(rate, self.band[n], c.replan_margin, self._ticks() * self.tick_s)
            if side == "above" or (side == "below" and c.replan_down):
                why[n] = {
                    "why": f"rate {side} the forecast band",
                    "rate_rps": round(rate, 3),
                    "band_rps": [self.band[n][0], self.band[n][2]],
                }
        if c.replan_latency:
            for n in due:
                if n not in why:
                    o = obs.models[n]
                    why[n] = {
                        "why": "over the SLO",
                        "latency_ms": round(o.latency_ms or 0.0, 1),
                        "slo_ms": self.slo[n].slo_ms,
                    }
        if not why:
            return None
        band_before = dict(self.band)
        scoped = None if self.pipelines else replan_scope(self.models, c, set(why))
        scope, spec = (None, None) if scoped is None else scoped
        models = self.models if scope is None else [self.slo[n] for n in scope]
        full = obs
        if scope is not None:  # only the triggering models' groups, in what they hold and what is free
            current = {n: o.target_replicas for n, o in obs.models.items()}
            cap = scoped_capacity(self.models, c, obs.capacity, current, set(scope))
            obs = replace(
                obs,
                models={n: obs.models[n] for n in scope},
                capacity=cap,
                capacity_cpus=cap.cpus,
                capacity_memory_gb=cap.memory_gb,
            )
        # a seed of its own: the long-term plans draw the same samples with re-plans or not
        samples, predictor = self.forecast_samples(obs, seed=REPLAN_SEED + int(obs.now))
        for n, w in why.items():
            rate = self.fresh_rate(n)
            if rate is None:
                continue
            if "latency_ms" in w:  # over the SLO at a rate within the band: never plan lower
                rate = max(rate + obs.models[n].queue_length / 60.0, float(np.median(samples[n])))
            samples[n] = relevel(samples[n], rate)
            predictor[n] = f"{predictor.get(n, '?')} (re-levelled to {rate:.3f} req/s)"
        d = self._plan(obs, samples, predictor, "replan", models, spec)
        saturated = self._keep_saturated(d, full)
        current = {n: o.target_replicas for n, o in obs.models.items()}
        svcs = {m.name: service_of(m, obs.models[m.name]) for m in models}
        kept, gain = prune_changes(
            models,
            c,
            samples,
            current,
            d.replicas,
            {n: s.processing_ms for n, s in svcs.items()},
            set(why),
            c.replan_min_gain,
            obs.capacity,
            {n: s.shape for n, s in svcs.items() if s.shape is not None},
        )
        if kept == current or gain < c.replan_min_gain:
            # nothing worth doing at these rates: they become the triggering models' band (a
            # surprise again only beyond it), the others keep theirs, and the gap does not start
            self.band = {**band_before, **{n: band_of(samples[n]) for n in why}}
            return None
        self.last_replan = obs.now
        planned = d.replicas  # (a fresh mapping per read: read once)
        undone = sorted(n for n in kept if kept[n] != planned[n])
        for n in undone:
            d.set(n, replicas=kept[n])
            d.info["models"][n]["replicas"] = kept[n]
        d.info["replan"] = {"trigger": why, "gain": round(gain, 4), "undone": undone, "kept_saturated": saturated}
        if scope is not None:
            d.info["replan"]["scope"] = {"models": len(scope), "of": len(self.models)}
        self.violating.since.clear()
        return d

    def _keep_saturated(self, d: Decision, obs: Observation) -> list[str]:
        """:func:`guard.keep_saturated` on a re-plan or surge plan, its log kept in step."""
        kept = keep_saturated(d, obs, self.slo)
        planned = d.replicas
        for n in d.info.get("models", {}):
            d.info["models"][n]["replicas"] = planned.get(n, obs.models[n].target_replicas)
        return kept


class OraclePolicy(FaroPolicy):
    """Faro planning with the true arrivals of the next window (simulator only)."""

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec, **kw: Any):
        kw.setdefault("name", "oracle")
        super().__init__(models, cluster, **kw)

    def forecast(self, obs: Observation, seed: int | None = None) -> Forecast:
        if obs.future_arrivals_per_min is None:
            raise ValueError("the oracle policy needs the true future arrivals (simulator only)")
        names = list(obs.models)
        horizon = self.fallback.horizon
        rows = []
        for n in names:
            fut = np.asarray(obs.future_arrivals_per_min.get(n, []), float)[:horizon] / 60.0
            if fut.size < horizon:  # the trace ends: repeat the last known rate
                last = fut[-1] if fut.size else obs.models[n].arrival_rate
                fut = np.concatenate([fut, np.full(horizon - fut.size, last)])
            rows.append(fut.reshape(1, horizon))
        return Forecast(names, np.stack(rows), {n: "oracle" for n in names})

    def _surge_plan_due(self, obs: Observation) -> bool:
        """Never: the oracle's plans know the future; the rates seen now would only be worse."""
        return False

    def replan(self, obs: Observation, due: list[str]) -> Decision | None:
        """Never, for the same reason (on the day-8 compare slices re-plans cost the oracle
        0.130 -> 0.155 and 0.164 -> 0.186): its bound is its long-term plans."""
        return None
