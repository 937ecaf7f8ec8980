"""Faro's surge response and the surge plan (ours, beyond the paper; issues 18 and 31).

* **Surge** (after Knative's panic mode; ``ClusterSpec.surge``): a model whose last tick's
  rate is ``surge_factor`` (2) x both what its target replicas serve within the SLO and its
  last minute's rate gets at once the replicas that rate and its queue need, within free
  capacity; it only adds, and acts again only when the rate doubles over what the new target
  serves. A new deployment (``is_new``: its first minute or so) has no last minute to
  compare with: it surges as soon as its rate exceeds what its target serves. A plan's
  targets are judged so too: a plan does not cut a surging model below that need.
* **Surge plan** (``ClusterSpec.surge_plan``, issue 31 item 4): when the surging models'
  needs do not all fit in what the cluster has free (a full cluster, or every model of a new
  deployment surging at once), granting them in turn gives the first ones all and the last
  nothing. Instead the whole cluster is planned at once by the engine, with each surging or
  new model's forecast re-levelled to the rate it has now (a surging one's queue drained
  over a minute), so the objective shares the capacity. At most one per ``replan_gap_s``
  after the last plan (unless that plan was blind: no model had history), and none under
  heavy overload (``guard.heavy_overload``); otherwise the greedy grant as before.

A mixin of :class:`~autoscaler.faro.hybrid.FaroPolicy`: the same code live and in the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from autoscaler.contract.policy import STARTUP_MINUTES, Decision, ModelObservation, Observation, Policy, grant_in_order
from autoscaler.faro.guard import heavy_overload
from autoscaler.faro.replan import relevel
from autoscaler.policies.common import Timers
from autoscaler.policies.service import service_of

if TYPE_CHECKING:
    import numpy as np

    from faro_serve.config import ClusterSpec, ModelSLO

SURGE_PLAN_SEED = 2_000_003  # surge plans' forecasts draw from seeds of their own


def is_new(o: ModelObservation) -> bool:
    """A new deployment: its history is at most the start's (``driver.with_open_minute``:
    fewer than two minutes, the open one extrapolated), about its first 70 s. Its last
    "minute" is then the rate now, so the surge rule cannot compare with it."""
    return len(o.arrivals_per_min) < STARTUP_MINUTES


class SurgeAware(Policy):
    """The surge rule and the surge plan: a mixin of FaroPolicy, whose parts it uses are
    declared below for the type checker (a policy's ``slo``, ``cluster``, ``tick_s``,
    ``models`` and ``pipelines`` come from Policy)."""

    if TYPE_CHECKING:  # FaroPolicy's (hybrid.py), which imports this module
        violating: Timers
        surge_hold: dict[str, float]
        last_long_term: float
        last_replan: float
        planned_blind: bool

        def forecast_samples(
            self, obs: Observation, seed: int | None = None
        ) -> tuple[dict[str, np.ndarray], dict[str, str]]: ...
        def _plan(
            self,
            obs: Observation,
            samples: dict[str, np.ndarray],
            predictor: dict[str, str],
            kind: str,
            models: Sequence[ModelSLO] | None = None,
            cluster: ClusterSpec | None = None,
        ) -> Decision: ...
        def _keep_saturated(self, d: Decision, obs: Observation) -> list[str]: ...
        def with_larger_batches(self, obs: Observation, due: list[str], d: Decision | None) -> Decision | None: ...

    @staticmethod
    def rate_now(o: ModelObservation) -> float:
        """A model's arrival rate now (req/s): the last tick's; for a new model at least its
        open minute's so far (``with_open_minute``), which live counts from the meter's start
        while the first tick's 10 s window may hold only the seconds since the load began."""
        if is_new(o) and len(o.arrivals_per_min):
            return max(o.arrival_rate, float(o.arrivals_per_min[-1]) / 60.0)
        return o.arrival_rate

    def surge_rate(self, o: ModelObservation) -> float:
        """The rate a surging model needs served (req/s): its arrivals now and its queue
        drained within one more tick."""
        return self.rate_now(o) + o.queue_length / self.tick_s

    def surge_need(self, obs: Observation, targets: dict[str, int] | None = None) -> dict[str, int]:
        """Surging models (module docstring) with the replicas their rate and queue need:
        enough to drain the queue within one more tick. ``targets``: the replicas to judge
        (default: the current targets; with_surge passes a decision's)."""
        out = {}
        for n, o in obs.models.items():
            m = self.slo[n]
            rate = self.rate_now(o)
            if rate <= 0:
                continue
            # a surge is a change: a model the plan keeps short on purpose in an overloaded
            # cluster is not surging (its rate was already there a minute ago); a new model
            # has no minute before, so any excess over what it has is one
            before = float(o.arrivals_per_min[-1]) / 60.0 if len(o.arrivals_per_min) else 0.0
            new = is_new(o) and self.cluster.surge_new
            if not new and rate < self.cluster.surge_factor * before:
                continue  # no surge whatever its replicas serve (most models, most ticks)
            svc = service_of(m, o)  # one at a time, k at once or in batches (service.py)
            target = o.target_replicas if targets is None else targets.get(n, o.target_replicas)
            served = svc.max_rate(max(target, 1), self.cluster)
            if new:
                if rate <= served:
                    continue
            elif rate < self.cluster.surge_factor * max(served, before):
                continue
            out[n] = svc.replicas_for(self.surge_rate(o), self.cluster)
        return out

    def with_surge(self, obs: Observation, decision: Decision | None) -> Decision | None:
        """Add the surge rule's replicas to ``decision`` (or to the current targets), within
        the capacity the decision leaves free; the largest shortfall first. When they do not
        all fit, a surge plan instead (module docstring), if one is due."""
        if not self.cluster.surge:
            return decision
        current = {n: o.target_replicas for n, o in obs.models.items()}
        after = {**current, **(decision.replicas if decision else {})}
        # judged at the decision's targets: a plan whose forecast lags a step in load (the
        # minute history does not hold it yet) does not cut what the rate seen now needs
        need = {n: r for n, r in self.surge_need(obs, after).items() if r > after[n]}
        if not need:
            return decision
        order = sorted(need, key=lambda n: after[n] / need[n])
        granted = grant_in_order(need, after, self.models, obs.capacity, order=order)
        if any(granted[n] < need[n] for n in need) and self._surge_plan_due(obs):
            return self.surge_plan(obs, need, {n: granted[n] for n in need})
        added = {n: granted[n] for n in order if granted[n] > after[n]}
        if not added:
            return decision
        self._hold(obs, added)
        info = {
            n: {"rate_rps": round(self.rate_now(obs.models[n]), 3), "need": need[n], "from": after[n], "to": added[n]}
            for n in added
        }
        if decision is None:
            decision = Decision(added, {}, "surge", {"surge": info})
        else:
            for n, r in added.items():
                decision.set(n, replicas=r)
            decision.info["surge"] = info
            if decision.kind == "reactive":
                decision.kind = "surge"
        # the replicas were sized at the largest batch (service_of): a flat curve's model
        # serving smaller batches gets its largest at once, as the reactive step gives it,
        # unless this decision sets its batch already (issue 47)
        unset = [n for n in added if decision.settings[n].batch_size is None]
        return self.with_larger_batches(obs, unset, decision)

    def _hold(self, obs: Observation, models: Iterable[str]) -> None:
        for n in models:
            # the 30 s look-back still holds the surge's slow requests once the new replicas
            # serve: the reactive trigger waits for them to age out before it counts again
            self.violating.update(n, False, obs.now)
            self.surge_hold[n] = obs.now + self.cluster.cold_start_s + self.cluster.reactive_trigger_s

    def _surge_plan_due(self, obs: Observation) -> bool:
        """Not within ``replan_gap_s`` of the last surge plan or re-plan, nor of the last
        long-term plan unless that one planned blind (no model had a minute of history); not
        under heavy overload, where re-planning at the rates seen now chases misses no share
        can avoid (day 10 at 16 replicas, seed 1: 5.13 -> 5.39 with it)."""
        c = self.cluster
        gap = c.replan_gap_s - 1e-9
        return (
            c.surge_plan
            and not self.pipelines
            and obs.now - self.last_replan >= gap
            and (self.planned_blind or obs.now - self.last_long_term >= gap)
            and not heavy_overload(obs, self.slo, c)
        )

    def surge_plan(self, obs: Observation, need: dict[str, int], granted: dict[str, int]) -> Decision:
        """Plan the whole cluster with the surging (``need``) and new models' forecasts
        re-levelled to their rates now (``granted``: what the greedy grant would
        have given, for the decision log)."""
        samples, predictor = self.forecast_samples(obs, seed=SURGE_PLAN_SEED + int(obs.now))
        levels = {}
        for n, o in obs.models.items():
            if n in need:  # its queue drained over a minute, not one tick: a plan is for a window
                levels[n] = self.rate_now(o) + o.queue_length / 60.0
            elif is_new(o) and self.rate_now(o) > 0:
                levels[n] = self.rate_now(o)
        for n, rate in levels.items():
            samples[n] = relevel(samples[n], rate)
            predictor[n] = f"{predictor.get(n, '?')} (re-levelled to {rate:.3f} req/s)"
        d = self._plan(obs, samples, predictor, "surge-plan")  # not overloaded: no guard
        saturated = self._keep_saturated(d, obs)
        self.last_replan = obs.now
        current = {n: o.target_replicas for n, o in obs.models.items()}
        self._hold(obs, [n for n, r in d.replicas.items() if r > current.get(n, r)])
        planned = d.replicas
        d.info["surge"] = {
            n: {"rate_rps": round(levels[n], 3), "need": need[n], "from": current[n], "to": planned.get(n, current[n])}
            for n in need
        }
        d.info["surge_plan"] = {
            "greedy": granted,
            "new": sorted(n for n, o in obs.models.items() if is_new(o)),
            "kept_saturated": saturated,
        }
        return d
