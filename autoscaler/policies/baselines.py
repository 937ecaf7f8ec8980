"""The Faro paper's baselines (section 6, Table 6) and Ray Serve's default autoscaler.

Each is a small :class:`~autoscaler.contract.policy.Policy`, so it runs live and in the simulator.
They autoscale every job independently; where a fixed cluster cannot hold every request
for more replicas, increases are granted first come first served (``grant_in_order``),
as independent autoscalers sharing a cluster would get them. Reductions always happen.

* ``fairshare``: no autoscaling, ``floor(capacity / jobs)`` replicas each.
* ``oneshot``: target ``ceil(serving * latency / SLO)``.
* ``aiad``: +1 / -1 replica.
* ``mark`` (MArk/Cocktail/Barista): proactive, per job, replicas for the forecast peak at
  the largest rate one replica serves within the SLO.
* ``ray-serve``: Ray Serve's default request-based policy, out of the box.
* ``ray-serve-tuned``: the same rule with the settings Ray's advanced-autoscaling guide
  gives latency-sensitive users (``RAY_TUNED``). The rule and its settings are in
  ``autoscaler/policies/ray_rule.py`` (re-exported here).

Oneshot and AIAD use the paper's triggers: a job whose SLO-percentile latency over the
30 s look-back stays above its SLO for 30 s is marked for scale-up; one at or below it for
5 minutes (300 s, the paper's text; the release's config uses 600 s) for scale-down. A
look-back with no completed request counts as underloaded (the job is idle).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from autoscaler.contract.policy import Decision, ModelObservation, Observation, Policy
from autoscaler.policies.common import (
    Timers,
    fallback_for,
    fcfs_decision,
    forecast_or_fallback,
    max_rate_one_replica,
    processing_s,
)
from autoscaler.policies.ray_rule import RAY_TUNED, RayServePolicy, ray_serve_policy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.resources import demand
from forecasting.base import Forecaster

SCALE_UP_AFTER_S = 30.0
SCALE_DOWN_AFTER_S = 300.0


# -- FairShare --------------------------------------------------------------------------
class FairSharePolicy(Policy):
    """No autoscaling: every job gets ``floor(capacity / jobs)`` replicas, once."""

    name = "fairshare"
    state_fields = ("done",)

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec):
        super().__init__(models, cluster)
        self.done = False

    def decide(self, obs: Observation) -> Decision | None:
        if self.done:
            return None
        self.done = True
        n = len(self.models)
        wanted = {}
        for m in self.models:
            # an n-th of every resource the model needs (infinite caps do not bind)
            share = min(obs.capacity[r] / n / a for r, a in demand(m).items())
            wanted[m.name] = m.clamp(math.floor(share + 1e-9))
        return fcfs_decision(self.models, obs, wanted, [m.name for m in self.models], "long_term")


# -- Oneshot and AIAD ------------------------------------------------------------------
class TriggeredPolicy(Policy):
    """Reactive per-job autoscaler with the paper's overload / underload triggers."""

    state_fields = ("over", "under")

    def __init__(
        self,
        models: Sequence[ModelSLO],
        cluster: ClusterSpec,
        *,
        up_after_s: float = SCALE_UP_AFTER_S,
        down_after_s: float = SCALE_DOWN_AFTER_S,
    ):
        super().__init__(models, cluster)
        self.up_after_s = up_after_s
        self.down_after_s = down_after_s
        self.over = Timers()
        self.under = Timers()

    def up_target(self, m: ModelSLO, o: ModelObservation) -> int:
        raise NotImplementedError

    def down_target(self, m: ModelSLO, o: ModelObservation) -> int:
        raise NotImplementedError

    def decide(self, obs: Observation) -> Decision | None:
        now = obs.now
        up, down = [], []
        for m in self.models:
            o = obs.models[m.name]
            over = o.latency_ms is not None and o.latency_ms > m.slo_ms
            self.over.update(m.name, over, now)
            self.under.update(m.name, not over, now)
            if self.over.held(m.name, now, self.up_after_s):
                up.append(m.name)
            elif self.under.held(m.name, now, self.down_after_s):
                down.append(m.name)
        if not up and not down:
            return None
        wanted = {}
        for n in down:
            wanted[n] = min(self.down_target(self.slo[n], obs.models[n]), obs.models[n].target_replicas)
            self.under.restart(n, now)
        order = sorted(up, key=lambda n: self.over.since[n])  # first marked, first served
        for n in order:
            wanted[n] = max(self.up_target(self.slo[n], obs.models[n]), obs.models[n].target_replicas)
            self.over.restart(n, now)
        return fcfs_decision(self.models, obs, wanted, order, "reactive", {"up": order, "down": sorted(down)})


