"""The comparison systems' autoscalers as policies: Swayam, INFaaS and (from
``autoscaler/policies/inferline.py``) InferLine.

Condensed from ``seed-notes.md``; each "[gap]" the papers leave open is decided here, in the
class docstring, and is a constructor parameter. All three scale every job on its own and
share a fixed cluster first come first served (``grant_in_order``), like the baselines.

What every adaptation shares: the meter exports per-tick aggregates (arrival rate,
latency percentile, mean processing time), not per-request timestamps, and decisions run
at the driver's tick (10 s) rather than each system's own period (INFaaS: 1 s).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from autoscaler.contract.policy import Decision, ModelObservation, Observation, Policy
from autoscaler.policies.common import fcfs_decision, processing_s, saturation_rate
from autoscaler.policies.common import replicas_for_slo as _replicas_for
from autoscaler.policies.inferline import InferLineTunerPolicy
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine.variants import Option
from faro_serve.engine.variants import options as variant_options
from faro_serve.engine.variants import scale_down as variant_scale_down
from faro_serve.engine.variants import scale_up as variant_scale_up
from faro_serve.engine.variants import select as variant_select


class SwayamPolicy(Policy):
    """Swayam (Middleware '17): model-based instance count for a predicted, burst-padded rate.

    Per job and tick: linear regression over the past ``history_s`` (500 s) of per-tick
    arrival rates predicts the rate ``t_setup`` ahead, averaged over ``average_s`` (100 s)
    (the line's mean over the 100 s ending at now + t_setup), times the burst factor ``U``
    (2). ``n_B`` = fewest replicas whose ``SL_min`` (99) percentile response time is within
    ``RT_max``. Scale-up at once; scale-down only to the largest ``n_B`` of the last
    ``regulation_s`` + ``idle_gc_s`` (10 + 5 min): the lower count must hold 10 min before
    frontends stop using the extra backends, which then idle 5 min before collecting.

    [gap] response-time model: Swayam's waiting-time formula assumes random dispatch with
    retry; Ray Serve's router is one FIFO queue, so the honest adaptation is the engine's
    M/D/c percentile (Erlang-C waiting time / 2 + processing), not the random-dispatch one.
    [gap] t_setup = the cluster's cold start (65 s), our provisioning-time upper bound (the
    paper assumed 10 s). [gap] RT_max = the job's SLO (the paper's default 5 x mean service
    time is a default for when the user gives none; here the SLO is given), SL_min = the
    SLO percentile. [gap] with fewer than 3 points the regression is the last rate.
    """

    name = "swayam"
    state_fields = ("rates", "wishes", "rising_since")

    def __init__(
        self,
        models: Sequence[ModelSLO],
        cluster: ClusterSpec,
        *,
        burst: float = 2.0,
        history_s: float = 500.0,
        average_s: float = 100.0,
        t_setup_s: float | None = None,
        regulation_s: float = 600.0,
        idle_gc_s: float = 300.0,
    ):
        super().__init__(models, cluster)
        self.burst = burst
        self.history_s = history_s
        self.average_s = average_s
        self.t_setup = cluster.cold_start_s if t_setup_s is None else t_setup_s
        self.hold_s = regulation_s + idle_gc_s
        self.rates: dict[str, deque[tuple[float, float]]] = {m.name: deque() for m in self.models}
        self.wishes: dict[str, deque[tuple[float, int]]] = {m.name: deque() for m in self.models}
        self.rising_since: dict[str, float] = {}

    def predict(self, name: str, now: float) -> float:
        pts = self.rates[name]
        if not pts:
            return 0.0
        if len(pts) < 3:
            return pts[-1][1]
        t = np.array([p[0] for p in pts]) - now
        r = np.array([p[1] for p in pts])
        slope, icpt = np.polyfit(t, r, 1)
        mid = self.t_setup - self.average_s / 2.0  # mean of the line over the 100 s window
        return max(0.0, float(icpt + slope * mid))

    def decide(self, obs: Observation) -> Decision | None:
        now = obs.now
        wanted, info = {}, {}
        for m in self.models:
            o = obs.models[m.name]
            pts = self.rates[m.name]
            if now > 0:
                pts.append((now, o.arrival_rate))
            while pts and pts[0][0] < now - self.history_s:
                pts.popleft()
            lam = self.burst * self.predict(m.name, now)
            p = processing_s(m, o.processing_ms)
            n_b = _replicas_for(lam, p, m.slo_ms / 1e3, m.percentile / 100.0, m)
            w = self.wishes[m.name]
            w.append((now, n_b))
            while w and w[0][0] < now - self.hold_s:
                w.popleft()
            cur = o.target_replicas
            if n_b > cur:
                wanted[m.name] = n_b
                self.rising_since.setdefault(m.name, now)
            else:
                self.rising_since.pop(m.name, None)
                keep = max(v for _, v in w)
                if keep < cur:
                    wanted[m.name] = keep
            info[m.name] = n_b
        if not wanted:
            return None
        order = sorted((n for n in wanted if n in self.rising_since), key=self.rising_since.__getitem__)
        return fcfs_decision(self.models, obs, wanted, order, "reactive", {"n_B": info})


class INFaaSPolicy(Policy):
    """INFaaS's model-autoscaler (ATC '21).

    Headroom = saturation throughput of the running instances / load; below the slack
    threshold (1.05) replicate up to ``ceil(1.05 load / Q)`` instances. Scale down by one
    instance when the load fits one fewer (headroom with n - 1 still >= slack) for ``T_v``
    consecutive seconds, ``T_v`` = the variant's load latency.

    A model that declares ``variants`` gets INFaaS's variant choices as well
    (``faro_serve.engine.variants``): the variant with the lowest loading plus inference
    latency among those meeting its accuracy target and SLO, then on a shortfall *replicate*
    or *upgrade* (a higher-throughput batch of the same architecture) by cost, and on a
    surplus one instance fewer or a *downgrade* to a lower batch. The decision names the
    variant (the setting's ``variant``) and, for one that batches, its batch.

    [gap] without variants a job has one variant (ResNet34, batch 1, one CPU type), so
    "upgrade" never applies and every scale-up replicates. [gap] saturation throughput Q =
    1 / mean processing time (profiled peak at batch 1; INFaaS counts on variant choice,
    not headroom, for latency). [gap] load = the router's arrival rate over the last tick:
    the rate a replica serves is capped by its saturation and would hide an overload.
    [gap] T_v = the cluster's cold start (65 s), checked at every tick (10 s) instead of 1 s
    slots. Instances still loading count as running (INFaaS counts them once loading).
    [gap] one variant serves a model at a time (INFaaS may run several side by side).
    """

    name = "infaas"
    state_fields = ("fits_since", "short_since", "option")

    def __init__(
        self, models: Sequence[ModelSLO], cluster: ClusterSpec, *, slack: float = 1.05, t_v_s: float | None = None
    ):
        super().__init__(models, cluster)
        self.slack = slack
        self.t_v = cluster.cold_start_s if t_v_s is None else t_v_s
        self.fits_since: dict[str, float] = {}
        self.short_since: dict[str, float] = {}
        self.options = {m.name: variant_options(m, cluster.cold_start_s) for m in models if m.variants}
        self.option: dict[str, list[str | int]] = {}  # model -> [variant, batch] in force (variants only)

    def decide(self, obs: Observation) -> Decision | None:
        now = obs.now
        wanted: dict[str, int] = {}
        chosen: dict[str, Option] = {}
        for m in self.models:
            o = obs.models[m.name]
            if m.name in self.options:
                self._variant_step(m, o, now, wanted, chosen)
            else:
                self._step(m, o, now, wanted)
        order = sorted(self.short_since, key=self.short_since.__getitem__)
        dec = fcfs_decision(self.models, obs, wanted, order, "reactive") if wanted else None
        if chosen:
            dec = dec or Decision({}, {}, "reactive")
            for n, opt in chosen.items():
                dec.set(n, variant=opt.variant)
                if opt.batch > 1 or self._batches(self.slo[n]):
                    dec.set(n, batch_size=opt.batch)
            dec.info["variants"] = {n: f"{opt.variant} batch {opt.batch}" for n, opt in chosen.items()}
        return dec

    @staticmethod
    def _batches(m: ModelSLO) -> bool:
        return any(v.batching for v in m.variants or ())

    def _step(self, m: ModelSLO, o: ModelObservation, now: float, wanted: dict[str, int]) -> None:
        q_sat = saturation_rate(m, o.processing_ms)
        self._scale(m, o.arrival_rate, o.target_replicas, q_sat, now, wanted, self.t_v)

    def _scale(
        self, m: ModelSLO, load: float, n: int, q_sat: float, now: float, wanted: dict[str, int], t_v: float
    ) -> None:
        """Replicate on a shortfall; one instance fewer after ``t_v`` of surplus."""
        if load > 0 and n * q_sat / load < self.slack:
            wanted[m.name] = m.clamp(math.ceil(self.slack * load / q_sat - 1e-9))
            self.short_since.setdefault(m.name, now)
            self.fits_since.pop(m.name, None)
            return
        self.short_since.pop(m.name, None)
        fits = n > m.min_replicas and (load == 0 or (n - 1) * q_sat / load >= self.slack)
        if not fits:
            self.fits_since.pop(m.name, None)
            return
        t0 = self.fits_since.setdefault(m.name, now)
        if now - t0 >= t_v - 1e-9:
            wanted[m.name] = n - 1
            self.fits_since[m.name] = now

    def _variant_step(
        self, m: ModelSLO, o: ModelObservation, now: float, wanted: dict[str, int], chosen: dict[str, Option]
    ) -> None:
        opts = self.options[m.name]
        if m.name not in self.option:  # nothing chosen yet: INFaaS's selection
            first = variant_select(opts)
            self.option[m.name] = [first.variant, first.batch]
            chosen[m.name] = first
        cur = next(x for x in opts if [x.variant, x.batch] == self.option[m.name])
        load, n = o.arrival_rate, o.target_replicas
        if load > 0 and n * cur.throughput / load < self.slack:
            opt, k, _ = variant_scale_up(opts, cur, n, load, self.slack)
            wanted[m.name] = m.clamp(k)
            self.short_since.setdefault(m.name, now)
            self.fits_since.pop(m.name, None)
        else:
            self.short_since.pop(m.name, None)
            down = variant_scale_down(opts, cur, n, load, self.slack) if n > 0 else None
            if down is not None and down[1] < m.min_replicas:
                down = None
            if down is None:
                self.fits_since.pop(m.name, None)
                return
            t0 = self.fits_since.setdefault(m.name, now)
            if now - t0 < cur.load_s - 1e-9:  # T_v: the variant's loading latency
                return
            self.fits_since[m.name] = now
            opt, k, _ = down
            wanted[m.name] = k
        if opt != cur:
            self.option[m.name] = [opt.variant, opt.batch]
            chosen[m.name] = opt


# This module's built-in policies as data, (name, factory, summary, needs_batching,
# forecasts), which autoscaler/catalogue/builtin.py lists: the policy modules never import the registry.
POLICIES = (
    (
        "swayam",
        lambda models, cluster, forecaster=None: SwayamPolicy(models, cluster),
        "Swayam: per model, replicas for a regression-predicted, burst-padded rate; up at "
        "once, down only to the most needed in the last 15 min",
        False,
        False,
    ),
    (
        "inferline",
        lambda models, cluster, forecaster=None: InferLineTunerPolicy(models, cluster),
        "InferLine's tuner: up at once when the traffic envelope exceeds the plan's, down after 15 s of calm",
        False,
        False,
    ),
    (
        "infaas",
        lambda models, cluster, forecaster=None: INFaaSPolicy(models, cluster),
        "INFaaS: replicate when headroom falls below 1.05 x the load, one fewer once the "
        "load fits for a load time (one variant)",
        False,
        False,
    ),
)
