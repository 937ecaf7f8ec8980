"""The comparison systems' autoscalers as policies: Swayam, InferLine's tuner, INFaaS.

Condensed from ``seed-notes.md``; each "[gap]" the papers leave open is decided here, in the
class docstring, and is a constructor parameter. All three scale every job on its own and
share a fixed cluster first come first served (``grant_in_order``), like the baselines.

What every adaptation shares: the router front exports per-tick aggregates (arrival rate,
latency percentile, mean processing time), not per-request timestamps, and decisions run
at the driver's tick (10 s) rather than each system's own period (INFaaS: 1 s).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine.latency import min_replicas_for_slo
from faro_serve.engine.variants import options as variant_options
from faro_serve.engine.variants import scale_down as variant_scale_down
from faro_serve.engine.variants import scale_up as variant_scale_up
from faro_serve.engine.variants import select as variant_select

from .common import fcfs_decision, max_rate_one_replica, processing_s, saturation_rate
from .policy import Decision, Observation, Policy


def _replicas_for(lam: float, p: float, slo: float, q: float, m: ModelSLO) -> int:
    """Fewest replicas meeting the SLO at ``lam`` (engine M/D/c), clamped to the model's bounds."""
    if slo <= p or lam * p >= m.max_replicas * m.concurrency:
        return m.max_replicas
    try:
        n, _ = min_replicas_for_slo(max(lam, 0.0), p, slo, q, "mdc", limit=m.max_replicas,
                                    concurrency=m.concurrency)
    except ValueError:
        return m.max_replicas
    return m.clamp(n)


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

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec, *, burst: float = 2.0,
                 history_s: float = 500.0, average_s: float = 100.0, t_setup_s: float | None = None,
                 regulation_s: float = 600.0, idle_gc_s: float = 300.0):
        super().__init__(models, cluster)
        self.burst = burst
        self.history_s = history_s
        self.average_s = average_s
        self.t_setup = cluster.cold_start_s if t_setup_s is None else t_setup_s
        self.hold_s = regulation_s + idle_gc_s
        self.rates: dict[str, deque] = {m.name: deque() for m in self.models}
        self.wishes: dict[str, deque] = {m.name: deque() for m in self.models}
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
        order = sorted((n for n in wanted if n in self.rising_since), key=self.rising_since.get)
        return fcfs_decision(self, obs, wanted, order, "reactive", {"n_B": info})