class OneshotPolicy(TriggeredPolicy):
    """Replicas proportional to latency / SLO: ``ceil(serving * latency / SLO)``.

    The multiplier is the serving replicas, the ones the latency was measured on, so replicas
    still starting are not counted twice; an idle job (no latency) goes to its minimum.
    """

    name = "oneshot"

    def _proportional(self, m: ModelSLO, o: ModelObservation) -> int:
        if o.latency_ms is None:
            return m.min_replicas
        return m.clamp(math.ceil(max(o.replicas, 1) * o.latency_ms / m.slo_ms - 1e-9))

    def up_target(self, m: ModelSLO, o: ModelObservation) -> int:
        return self._proportional(m, o)

    def down_target(self, m: ModelSLO, o: ModelObservation) -> int:
        return self._proportional(m, o)


class AIADPolicy(TriggeredPolicy):
    """Additive increase, additive decrease: one replica at a time."""

    name = "aiad"

    def up_target(self, m: ModelSLO, o: ModelObservation) -> int:
        return m.clamp(o.target_replicas + 1)

    def down_target(self, m: ModelSLO, o: ModelObservation) -> int:
        return m.clamp(o.target_replicas - 1)


# -- MArk / Cocktail / Barista ------------------------------------------------------------
class MArkPolicy(Policy):
    """Proactive per-job provisioning for the forecast peak (MArk, Cocktail, Barista).

    Every ``long_term_interval_s`` (300 s, as Faro's long-term step): forecast the next
    window (the same forecaster Faro gets), take the peak (``peak_quantile`` over samples of
    each sample's window maximum; default the median) and set ``ceil(peak / r1)`` replicas,
    ``r1`` being the largest rate one replica serves with its SLO-percentile latency within
    the SLO (M/D/k for a replica of concurrency k, the engine's estimator; M/D/1 at the
    paper's k = 1): per-replica capacity, no pooling, each job on
    its own. Between those steps a job over its SLO for 30 s gets one more replica (the
    same reactive trigger as Faro's short-term autoscaler, so they differ only in planning).
    ``replica_rate="saturation"`` uses ``k / processing time`` for ``r1`` instead (a replica's
    profiled peak, no SLO margin), a sensitivity variant of the per-replica capacity.
    """

    name = "mark"
    state_fields = ("last", "calls", "over")

    def __init__(
        self,
        models: Sequence[ModelSLO],
        cluster: ClusterSpec,
        forecaster: Forecaster | None = None,
        *,
        peak_quantile: float = 0.5,
        reactive: bool = True,
        n_samples: int = 100,
        replica_rate: str = "slo",
    ):
        super().__init__(models, cluster)
        self.forecaster, self.fallback = fallback_for(forecaster, max(1, round(cluster.window_s / 60)))
        self.peak_quantile = peak_quantile
        self.reactive = reactive
        self.n_samples = n_samples
        if replica_rate not in ("slo", "saturation"):
            raise ValueError(f"replica_rate must be 'slo' or 'saturation' (got {replica_rate!r})")
        self.replica_rate = replica_rate
        self.last = -math.inf
        self.calls = 0
        self.over = Timers()

    def decide(self, obs: Observation) -> Decision | None:
        if obs.now - self.last >= self.cluster.long_term_interval_s:
            return self.proactive(obs)
        return self.react(obs) if self.reactive else None

    def proactive(self, obs: Observation) -> Decision | None:
        self.last = obs.now
        self.over.since.clear()
        fc = forecast_or_fallback(self.forecaster, self.fallback, obs, self.n_samples, self.calls)
        self.calls += 1
        rng = np.random.default_rng(self.cluster.seed + self.calls)
        wanted, peaks = {}, {}
        for m in self.models:
            s = fc.by_model()[m.name]
            peak = float(np.quantile(s.max(axis=1), self.peak_quantile))
            p = processing_s(m, obs.models[m.name].processing_ms)
            r1 = (
                m.concurrency / p
                if self.replica_rate == "saturation"
                else max_rate_one_replica(p, m.slo_ms / 1e3, m.percentile / 100.0, m.concurrency)
            )
            wanted[m.name] = m.clamp(math.ceil(peak / r1 - 1e-9) if r1 > 0 else m.max_replicas)
            peaks[m.name] = round(peak, 3)
        # Simultaneous independent requests: no job is first by construction; shuffle.
        order = [self.models[i].name for i in rng.permutation(len(self.models))]
        return fcfs_decision(self.models, obs, wanted, order, "long_term", {"peak_rps": peaks})

    def react(self, obs: Observation) -> Decision | None:
        for n, o in obs.models.items():
            self.over.update(n, o.latency_ms is not None and o.latency_ms > self.slo[n].slo_ms, obs.now)
        due = [
            n
            for n in sorted(self.over.since, key=self.over.since.__getitem__)
            if self.over.held(n, obs.now, self.cluster.reactive_trigger_s)
        ]
        if not due:
            return None
        wanted = {n: obs.models[n].target_replicas + 1 for n in due}
        for n in due:
            self.over.restart(n, obs.now)
        return fcfs_decision(self.models, obs, wanted, due, "reactive", {"up": due})


