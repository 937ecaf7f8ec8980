"""The Faro paper's baselines (section 6, Table 6) and Ray Serve's default autoscaler.

Each is a small :class:`~autoscaler.policy.Policy`, so it runs live and in the simulator.
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
  gives latency-sensitive users (``RAY_TUNED``).

Oneshot and AIAD use the paper's triggers: a job whose SLO-percentile latency over the
30 s look-back stays above its SLO for 30 s is marked for scale-up; one at or below it for
5 minutes (300 s, the paper's text; the release's config uses 600 s) for scale-down. A
look-back with no completed request counts as underloaded (the job is idle).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.resources import demand
from forecasting.base import Forecaster

from .common import (Timers, fallback_for, fcfs_decision, forecast_or_fallback,  # noqa: F401
                     max_rate_one_replica, processing_s)
from .policy import Decision, Observation, Policy, grant_in_order

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
        return fcfs_decision(self, obs, wanted, [m.name for m in self.models], "long_term")


# -- Oneshot and AIAD ------------------------------------------------------------------
class TriggeredPolicy(Policy):
    """Reactive per-job autoscaler with the paper's overload / underload triggers."""

    state_fields = ("over", "under")

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec, *,
                 up_after_s: float = SCALE_UP_AFTER_S, down_after_s: float = SCALE_DOWN_AFTER_S):
        super().__init__(models, cluster)
        self.up_after_s = up_after_s
        self.down_after_s = down_after_s
        self.over = Timers()
        self.under = Timers()

    def up_target(self, m: ModelSLO, o) -> int:
        raise NotImplementedError

    def down_target(self, m: ModelSLO, o) -> int:
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
        return fcfs_decision(self, obs, wanted, order, "reactive",
                             {"up": order, "down": sorted(down)})


class OneshotPolicy(TriggeredPolicy):
    """Replicas proportional to latency / SLO: ``ceil(serving * latency / SLO)``.

    The multiplier is the serving replicas, the ones the latency was measured on, so replicas
    still starting are not counted twice; an idle job (no latency) goes to its minimum.
    """

    name = "oneshot"

    def _proportional(self, m: ModelSLO, o) -> int:
        if o.latency_ms is None:
            return m.min_replicas
        return m.clamp(math.ceil(max(o.replicas, 1) * o.latency_ms / m.slo_ms - 1e-9))

    def up_target(self, m, o):
        return self._proportional(m, o)

    def down_target(self, m, o):
        return self._proportional(m, o)


class AIADPolicy(TriggeredPolicy):
    """Additive increase, additive decrease: one replica at a time."""

    name = "aiad"

    def up_target(self, m, o):
        return m.clamp(o.target_replicas + 1)

    def down_target(self, m, o):
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

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec,
                 forecaster: Forecaster | None = None, *, peak_quantile: float = 0.5,
                 reactive: bool = True, n_samples: int = 100, replica_rate: str = "slo"):
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
            r1 = m.concurrency / p if self.replica_rate == "saturation" else \
                max_rate_one_replica(p, m.slo_ms / 1e3, m.percentile / 100.0, m.concurrency)
            wanted[m.name] = m.clamp(math.ceil(peak / r1 - 1e-9) if r1 > 0 else m.max_replicas)
            peaks[m.name] = round(peak, 3)
        # Simultaneous independent requests: no job is first by construction; shuffle.
        order = [self.models[i].name for i in rng.permutation(len(self.models))]
        return fcfs_decision(self, obs, wanted, order, "long_term", {"peak_rps": peaks})

    def react(self, obs: Observation) -> Decision | None:
        for n, o in obs.models.items():
            self.over.update(n, o.latency_ms is not None and o.latency_ms > self.slo[n].slo_ms, obs.now)
        due = [n for n in sorted(self.over.since, key=self.over.since.get)
               if self.over.held(n, obs.now, self.cluster.reactive_trigger_s)]
        if not due:
            return None
        wanted = {n: obs.models[n].target_replicas + 1 for n in due}
        for n in due:
            self.over.restart(n, obs.now)
        return fcfs_decision(self, obs, wanted, due, "reactive", {"up": due})


# -- Ray Serve's request-based autoscaling policy ---------------------------------------------
# Ray Serve's settings for a plain deployment, as Ray 2.60 names them: the fields of its
# ``autoscaling_config`` and the deployment options beside it. One source for the live
# baselines (faro_serve/serving/native.py deploys them), their simulated counterparts here and
# the compare report. ``RAY_DEFAULTS``: what a user gets out of the box (``ray-native``).
# ``RAY_TUNED``: what Ray's advanced-autoscaling guide advises latency-sensitive users
# (``ray-tuned``, docs/compare.md). ``max_queued_requests`` -1: no limit.
RAY_DEFAULTS = {"autoscaling_config": {"target_ongoing_requests": 2, "upscale_delay_s": 30,
                                       "downscale_delay_s": 600, "metrics_interval_s": 10,
                                       "look_back_period_s": 30},
                "max_ongoing_requests": 5, "max_queued_requests": -1}