class InferLineTunerPolicy(Policy):
    """InferLine's high-frequency tuner (SoCC '20), one single-model pipeline per job.

    Traffic envelope: for windows ``dT_i`` doubling from the smallest observable one up to
    60 s, ``r_i`` = the most arrivals in any window of that width, per second. Scale up when
    an ``r_i`` of the recent ``envelope_s`` (120 s) exceeds the planner's sample envelope:
    ``k = ceil(r_max / (mu rho))`` (s_m = 1, one model per pipeline), ``mu = concurrency /
    processing time``. Scale down only when nothing changed for 15 s, to
    ``ceil(lambda_new / (mu rho))`` with ``lambda_new`` the highest rate of the last 30 s.

    [gap] smallest window: the router reports counts per tick, so the envelope starts at the
    tick (10 s, then 20, 40, 60 s) instead of the service time, and the 30 s scale-down rate
    uses 10 s windows instead of 5 s; burstiness below 10 s is invisible here (Poisson
    within a minute in the simulator, which the planner's queueing sizing absorbs).
    [gap] planner: InferLine's low-frequency planner searches batch size and hardware with a
    discrete-event simulation; with one model, batch 1 and one CPU type only the replica
    count is left, so the planner here sizes it with the engine's M/D/c estimator. Every
    ``replan_s`` (1800 s) it takes the last ``plan_history_min`` (15) minutes as the sample:
    the sample envelope is built from its tick counts exactly as the live one (so the two
    compare like with like), ``n`` = fewest replicas meeting the SLO at the sample's 60 s
    peak rate, ``rho = mean rate / (n mu)`` (the slack it kept), and it sets ``n`` replicas.
    Before 15 minutes of ticks exist (the start) the sample is the per-minute history's peak
    at every window, or, with no history, rho = one replica's utilisation at the SLO (M/D/1)
    and no replica change; such a provisional plan is redone once the 15 minutes exist.
    """

    name = "inferline"
    state_fields = ("last_plan", "provisional", "started", "last_change", "ticks", "rho", "sample_env")

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec, *,
                 replan_s: float = 1800.0, plan_history_min: int = 15, envelope_s: float = 120.0,
                 down_guard_s: float = 15.0, down_window_s: float = 30.0, max_window_s: float = 60.0):
        super().__init__(models, cluster)
        self.replan_s = replan_s
        self.plan_history_min = plan_history_min
        self.envelope_s = envelope_s
        self.down_guard_s = down_guard_s
        self.down_window_s = down_window_s
        self.max_window_s = max_window_s
        self.last_plan = -math.inf
        self.provisional = True
        self.started = None
        self.last_change: dict[str, float] = {}
        self.ticks: dict[str, deque] = {m.name: deque() for m in self.models}
        self.rho: dict[str, float] = {}
        self.sample_env: dict[str, list[float]] = {}

    def windows(self) -> list[int]:
        """Envelope windows in ticks: 1, 2, 4, ... and the largest, ``max_window_s``."""
        out, k = [], 1
        while k * self.tick_s <= self.max_window_s + 1e-9:
            out.append(k)
            k *= 2
        last = int(self.max_window_s // self.tick_s)
        if last > 0 and (not out or out[-1] != last):
            out.append(last)
        return out

    def envelope(self, name: str, since: float) -> list[float]:
        """Peak rate per window (windows longer than the data are left out)."""
        counts = np.array([c for t, c in self.ticks[name] if t > since])
        rates = []
        for k in self.windows():
            if counts.size < k:
                break
            rates.append(float(np.convolve(counts, np.ones(k), mode="valid").max()) / (k * self.tick_s))
        return rates

    def plan(self, obs: Observation) -> dict[str, int]:
        now = obs.now
        self.last_plan = now
        full = self.started is not None and now - self.started >= 60.0 * self.plan_history_min - 1e-9
        self.provisional = not full
        out = {}
        for m in self.models:
            o = obs.models[m.name]
            p = processing_s(m, o.processing_ms)
            slo, q = m.slo_ms / 1e3, m.percentile / 100.0
            n_win = len(self.windows())
            if full:
                env = self.envelope(m.name, now - 60.0 * self.plan_history_min)
                counts = [c for t, c in self.ticks[m.name] if t > now - 60.0 * self.plan_history_min]
                mean = float(np.mean(counts)) / self.tick_s
                peak = env[-1]
            else:
                hist = np.asarray(o.arrivals_per_min, float)[-self.plan_history_min:] / 60.0
                if hist.size == 0:
                    r1 = max_rate_one_replica(p, slo, q, m.concurrency)
                    self.rho[m.name] = r1 * p / m.concurrency
                    self.sample_env[m.name] = [math.inf] * n_win
                    out[m.name] = o.target_replicas
                    continue
                mean, peak = float(hist.mean()), float(hist.max())
                env = [peak] * n_win
            n = _replicas_for(peak, p, slo, q, m)
            # rho = lambda / (n mu), mu = k / p: one replica's saturation rate
            self.rho[m.name] = min(max(mean * p / (n * m.concurrency), 0.05), 0.95)
            self.sample_env[m.name] = env
            out[m.name] = n
        return out

    def decide(self, obs: Observation) -> Decision | None:
        now = obs.now
        if self.started is None:
            self.started = now
        keep = max(self.envelope_s, 60.0 * self.plan_history_min)
        for m in self.models:
            q = self.ticks[m.name]
            if now > self.started:
                q.append((now, obs.models[m.name].arrival_rate * self.tick_s))
            while q and q[0][0] <= now - keep:
                q.popleft()
        due_full = self.provisional and now - self.started >= 60.0 * self.plan_history_min - 1e-9
        if now - self.last_plan >= self.replan_s or due_full:
            wanted = self.plan(obs)
            for n in wanted:
                self.last_change[n] = now
            return fcfs_decision(self, obs, wanted, [m.name for m in self.models], "long_term",
                                 {"rho": {n: round(r, 3) for n, r in self.rho.items()}})
        wanted, up = {}, []
        for m in self.models:
            o = obs.models[m.name]
            mu = saturation_rate(m, o.processing_ms)
            rho = self.rho[m.name]
            live = self.envelope(m.name, now - self.envelope_s)
            over = [r for r, s in zip(live, self.sample_env[m.name]) if r > s]
            k_up = math.ceil(max(over) / (mu * rho) - 1e-9) if over else 0
            if k_up > o.target_replicas:
                wanted[m.name] = m.clamp(k_up)
                up.append(m.name)
            elif now - self.last_change.get(m.name, -math.inf) > self.down_guard_s:
                recent = [c for t, c in self.ticks[m.name] if t > now - self.down_window_s]
                lam_new = max(recent) / self.tick_s if recent else 0.0
                k = m.clamp(math.ceil(lam_new / (mu * rho) - 1e-9))
                if k < o.target_replicas:
                    wanted[m.name] = k
        if not wanted:
            return None
        dec = fcfs_decision(self, obs, wanted, up, "reactive", {"up": up})
        if dec is not None:
            for n in dec.replicas:
                self.last_change[n] = now
        return dec


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
    variant (``Decision.variants``) and, for one that batches, its batch.

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

    def __init__(self, models: Sequence[ModelSLO], cluster: ClusterSpec, *, slack: float = 1.05,
                 t_v_s: float | None = None):
        super().__init__(models, cluster)
        self.slack = slack
        self.t_v = cluster.cold_start_s if t_v_s is None else t_v_s
        self.fits_since: dict[str, float] = {}
        self.short_since: dict[str, float] = {}
        self.options = {m.name: variant_options(m, cluster.cold_start_s) for m in models if m.variants}
        self.option: dict[str, list] = {}  # model -> [variant, batch] in force (variants only)

    def decide(self, obs: Observation) -> Decision | None:
        now = obs.now
        wanted, chosen = {}, {}
        for m in self.models:
            o = obs.models[m.name]
            if m.name in self.options:
                self._variant_step(m, o, now, wanted, chosen)
            else:
                self._step(m, o, now, wanted)
        order = sorted(self.short_since, key=self.short_since.get)
        dec = fcfs_decision(self, obs, wanted, order, "reactive") if wanted else None
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

    def _step(self, m: ModelSLO, o, now: float, wanted: dict) -> None:
        q_sat = saturation_rate(m, o.processing_ms)
        self._scale(m, o.arrival_rate, o.target_replicas, q_sat, now, wanted, self.t_v)

    def _scale(self, m, load, n, q_sat, now, wanted, t_v) -> None:
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

    def _variant_step(self, m: ModelSLO, o, now: float, wanted: dict, chosen: dict) -> None:
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


# This module's built-in policies as data, (name, factory, summary, needs_batching), which
# autoscaler/builtin.py lists: the policy modules never import the registry.
POLICIES = (
    ("swayam", lambda models, cluster, forecaster=None: SwayamPolicy(models, cluster),
     "Swayam: per model, replicas for a regression-predicted, burst-padded rate; up at "
     "once, down only to the most needed in the last 15 min", False),
    ("inferline", lambda models, cluster, forecaster=None: InferLineTunerPolicy(models, cluster),
     "InferLine's tuner: up at once when the traffic envelope exceeds the plan's, down "
     "after 15 s of calm", False),
    ("infaas", lambda models, cluster, forecaster=None: INFaaSPolicy(models, cluster),
     "INFaaS: replicate when headroom falls below 1.05 x the load, one fewer once the "
     "load fits for a load time (one variant)", False),
)