# This module's built-in policies as data, (name, factory, summary, needs_batching,
# forecasts), which autoscaler/catalogue/builtin.py lists: the policy modules never import the registry.
POLICIES = (
    (
        "fairshare",
        lambda models, cluster, forecaster=None: FairSharePolicy(models, cluster),
        "Baseline: no autoscaling, floor(capacity / models) replicas each",
        False,
        False,
    ),
    (
        "oneshot",
        lambda models, cluster, forecaster=None: OneshotPolicy(models, cluster),
        "Baseline: ceil(serving x latency / SLO) replicas after 30 s over or 5 min under the SLO",
        False,
        False,
    ),
    (
        "aiad",
        lambda models, cluster, forecaster=None: AIADPolicy(models, cluster),
        "Baseline: +1 replica after 30 s over the SLO, -1 after 5 min under it",
        False,
        False,
    ),
    (
        "mark",
        lambda models, cluster, forecaster=None: MArkPolicy(models, cluster, forecaster),
        "MArk/Cocktail/Barista: per model, replicas for the forecast peak at the rate one "
        "replica serves within the SLO, every 5 min",
        False,
        True,
    ),
    (
        "ray-serve",
        lambda models, cluster, forecaster=None: RayServePolicy(models, cluster),
        "Ray Serve's default rule, simulated: 2 ongoing requests per replica, 30 s up and "
        "600 s down delays (live, use ray-native in validate/compare)",
        False,
        False,
    ),
    (
        "ray-serve-tuned",
        ray_serve_policy(RAY_TUNED, "ray-serve-tuned"),
        "Ray Serve's rule as its guide tunes it for latency, simulated: 1 ongoing request per "
        "replica, 3 s up and 60 s down delays, 10 s look-back (live: ray-tuned in compare)",
        False,
        False,
    ),
    (
        "mark-saturation",
        lambda models, cluster, forecaster=None: MArkPolicy(models, cluster, forecaster, replica_rate="saturation"),
        "MArk with one replica's rate at saturation (1 / processing time), no SLO margin",
        False,
        True,
    ),
)