RAY_TUNED = {"autoscaling_config": {"target_ongoing_requests": 1, "upscale_delay_s": 3,
                                    "downscale_delay_s": 60, "metrics_interval_s": 2,
                                    "look_back_period_s": 10},
             "max_ongoing_requests": 2, "max_queued_requests": 50}


def RAY_TUNED_BATCH(max_batch_size: int) -> dict:
    """``RAY_TUNED`` for a deployment that batches with ``@serve.batch(max_batch_size=B)``
    (issue 47): a replica's steady state is one batch at a time, so the target is ``B``
    ongoing requests (the guide: set it from the latency objective; a batch is what a
    replica serves at once), and ``max_ongoing_requests`` the guide's 25 % above it, which
    is also at least ``B x max_concurrent_batches`` as Ray's own warning asks."""
    b = int(max_batch_size)
    return {"autoscaling_config": {**RAY_TUNED["autoscaling_config"], "target_ongoing_requests": b},
            "max_ongoing_requests": math.ceil(1.25 * b), "max_queued_requests": RAY_TUNED["max_queued_requests"]}


def ray_serve_policy(settings: dict, name: str):
    """A factory of :class:`RayServePolicy` with Ray's ``autoscaling_config`` ``settings``."""
    a = settings["autoscaling_config"]

    def build(models, cluster, forecaster=None):
        return RayServePolicy(models, cluster, name=name,
                              target_ongoing_requests=a["target_ongoing_requests"],
                              upscale_delay_s=a["upscale_delay_s"],
                              downscale_delay_s=a["downscale_delay_s"],
                              look_back_period_s=a["look_back_period_s"],
                              metrics_interval_s=a["metrics_interval_s"])
    return build


