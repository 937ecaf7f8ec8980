"""Ray Serve's request-based autoscaling rule (``ray-serve``, ``ray-serve-tuned``) and the
settings it runs with, one source for the live Ray baselines (``faro_serve/serving/native.py``
deploys them), their simulated counterparts and ``faro-serve whatif``, which replays a plain
Ray Serve cluster with each deployment's own ``autoscaling_config``."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from autoscaler.contract.policy import Decision, Observation, Policy, grant_in_order
from faro_serve.config import ClusterSpec, ModelSLO

if TYPE_CHECKING:
    from forecasting.base import Forecaster

# Ray Serve's settings for a plain deployment, as Ray 2.60 names them: the fields of its
# ``autoscaling_config`` and the deployment options beside it. One source for the live
# baselines (faro_serve/serving/native.py deploys them), their simulated counterparts here and
# the compare report. ``RAY_DEFAULTS``: what a user gets out of the box (``ray-native``).
# ``RAY_TUNED``: what Ray's advanced-autoscaling guide advises latency-sensitive users
# (``ray-tuned``, docs/compare.md). ``max_queued_requests`` -1: no limit.
RAY_DEFAULTS: dict[str, Any] = {
    "autoscaling_config": {
        "target_ongoing_requests": 2,
        "upscale_delay_s": 30,
        "downscale_delay_s": 600,
        "metrics_interval_s": 10,
        "look_back_period_s": 30,
    },
    "max_ongoing_requests": 5,
    "max_queued_requests": -1,
}
RAY_TUNED: dict[str, Any] = {
    "autoscaling_config": {
        "target_ongoing_requests": 1,
        "upscale_delay_s": 3,
        "downscale_delay_s": 60,
        "metrics_interval_s": 2,
        "look_back_period_s": 10,
    },
    "max_ongoing_requests": 2,
    "max_queued_requests": 50,
}


def RAY_TUNED_BATCH(max_batch_size: int) -> dict[str, Any]:
    """``RAY_TUNED`` for a deployment that batches with ``@serve.batch(max_batch_size=B)``
    (issue 47): a replica's steady state is one batch at a time, so the target is ``B``
    ongoing requests (the guide: set it from the latency objective; a batch is what a
    replica serves at once), and ``max_ongoing_requests`` the guide's 25 % above it, which
    is also at least ``B x max_concurrent_batches`` as Ray's own warning asks."""
    b = int(max_batch_size)
    return {
        "autoscaling_config": {**RAY_TUNED["autoscaling_config"], "target_ongoing_requests": b},
        "max_ongoing_requests": math.ceil(1.25 * b),
        "max_queued_requests": RAY_TUNED["max_queued_requests"],
    }


def ray_serve_policy(settings: dict[str, Any], name: str) -> Callable[..., RayServePolicy]:
    """A factory of :class:`RayServePolicy` with Ray's ``autoscaling_config`` ``settings``."""
    a = settings["autoscaling_config"]

    def build(models: Sequence[ModelSLO], cluster: ClusterSpec, forecaster: Forecaster | None = None) -> RayServePolicy:
        return RayServePolicy(
            models,
            cluster,
            name=name,
            target_ongoing_requests=a["target_ongoing_requests"],
            upscale_delay_s=a["upscale_delay_s"],
            downscale_delay_s=a["downscale_delay_s"],
            look_back_period_s=a["look_back_period_s"],
            metrics_interval_s=a["metrics_interval_s"],
        )

    return build


# the autoscaling_config fields the rule reads, as Ray names them (also its keywords)
RULE_FIELDS = (
    "target_ongoing_requests",
    "upscale_delay_s",
    "downscale_delay_s",
    "look_back_period_s",
    "upscaling_factor",
    "downscaling_factor",
    "metrics_interval_s",
)


