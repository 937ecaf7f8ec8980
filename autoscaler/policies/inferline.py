"""InferLine (SoCC '20) as a policy: the low-frequency planner and the high-frequency tuner,
for single models and for pipelines (issue 35).

A single model is a one-stage pipeline and keeps the adaptation it always had (the class
docstring). A pipeline's stages (``attach_pipelines``) are planned together by the paper's
planner (``faro_serve.engine.inferline_plan``: Estimator = discrete-event simulation of the
DAG on a sample trace, greedy search over replicas and batch sizes) and tuned together
from the traffic envelope of the pipeline's entry arrivals (section 5).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from autoscaler.contract.policy import Decision, Observation, Policy
from autoscaler.policies.common import fcfs_decision, max_rate_one_replica, replicas_for_slo
from autoscaler.policies.inferline_pipeline import envelope_of, plan_pipelines, tune_pipelines
from autoscaler.policies.service import service_of
from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine.problem import batch_choices
from faro_serve.pipelines import PipelineSLO


class InferLineTunerPolicy(Policy):
    """InferLine's planner and tuner (SoCC '20). Single models, as a one-stage pipeline:

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
    [gap] single-model planner: with one model and one hardware type only the batch and the
    replica count are left, so a single model's planner sizes it with the engine's estimator
    (M/D/c, or the batched one for a model that declares ``batching``: the DES would answer
    the same question, slower): for every largest batch 1, 2, 4, ... the fewest replicas
    meeting the SLO at the sample's peak, the batch that needs the fewest (the smaller on a
    tie: the cheapest configuration, section 4.3), and ``mu`` its full-batch throughput. Every ``replan_s`` (1800 s) it takes
    the last ``plan_history_min`` (15) minutes as the sample: the sample envelope is built
    from its tick counts exactly as the live one (so the two compare like with like), ``n``
    = fewest replicas meeting the SLO at the sample's 60 s peak rate, ``rho = mean rate /
    (n mu)`` (the slack it kept), and it sets ``n`` replicas. Before 15 minutes of ticks
    exist (the start) the sample is the per-minute history's peak at every window, or, with
    no history, rho = one replica's utilisation at the SLO (M/D/1) and no replica change;
    such a provisional plan is redone once the 15 minutes exist.

    Pipelines (``attach_pipelines``): on the same schedule the planner of section 4.3 runs
    per pipeline on the last ``plan_history_min`` minutes of the pipeline's entry queries
    (Poisson within each minute, seeded), with the end-to-end SLO at its percentile; it sets
    every stage's replicas and, for stages that declare ``batching``, its batch size.
    ``rho_m = lambda s_m / (n_m mu_m)``, ``mu_m`` = one replica's throughput at its batch,
    ``lambda`` the sample's mean rate. The tuner compares the envelope of the pipeline's
    entry arrivals with the sample's and on a violation sets each stage to
    ``ceil(r_max s_m / (mu_m rho_m))`` (Algorithm 3; only stages below it change); it scales
    down 15 s after the pipeline's last change to ``ceil(lambda_new s_m / (mu_m rho_p))``,
    ``rho_p`` the pipeline's least rho (Algorithm 4). ``s_m`` = the stage's ``fraction``.
    [gap] the live envelope spans ``envelope_s`` (120 s), the scale-down rate 30 s: a burst
    seen 40 s ago would bring back, next tick, replicas the scale-down just removed (seen
    in bench/inferline_paper.py: a stage flapping 1-2 every 10-20 s), so a stage is not
    scaled below Algorithm 3's count for the current envelope, nor below the share of its
    plan that keeps the threshold (next) above the live envelope (else the lowered
    threshold re-triggers: resnet flapped 12-16 at 150 queries/s). Before 15 minutes of ticks
    the sample envelope is at least the peak minute's rate at every window. [gap] after a
    scale-down the stages no longer handle the sample, yet Algorithm 3 only reacts above
    the sample's envelope: a rise back to the sample's rate went unseen (measured: a spike
    to 40/s after a scale-down at 13/s, 10.6 % of the queries missed, sample peak 45/s).
    So the threshold is the sample envelope x min(1, least target_m / planned n_m): the
    paper's at the plan and above it, lower after a scale-down.
    [gap] hardware: Ray Serve cannot change a replica's CPUs in place and the cluster has no
    accelerator types, so the live planner keeps each stage's ``cpus`` (the engine's planner
    weighs other CPU counts when asked). [gap] a stage's one-request time is its measured
    processing time (a batching stage's divided by its batch factor at the mean batch),
    else its ``processing_ms``; a stage of ``concurrency`` > 1 is planned one request at a
    time per replica (conservative). [gap] an infeasible plan (the SLO cannot be met within
    the stages' ``max_replicas``) keeps the stages as they are, says why in the decision's
    info, and tunes from there.
    """

    name = "inferline"
    state_fields = (
        "last_plan",
        "provisional",
        "started",
        "last_change",
        "ticks",
        "rho",
        "sample_env",
        "pticks",
        "pstate",
        "batch",
    )

    def __init__(
        self,
        models: Sequence[ModelSLO],
        cluster: ClusterSpec,
        *,
        replan_s: float = 1800.0,
        plan_history_min: int = 15,
        envelope_s: float = 120.0,
        down_guard_s: float = 15.0,
        down_window_s: float = 30.0,
        max_window_s: float = 60.0,
        seed: int = 0,
    ):
        super().__init__(models, cluster)
        self.replan_s = replan_s
        self.plan_history_min = plan_history_min
        self.envelope_s = envelope_s
        self.down_guard_s = down_guard_s
        self.down_window_s = down_window_s
        self.max_window_s = max_window_s
        self.seed = seed
        self.last_plan = -math.inf
        self.provisional = True
        self.started: float | None = None
        self.last_change: dict[str, float] = {}
        self.ticks: dict[str, deque[tuple[float, float]]] = {m.name: deque() for m in self.models}
        self.rho: dict[str, float] = {}
        self.sample_env: dict[str, list[float]] = {}
        self.pticks: dict[str, deque[tuple[float, float]]] = {}  # per pipeline: (t, queries in the tick)
        self.pstate: dict[str, dict[str, Any]] = {}  # per pipeline: its plan (see _plan_pipeline)
        self.batch: dict[str, int] = {}  # a batching single model: the largest batch planned

    def attach_pipelines(self, pipelines: Sequence[PipelineSLO]) -> None:
        super().attach_pipelines(pipelines)
        self.pticks = {p.name: deque() for p in self.pipelines}

    @property
    def singles(self) -> list[ModelSLO]:
        staged = {n for p in self.pipelines for n in p.stage_names}
        return [m for m in self.models if m.name not in staged]

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
        """A single model's envelope (peak rate per window)."""
        return envelope_of(self.ticks[name], since, self.windows(), self.tick_s)

    # -- single models ------------------------------------------------------------------

    def plan(self, obs: Observation) -> dict[str, int]:
        now = obs.now
        full = self.started is not None and now - self.started >= 60.0 * self.plan_history_min - 1e-9
        out = {}
        for m in self.singles:
            o = obs.models[m.name]
            svc = service_of(m, o)
            p = svc.p_s
            slo, q = m.slo_ms / 1e3, m.percentile / 100.0
            n_win = len(self.windows())
            if full:
                env = self.envelope(m.name, now - 60.0 * self.plan_history_min)
                counts = [c for t, c in self.ticks[m.name] if t > now - 60.0 * self.plan_history_min]
                mean = float(np.mean(counts)) / self.tick_s
                peak = env[-1]
            else:
                hist = np.asarray(o.arrivals_per_min, float)[-self.plan_history_min :] / 60.0
                if hist.size == 0:
                    r1 = max_rate_one_replica(p, slo, q, m.concurrency)
                    self.rho[m.name] = r1 * p / m.concurrency
                    self.sample_env[m.name] = [math.inf] * n_win
                    out[m.name] = o.target_replicas
                    continue
                mean, peak = float(hist.mean()), float(hist.max())
                env = [peak] * n_win
            if svc.shape is None:
                n, b = replicas_for_slo(peak, p, slo, q, m), 1
            else:  # the batch that needs the fewest replicas at the peak (the smaller on a tie)
                n, b = min((svc.at_batch(b).replicas_for(peak, self.cluster), b) for b in batch_choices(svc.bmax))
                self.batch[m.name] = b
            # rho = lambda / (n mu), mu: one replica's saturation rate (at its batch)
            self.rho[m.name] = min(max(mean / (n * svc.saturation_rate(b)), 0.05), 0.95)
            self.sample_env[m.name] = env
            out[m.name] = n
        return out

    def _tune_single(self, obs: Observation, wanted: dict[str, int], up: list[str]) -> None:
        now = obs.now
        for m in self.singles:
            o = obs.models[m.name]
            mu = service_of(m, o).saturation_rate(self.batch.get(m.name, 1))
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

    # -- both: plan when due, else tune (autoscaler/policies/inferline_pipeline.py: the stages) ---

    def decide(self, obs: Observation) -> Decision | None:
        now = obs.now
        if self.started is None:
            self.started = now
        keep = max(self.envelope_s, 60.0 * self.plan_history_min)
        series = [(self.ticks[m.name], obs.models[m.name].arrival_rate) for m in self.singles]
        series += [
            (self.pticks[p.name], obs.pipelines[p.name].arrival_rate) for p in self.pipelines if p.name in obs.pipelines
        ]
        for q, rate in series:
            if now > self.started:
                q.append((now, rate * self.tick_s))
            while q and q[0][0] <= now - keep:
                q.popleft()
        full = now - self.started >= 60.0 * self.plan_history_min - 1e-9
        due = now - self.last_plan >= self.replan_s or (self.provisional and full)
        wanted: dict[str, int] = {}
        order: list[str] = []
        batches: dict[str, int] = {}
        info: dict[str, Any] = {}
        if due:
            self.last_plan = now
            self.provisional = not full
            wanted = self.plan(obs)
            info["rho"] = {n: round(r, 3) for n, r in self.rho.items()}
            order = [m.name for m in self.singles]
        planned = plan_pipelines(self, obs, due, wanted, order, batches, info)
        if due:
            batches.update({n: b for n, b in self.batch.items() if n in self.slo})
        if due:
            for n in wanted:
                self.last_change[n] = now
            kind = "long_term"
        else:
            up: list[str] = []
            self._tune_single(obs, wanted, up)
            tune_pipelines(self, obs, planned, wanted, up, info)
            info = {"up": up, **info}
            order = up + [n for n in order if n not in up]  # + a pipeline's first plan
            kind = "reactive"
        if not wanted and not batches:
            return None
        dec = fcfs_decision(self.models, obs, wanted, order, kind, info) if wanted else None
        if batches:
            dec = dec or Decision({}, {}, kind, info)
            for n, b in batches.items():
                dec.set(n, batch_size=b)
        if dec is not None and kind == "reactive":
            for n in dec.replicas:
                self.last_change[n] = now
        if dec is not None:
            for p in self.pipelines:
                if any(n in dec.replicas for n in p.stage_names) and p.name in self.pstate:
                    self.pstate[p.name]["changed"] = now
        return dec