class RayServePolicy(Policy):
    """Ray Serve's request-based autoscaler with its defaults, as a user gets it out of the box.

    Follows ``ray.serve.autoscaling_policy`` (Ray 2.5x): ongoing requests (queued + running)
    averaged over ``look_back_period_s`` (30 s); desired = running * total / (target *
    running), target_ongoing_requests = 2; scaling factors (1) applied as
    ``ceil(running + factor * (desired - running))``; a change only after the desire held
    ``upscale_delay_s`` (30 s) / ``downscale_delay_s`` (600 s), measured against Ray's own
    target; then min/max replicas. Ray's target may exceed what the cluster holds: like
    pending replicas, the excess is granted as capacity frees, one replica per waiting model
    in turn (oldest wish first), which is how Ray spread freed CPUs over several deployments'
    pending replicas live (docs/compare.md).

    ``metrics_interval_s``: how often Ray's handles and replicas push the ongoing requests
    to the controller, so how often a new sample reaches the rule; given, it is the policy's
    tick (else the cluster's reactive interval, 10 s, Ray's default interval too).
    """

    name = "ray-serve"
    state_fields = ("ray_target", "counter", "stamp", "samples", "pending_since")

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec, *,
                 target_ongoing_requests: float = 2.0, upscale_delay_s: float = 30.0,
                 downscale_delay_s: float = 600.0, look_back_period_s: float = 30.0,
                 upscaling_factor: float = 1.0, downscaling_factor: float = 1.0,
                 metrics_interval_s: float | None = None, name: str | None = None):
        super().__init__(models, cluster)
        if name is not None:
            self.name = name
        if metrics_interval_s is not None:
            if not metrics_interval_s > 0:
                raise ValueError(f"metrics_interval_s must be > 0 (got {metrics_interval_s:g})")
            self.tick_s = float(metrics_interval_s)
        self.target_ongoing = target_ongoing_requests
        self.up_delay = upscale_delay_s
        self.down_delay = downscale_delay_s
        self.look_back = look_back_period_s
        self.up_factor = upscaling_factor
        self.down_factor = downscaling_factor
        self.ray_target: dict[str, int] = {}
        self.counter: dict[str, int] = {}
        self.stamp: dict[str, float | None] = {}
        self.samples: dict[str, deque] = {m.name: deque() for m in self.models}
        self.pending_since: dict[str, float] = {}

    def _scaled(self, desired: float, running: int) -> int:
        if running == 0:
            return math.ceil(desired)
        delta = desired - running
        factor = self.up_factor if delta > 0 else self.down_factor
        scaled = math.ceil(running + factor * delta)
        if math.ceil(desired) < running and scaled == running:
            scaled -= 1
        return scaled

    def _delay(self, n: str, desired: int, now: float) -> int:
        """Ray's ``_apply_delay_logic``: counter sign = direction, timestamp = first wish."""
        cur = self.ray_target[n]
        decision = cur
        counter, stamp = self.counter.get(n, 0), self.stamp.get(n)
        if desired > cur:
            if counter < 0:
                counter, stamp = 0, None
            counter += 1
            stamp = now if stamp is None else stamp
            if now - stamp + 1e-6 >= self.up_delay:
                counter, stamp, decision = 0, None, desired
        elif desired < cur:
            if counter > 0:
                counter, stamp = 0, None
            counter -= 1
            desired = max(1, desired)
            stamp = now if stamp is None else stamp
            if now - stamp + 1e-6 >= self.down_delay:
                counter, stamp, decision = 0, None, desired
        else:
            counter, stamp = 0, None
        self.counter[n], self.stamp[n] = counter, stamp
        return decision

    def decide(self, obs: Observation) -> Decision | None:
        now = obs.now
        for m in self.models:
            o = obs.models[m.name]
            self.ray_target.setdefault(m.name, o.target_replicas)
            q = self.samples[m.name]
            q.append((now, o.ongoing_per_replica * o.replicas))
            while q and q[0][0] <= now - self.look_back:
                q.popleft()
            total = sum(v for _, v in q) / len(q)
            running = o.replicas
            desired = self.ray_target[m.name] if running == 0 else total / self.target_ongoing
            final = self._delay(m.name, max(0, self._scaled(desired, running)), now)
            self.ray_target[m.name] = m.clamp(final)
        for m in self.models:  # Ray's target above what runs = pending replicas
            if self.ray_target[m.name] > obs.models[m.name].target_replicas:
                self.pending_since.setdefault(m.name, now)
            else:
                self.pending_since.pop(m.name, None)
        # Replicas already pending when CPUs free up take them in turn; a new wish takes
        # what is free at once, first come first served (Ray starts a replica as soon as its
        # request finds room). Both as seen live (docs/compare.md).
        current = {n: o.target_replicas for n, o in obs.models.items()}
        waiting = sorted((n for n, t in self.pending_since.items() if t < now),
                         key=self.pending_since.get)
        fresh = [n for n in self.pending_since if self.pending_since[n] >= now]
        granted = grant_in_order(dict(self.ray_target), current, self.models, obs.capacity,
                                 order=waiting, interleave=True)
        granted = grant_in_order({n: self.ray_target[n] for n in fresh}, granted, self.models,
                                 obs.capacity, order=fresh)
        changed = {n: granted[n] for n in granted if granted[n] != current[n]}
        if not changed:
            return None
        return Decision(changed, {}, "reactive", {"ray_target": dict(self.ray_target)})


# This module's built-in policies as data, (name, factory, summary, needs_batching), which
# autoscaler/builtin.py lists: the policy modules never import the registry.
POLICIES = (
    ("fairshare", lambda models, cluster, forecaster=None: FairSharePolicy(models, cluster),
     "Baseline: no autoscaling, floor(capacity / models) replicas each", False),
    ("oneshot", lambda models, cluster, forecaster=None: OneshotPolicy(models, cluster),
     "Baseline: ceil(serving x latency / SLO) replicas after 30 s over or 5 min under the SLO",
     False),
    ("aiad", lambda models, cluster, forecaster=None: AIADPolicy(models, cluster),
     "Baseline: +1 replica after 30 s over the SLO, -1 after 5 min under it", False),
    ("mark", lambda models, cluster, forecaster=None: MArkPolicy(models, cluster, forecaster),
     "MArk/Cocktail/Barista: per model, replicas for the forecast peak at the rate one "
     "replica serves within the SLO, every 5 min", False),
    ("ray-serve", lambda models, cluster, forecaster=None: RayServePolicy(models, cluster),
     "Ray Serve's default rule, simulated: 2 ongoing requests per replica, 30 s up and "
     "600 s down delays (live, use ray-native in validate/compare)", False),
    ("ray-serve-tuned", ray_serve_policy(RAY_TUNED, "ray-serve-tuned"),
     "Ray Serve's rule as its guide tunes it for latency, simulated: 1 ongoing request per "
     "replica, 3 s up and 60 s down delays, 10 s look-back (live: ray-tuned in compare)", False),
    ("mark-saturation", lambda models, cluster, forecaster=None:
     MArkPolicy(models, cluster, forecaster, replica_rate="saturation"),
     "MArk with one replica's rate at saturation (1 / processing time), no SLO margin", False),
)