@dataclass(frozen=True)
class _Rule:
    """One deployment's settings of the rule (Ray's names, :data:`RULE_FIELDS`)."""

    target_ongoing_requests: float
    upscale_delay_s: float
    downscale_delay_s: float
    look_back_period_s: float
    upscaling_factor: float
    downscaling_factor: float
    metrics_interval_s: float | None  # None: a sample every tick


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

    ``per_model``: a model's own ``autoscaling_config`` (any of :data:`RULE_FIELDS`; None
    values are Ray's unset fields, left at the keywords'), as a real cluster sets each
    deployment apart (``faro-serve whatif``); min/max replicas are the models' bounds. A
    model with its own ``metrics_interval_s`` takes a sample only that often, and the
    policy ticks at the shortest interval.
    """

    name = "ray-serve"
    state_fields = ("ray_target", "counter", "stamp", "samples", "pending_since")

    def __init__(
        self,
        models: Sequence[ModelSLO],
        cluster: ClusterSpec,
        *,
        target_ongoing_requests: float = 2.0,
        upscale_delay_s: float = 30.0,
        downscale_delay_s: float = 600.0,
        look_back_period_s: float = 30.0,
        upscaling_factor: float = 1.0,
        downscaling_factor: float = 1.0,
        metrics_interval_s: float | None = None,
        name: str | None = None,
        per_model: Mapping[str, Mapping[str, Any]] | None = None,
    ):
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
        self.rules = self._rules(
            per_model or {},
            _Rule(
                target_ongoing_requests,
                upscale_delay_s,
                downscale_delay_s,
                look_back_period_s,
                upscaling_factor,
                downscaling_factor,
                None,
            ),
        )
        self.ray_target: dict[str, int] = {}
        self.counter: dict[str, int] = {}
        self.stamp: dict[str, float | None] = {}
        self.samples: dict[str, deque[tuple[float, float]]] = {m.name: deque() for m in self.models}
        self.pending_since: dict[str, float] = {}

    def _rules(self, per_model: Mapping[str, Mapping[str, Any]], base: _Rule) -> dict[str, _Rule]:
        """Every model's rule: ``base`` with the model's own fields (checked) over it."""
        unknown = sorted(set(per_model) - set(self.slo))
        if unknown:
            raise ValueError(f"per_model names {', '.join(unknown)}, not models of the policy")
        rules = {}
        for n in self.slo:
            own = {k: v for k, v in per_model.get(n, {}).items() if v is not None}
            bad = sorted(set(own) - set(RULE_FIELDS))
            if bad:
                raise ValueError(f"{n}: {', '.join(bad)} is not a setting of Ray's rule ({', '.join(RULE_FIELDS)})")
            for k in ("target_ongoing_requests", "metrics_interval_s", "look_back_period_s"):
                if k in own and not float(own[k]) > 0:
                    raise ValueError(f"{n}: {k} must be > 0 (got {own[k]!r})")
            rules[n] = replace(base, **{k: float(v) for k, v in own.items()})
        own_intervals = [r.metrics_interval_s for r in rules.values() if r.metrics_interval_s]
        if own_intervals:
            self.tick_s = min([float(self.tick_s), *own_intervals])
        return rules

    def _scaled(self, rule: _Rule, desired: float, running: int) -> int:
        if running == 0:
            return math.ceil(desired)
        delta = desired - running
        factor = rule.upscaling_factor if delta > 0 else rule.downscaling_factor
        scaled = math.ceil(running + factor * delta)
        if math.ceil(desired) < running and scaled == running:
            scaled -= 1
        return scaled

    def _delay(self, n: str, rule: _Rule, desired: int, now: float) -> int:
        """Ray's ``_apply_delay_logic``: counter sign = direction, timestamp = first wish."""
        cur = self.ray_target[n]
        decision = cur
        counter, stamp = self.counter.get(n, 0), self.stamp.get(n)
        if desired > cur:
            if counter < 0:
                counter, stamp = 0, None
            counter += 1
            stamp = now if stamp is None else stamp
            if now - stamp + 1e-6 >= rule.upscale_delay_s:
                counter, stamp, decision = 0, None, desired
        elif desired < cur:
            if counter > 0:
                counter, stamp = 0, None
            counter -= 1
            desired = max(1, desired)
            stamp = now if stamp is None else stamp
            if now - stamp + 1e-6 >= rule.downscale_delay_s:
                counter, stamp, decision = 0, None, desired
        else:
            counter, stamp = 0, None
        self.counter[n], self.stamp[n] = counter, stamp
        return decision

    def decide(self, obs: Observation) -> Decision | None:
        now = obs.now
        # this loop runs per model per tick: names looked up once
        seen, rules, samples, ray_target, value = obs.models, self.rules, self.samples, self.ray_target, itemgetter(1)
        pending, counter, stamp = self.pending_since, self.counter, self.stamp
        for m in self.models:
            n = m.name
            o, rule = seen[n], rules[n]
            cur = ray_target.setdefault(n, o.target_replicas)
            q = samples[n]
            every = rule.metrics_interval_s
            if not q or every is None or now - q[-1][0] + 1e-6 >= every:
                q.append((now, o.ongoing_per_replica * o.replicas))
            oldest = now - rule.look_back_period_s
            while len(q) > 1 and q[0][0] <= oldest:
                q.popleft()
            total = sum(map(value, q)) / len(q)  # the samples' values in order, as a generator would
            running = o.replicas
            desired = cur if running == 0 else total / rule.target_ongoing_requests
            wish = max(0, self._scaled(rule, desired, running))
            if wish == cur:  # no change wished: what _delay does then, without the call
                counter[n], stamp[n] = 0, None
                final = wish
            else:
                final = self._delay(n, rule, wish, now)
            ray_target[n] = target = m.clamp(final)
            if target > o.target_replicas:  # Ray's target above what runs = pending replicas
                pending.setdefault(n, now)
            else:
                pending.pop(n, None)
        # Replicas already pending when CPUs free up take them in turn; a new wish takes
        # what is free at once, first come first served (Ray starts a replica as soon as its
        # request finds room). Both as seen live (docs/compare.md).
        current = {n: o.target_replicas for n, o in obs.models.items()}
        if all(self.ray_target[n] == current[n] for n in self.ray_target):
            return None  # nothing pending, nothing to change: what the grants below would say
        waiting = sorted((n for n, t in self.pending_since.items() if t < now), key=self.pending_since.__getitem__)
        fresh = [n for n in self.pending_since if self.pending_since[n] >= now]
        granted = grant_in_order(
            dict(self.ray_target), current, self.models, obs.capacity, order=waiting, interleave=True
        )
        granted = grant_in_order(
            {n: self.ray_target[n] for n in fresh}, granted, self.models, obs.capacity, order=fresh
        )
        changed = {n: granted[n] for n in granted if granted[n] != current[n]}
        if not changed:
            return None
        return Decision(changed, {}, "reactive", {"ray_target": dict(self.ray_target)})
