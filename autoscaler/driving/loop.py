"""The live autoscaler's control loop, Ray-free (paper sections 4.4 and 5).

Every tick it reads the cluster through a
:class:`~autoscaler.driving.cluster_adapter.ClusterAdapter` (meter metrics,
running replicas, capacity), builds the policy's :class:`~autoscaler.contract.policy.Observation`,
lets the policy decide, applies the decision (replica targets, drop rates) and logs it as
one JSON line. Observing and applying are the simulator's own code (``driver.py``). The Ray
Serve adapter and deployment live in ``faro_serve/serving/autoscaler_deployment.py``; tests
drive this loop with a fake adapter and a fake clock.

On a restart the loop resumes from the cluster as it is: the targets start at the running
replica counts (never below a model's minimum), and the metric history is the meters'.
The policy sees the same inputs as in the simulator (``faro_serve.sim.runner``): completed
per-minute arrivals, the SLO-percentile latency over the last 30 s, mean processing time.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from autoscaler.catalogue.registry import make_policy
from autoscaler.contract.policy import Decision, Observation, Policy
from autoscaler.contract.setting import Setting, field_map
from autoscaler.driving.cluster_adapter import ClusterAdapter, StateStore, capped_capacity
from autoscaler.driving.decision_log import Doc, tick_record, write_record
from autoscaler.driving.driver import MeterSnapshot, apply_decision, decide, observe
from autoscaler.driving.forecasters import set_daily, set_recurrence
from autoscaler.driving.history import HistoryKeeper
from autoscaler.driving.loop_config import AutoscalerConfig
from autoscaler.driving.loop_retraining import loop_retrainer, swap_in
from autoscaler.driving.pipeline_meters import observe_pipelines, sync_pipeline_meters
from autoscaler.driving.retrainer import Retrainer
from forecasting.base import Forecaster
from forecasting.store import HistorySource

log = logging.getLogger("faro_serve.autoscaler")
# a model named in the config but not running (yet, or by a typo in its app/deployment) holds
# back the plan this long after a start; then the running models are planned without it
MISSING_GRACE_S = 60.0
STATE_VERSION = 2  # 2: settings per model (issue 33)


def history_length(n_models: int) -> int:
    """Decision records kept in memory (GET /faro/decisions): each holds every model (~1.3 MB
    at 1,000 models, issue 36), so 500 up to 100 models, 50,000 model entries beyond, >= 20."""
    return max(20, min(500, 50_000 // max(n_models, 1)))


class AutoscalerLoop:
    """``previous``: the loop this one replaces after a config change (same process);
    ``store``: the state saved by a loop that stopped (a restart), restored when it is
    the same policy over the same models and at most ``max_state_age_s`` old;
    ``history``: the durable per-minute arrival store (``forecasting.store.ArrivalStore``)
    the meters' minutes are written to and a shorter meter history is completed from
    (``autoscaler.driving.history``; issue 32)."""

    def __init__(
        self,
        cfg: AutoscalerConfig,
        cluster: ClusterAdapter,
        forecaster: Forecaster | None = None,
        clock: Callable[[], float] = time.time,
        previous: "AutoscalerLoop | None" = None,
        store: StateStore | None = None,
        history: HistorySource | None = None,
    ) -> None:
        self.cfg = cfg
        self.cluster = cluster
        self.clock = clock
        self.store = store
        self.models = cfg.all_models  # single models, then every pipeline's stages
        set_daily(forecaster, cfg.daily)  # an N-HiTS's daily context and recurring peaks,
        set_recurrence(forecaster, cfg.recurrence_share)  # as the args say
        self.policy = make_policy(cfg.policy_name(), self.models, cfg.cluster, forecaster, pipelines=cfg.pipelines)
        self.slo = {m.name: m for m in self.models}
        self.start: float = previous.start if previous else clock()
        # every model's setting in force: its target replicas (starting ones included), drop
        # rate, and what a policy set of batch size, threads and variant (autoscaler.contract.setting)
        self.settings: dict[str, Setting] = (
            {n: s for n, s in previous.settings.items() if n in self.slo} if previous else {}
        )
        self.history: deque[Doc] = deque(previous.history if previous else (), maxlen=history_length(len(self.models)))
        self.last: Doc = {}
        # shadow mode (issue 48): the setting the loop would have in force after its last
        # decision, from what ran when it decided; nothing of it reaches the cluster
        self.shadow = cfg.mode == "shadow"
        self.advice: dict[str, Setting] = (
            {n: s for n, s in previous.advice.items() if n in self.slo} if previous else {}
        )
        self.last_plan: dict[str, Doc] = previous.last_plan if previous else {}
        self.ticks = 0
        self.keeper: HistoryKeeper | None = HistoryKeeper.carry_on(
            history, previous.keeper if previous else None, cfg.history_minutes()
        )
        self.retrainer: Retrainer | None = loop_retrainer(
            cfg,
            self.keeper,
            self.policy,
            [m.name for m in self.models],
            previous.retrainer if previous else None,
            clock,
        )
        self.restored_settings: dict[str, Setting] = {}  # saved before a restart, by model
        self.meter_errors: dict[str, str] = {}  # models whose report was refused this tick
        self._partial: tuple[list[str], Policy] | None = None  # _policy_for's last
        self.not_running: dict[str, str] = {}  # models of the config not running: why
        self._deployed_at: dict[str, float | None] = {}  # model -> when its app was deployed (last look)
        self.pipeline_meters: dict[str, MeterSnapshot] = {}  # each pipeline's ingress meter
        self.restored: Doc | None = None  # where the state came from, for the status
        if previous is not None:
            self._resume(previous.state(), "the previous configuration")
        elif store is not None:
            try:
                saved = store.load()
            except Exception as err:  # no store yet, or it cannot be reached: start afresh
                log.warning("cannot read the saved autoscaler state: %s", err)
                saved = None
            if saved:
                self._resume(saved, "the state saved before a restart", restart=True)

    @property
    def max_state_age_s(self) -> float:
        """Older saved state is stale (its timers describe another load): start afresh."""
        return max(2 * self.cfg.cluster.long_term_interval_s, 600.0)

    def state(self) -> Doc:
        """Everything a restarted loop needs to carry on, JSON-able."""
        return {
            "version": STATE_VERSION,
            "saved_at": self.clock(),
            "start": self.start,
            # the targets are not saved: a restart resumes them from the running replicas
            "settings": {
                n: {k: v for k, v in s.to_json().items() if k != "replicas"} for n, s in self.settings.items()
            },
            "last_plan": self.last_plan,
            "policy": self.policy.get_state(),
        }

    def _resume(self, saved: Doc, source: str, restart: bool = False) -> None:
        age = self.clock() - float(saved.get("saved_at", -math.inf))
        if restart and not age <= self.max_state_age_s:
            log.info("saved autoscaler state is %.0f s old: starting afresh", age)
            return
        try:
            self.policy.set_state(saved["policy"])
        except (KeyError, TypeError, ValueError) as err:  # another policy or model set
            log.info("not resuming from %s: %s", source, err)
            return
        if restart:
            self.start = float(saved["start"])  # the policy's timers run on this clock
            try:
                self.restored_settings = self._saved_settings(saved)
            except ValueError as err:  # a state this version cannot read: the meters' defaults
                log.warning("not restoring the saved settings: %s", err)
            self.last_plan = saved.get("last_plan") or {}
        self.restored = {"from": source, "saved_at": saved.get("saved_at"), "age_s": round(age, 3)}
        log.info("resumed %s from %s (%.1f s old)", self.policy.name, source, age)

    def _saved_settings(self, saved: Doc) -> dict[str, Setting]:
        """The saved settings (replicas aside) of the models this config still runs, each
        clamped to the model's config as it is now; a field the model no longer takes (a
        batch size after its batching was removed) is left out."""
        docs = saved.get("settings")
        if not isinstance(docs, dict):
            raise ValueError(f"a state of version {saved.get('version')} keeps no per-model settings")
        out = {}
        for n, doc in docs.items():
            if n not in self.slo:
                continue
            s = Setting.from_json(doc, f"saved setting of {n}")
            kept = {}
            for f, v in s.set_fields().items():
                try:
                    kept.update(Setting(**{f: v}).clamp(self.slo[n]).set_fields())
                except ValueError as err:
                    log.info("not restoring %s: %s", f, err)
            out[n] = Setting(**kept)
        return out

    @property
    def acting(self) -> bool:
        """Whether the loop changes the cluster: enabled, and not in shadow mode."""
        return self.cfg.enabled and not self.shadow

    @property
    def targets(self) -> dict[str, int]:
        """Every model's target replicas."""
        return field_map(self.settings, "replicas")

    @property
    def tick_s(self) -> float:
        return self.policy.tick_s

    def _observe(self, now: float) -> tuple[Observation, dict[str, MeterSnapshot]]:
        running = self.cluster.running_replicas()
        names = [m.name for m in self.models if m.name in running]
        why = getattr(self.cluster, "absent", {})
        self.not_running = {m.name: why.get(m.name, "not deployed") for m in self.models if m.name not in running}
        # a malformed report (or replicas reserving other CPUs than the SLO's) is logged and
        # left out: that model is planned as one whose meter did not answer (meter_report.py)
        raw = self.cluster.meter_reports(names)
        meters, self.meter_errors = MeterSnapshot.read_meters(raw, self.slo)
        piped, self.pipeline_meters, errors = observe_pipelines(self.cluster, self.cfg.pipelines, running)
        self.meter_errors.update(errors)
        if self.keeper is not None:  # the store's minutes before a shorter meter history
            meters = self.keeper.observe_safely(now, raw, meters)
        cap = capped_capacity(self.cfg.cluster, self.cluster.capacity())
        for n in names:
            if n not in self.settings:  # (re)start: resume from what is running
                restored = self.restored_settings.get(n, Setting())
                self.settings[n] = Setting(replicas=running[n], drop_rate=0.0).merged(restored)
            elif self.shadow:  # the cluster's own autoscaling decides what runs
                self.settings[n] = self.settings[n].merged(Setting(replicas=running[n]))
        if self.acting:
            self._rescale_redeployed(names)
            self._enforce_bounds(names)
        snaps = {n: meters.get(n) or MeterSnapshot(np.zeros(0)) for n in names}
        obs = observe(
            now - self.start,
            cap,
            None,
            snaps,
            running,
            self.settings,
            slo_s={n: self.slo[n].slo_ms / 1e3 for n in names},
        )
        obs.pipelines = piped
        return obs, meters

    def step(self) -> Doc:
        """One tick: observe, decide, apply, log. Returns the tick's record."""
        now = self.clock()
        if self.retrainer is not None:
            swap_in(self.retrainer, self.policy, self.cfg)
        obs, meters = self._observe(now)
        self.ticks += 1
        decision = None
        if self.cfg.enabled and obs.models:
            missing = [m.name for m in self.models if m.name not in obs.models]
            if missing:  # plan only for what is deployed; the policy wants every model
                log.warning(
                    "models not running: %s",
                    "; ".join(f"{n} ({self.not_running.get(n, 'not deployed')})" for n in missing),
                )
                if now - self.start >= MISSING_GRACE_S:  # the others are planned without them
                    decision = decide(self._policy_for(sorted(obs.models)), obs)
            else:
                decision = decide(self.policy, obs)  # as the simulator drives it
        if decision is not None:
            self._apply(decision, obs)
        if self.acting:
            self._sync_meters(obs, meters)
            sync_pipeline_meters(self.cluster, self.cfg.pipelines, self.pipeline_meters)
        record = self._record(now, obs, decision, meters)
        self.last = record
        if decision is not None:
            self.history.append(record)
            self._log(record)
        if self.store is not None:
            try:
                self.store.save(self.state())
            except Exception as err:  # the next tick saves again
                log.warning("cannot save the autoscaler state: %s", err)
        return record

    def _rescale_redeployed(self, names: list[str]) -> None:
        """A model application deployed again (``serve deploy`` of a changed config) comes
        back with Ray's ``initial_replicas``, while our target stands: tell Serve our target
        at once, not when a plan next changes it (issue 50). The cluster says when each
        model's application was last deployed (``deployed_at``; a simulated one does not)."""
        deployed = getattr(self.cluster, "deployed_at", {})
        for n in names:
            at, seen, r = deployed.get(n), self._deployed_at.get(n), self.settings[n].replicas
            if at is not None and seen is not None and at != seen and r:
                log.info("%s was redeployed: scaling it back to %d replicas", n, r)
                self.cluster.scale(n, r)
            self._deployed_at[n] = at

    def _enforce_bounds(self, names: list[str]) -> None:
        """Scale a model whose target lies outside its SLO's replica bounds into them, at
        once: after a (re)start or a config that moved the bounds, no plan may change that
        model's target (a decision is clamped to the bounds too), so Serve would never hear
        of them. A refused scale fails the tick, and the next tick tries again. None running
        is left to the next decision (which differs from 0, so it scales): its replicas may be
        starting, and scaling to the minimum now could stop some of them."""
        for n in names:
            r = self.settings[n].replicas
            if r and r != (want := self.slo[n].clamp(r)):
                self.cluster.scale(n, want)
                self.settings[n] = self.settings[n].merged(Setting(replicas=want))

    def _policy_for(self, names: list[str]) -> Policy:
        """The policy over the running models only, while others named in the config are
        not running (a typo in an SLO's app or deployment must not stop the rest from being
        scaled); built once per set of names, with the full policy's forecaster."""
        if self._partial is None or self._partial[0] != names:
            models = [self.slo[n] for n in names]
            whole = [p for p in self.cfg.pipelines if set(p.stage_names) <= set(names)]
            self._partial = (
                names,
                make_policy(
                    self.cfg.policy_name(),
                    models,
                    self.cfg.cluster,
                    getattr(self.policy, "forecaster", None),
                    pipelines=whole,
                ),
            )
        return self._partial[1]

    def _sync_meters(self, obs: Observation, meters: dict[str, MeterSnapshot]) -> None:
        """Tell a meter the drop rate, target and SLO percentile where it differs from ours
        (after a decision, or when a restarted meter came back with defaults)."""
        for n in obs.models:
            f, want, pct = meters.get(n), self.settings[n], self.slo[n].percentile
            if f is not None and f.enforces(want, pct):
                continue
            try:
                self.cluster.control(n, want, pct)
            except Exception as err:  # a meter may be restarting
                log.warning("cannot reach the meter of %s: %s", n, err)

    def _apply(self, decision: Decision, obs: Observation) -> None:
        done = apply_decision(decision, self.settings, self.models, obs.capacity, policy=self.policy.name, now=obs.now)
        if decision.plan:  # what the status shows as predicted, until the next plan
            self.last_plan = {
                n: {"utility": round(p.utility, 4), "predictor": p.predictor, "latency_ms": p.latency_ms}
                for n, p in decision.plan.items()
            }
        if self.shadow:  # advise: the same decision, checked the same way, carried out nowhere
            self.advice = {n: self.settings[n].merged(done.changed.get(n, Setting())) for n in self.settings}
            return
        for n, r in done.changes:  # decreases first: they free what the increases take
            self.cluster.scale(n, r)
            self.settings[n] = self.settings[n].merged(Setting(replicas=r))
        # the other fields reach the meters through _sync_meters (the meter tells the replicas)
        self.settings = {n: self.settings[n].merged(done.changed.get(n, Setting())) for n in self.settings}

    def _record(
        self, now: float, obs: Observation, decision: Decision | None, meters: dict[str, MeterSnapshot] | None = None
    ) -> Doc:
        return tick_record(self, now, obs, decision, meters)

    def _log(self, record: Doc) -> None:
        log.info("decision %s", write_record(record, self.cfg.decision_log))

    def status(self) -> Doc:
        return {
            "policy": self.policy.name,
            "objective": self.cfg.cluster.objective,
            "enabled": self.cfg.enabled,
            "mode": self.cfg.mode,
            "ticks": self.ticks,
            "capacity_cpus": self.last.get("capacity_cpus"),
            "capacity": self.last.get("capacity"),
            "models": self.last.get("models", {}),
            **({"pipelines": self.last.get("pipelines", {})} if self.cfg.pipelines else {}),
            "last_decision": self.history[-1]["decision"] if self.history else None,
            "restored": self.restored,
            "meter_errors": dict(self.meter_errors),  # left out of the last tick, and why
            "not_running": dict(self.not_running),  # named in the config, not running: why
            **({"history": self.keeper.status()} if self.keeper is not None else {}),
            **({"retrain": self.retrainer.status()} if self.retrainer is not None else {}),
        }
