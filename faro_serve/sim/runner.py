"""The matched simulator's driver: a trace, a policy, a fixed cluster (paper section 6.4).

It plays the role the live autoscaler plays on Ray Serve: every ``policy.tick_s`` it builds
the :class:`~autoscaler.contract.policy.Observation` the router front would report and hands it to
the very same policy object (``autoscaler.make_policy``), then applies the returned
:class:`~autoscaler.contract.policy.Decision`. Observations and decision checks are the live loop's
own (``autoscaler.driving.driver``): targets clamped to each model's min/max, a decision above the
cluster's capacity refused with :class:`CapacityExceeded` (a bug in the policy: policies
fit their own decisions, ``grant_in_order``); here added replicas serve after the cold
start, removed ones leave at once, and drop rates are enforced at the router.

Observation semantics (what a router front measures):
* ``arrivals_per_min``: arrivals (dropped ones included) of every completed minute, after
  an optional warm-up prefix (e.g. the previous day), oldest first; with fewer than two
  minutes, the open one extrapolated once 10 s old, as the live driver does
  (``autoscaler.driving.driver.with_open_minute``);
* ``arrival_rate``: arrivals over the last tick / tick length;
* ``latency_ms``: SLO-percentile latency of requests completed in the look-back (30 s),
  dropped requests excluded (they get a 503 at once); None when none completed;
* ``processing_ms``: mean processing time of those requests;
* ``queue_length``: requests waiting at the router at the tick;
* ``ongoing_per_replica``: time-average of queued + in-service requests over the last
  tick, per serving replica (Ray Serve's ``total_num_requests`` / running replicas);
* ``future_arrivals_per_min``: the realised counts of the coming minutes (oracle only).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import cast

import numpy as np

from autoscaler.contract.policy import Policy
from autoscaler.contract.setting import Setting
from autoscaler.driving.driver import MeterSnapshot, apply_decision, decide, observe, with_open_minute
from faro_serve.config import ModelSLO
from faro_serve.metrics import MinuteTable, minute_table, summarize

from ..distributions import TimeDist
from ..pipelines import PipelineSLO
from ..resources import demand, usage
from .model_state import ModelState
from .pipeline_run import StageState
from .pipeline_sim import PipelineSet, check_pipelines
from .pipeline_sim import stage_processing as stage_processing_of
from .rates import TickRates
from .sim_config import SimConfig
from .sim_result import SimResult, StageMeter, join_records
from .workload import Workload


def simulate(
    counts: np.ndarray,
    models: Sequence[ModelSLO],
    policy: Policy,
    cfg: SimConfig,
    warmup_history: np.ndarray | None = None,
    future_minutes: int | None = None,
    pipelines: Sequence[PipelineSLO] = (),
    stage_processing: dict[str, TimeDist] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run ``policy`` on per-minute ``counts`` (jobs x minutes: ``models`` in order, then
    one row per pipeline, its queries at the entry).

    ``warmup_history`` (jobs x minutes) is arrival history from before the run (e.g. the
    previous day's end), prepended to what the policy sees but not simulated.
    ``pipelines``: their stages are models of the cluster too (``policy`` must be built
    over ``models`` and the stages, ``make_policy(..., pipelines=...)``); queries move as
    ``faro_serve.sim.pipeline_sim`` says. ``stage_processing``: a stage's simulated processing
    time (default: ``cfg.processing`` scaled to the stage's ``processing_ms``).
    ``progress(minutes started, minutes)``: called as each minute starts (a long replay's
    progress line, ``faro-serve whatif``).
    """
    run = _Run(counts, models, policy, cfg, warmup_history, future_minutes, pipelines, stage_processing)
    # Event instants: minute starts (load the minute) and ticks (observe + decide).
    minute_starts = 60.0 * np.arange(run.n_min)
    extra = [] if cfg.max_step_s is None else [np.arange(0.0, run.end, cfg.max_step_s)]
    t_prev = 0.0
    # (as Python floats: the kernels take them faster than numpy's)
    for t in np.unique(np.concatenate([minute_starts, run.tick_times, [run.end], *extra])).tolist():
        if t > t_prev:
            run.advance(t_prev, t)
            t_prev = t
        if t >= run.end:
            break
        if run.m_next < run.n_min and t >= minute_starts[run.m_next]:
            run.load_minute()
            if progress is not None:
                progress(run.m_next, run.n_min)
        if run.k_tick < len(run.tick_times) and t >= run.tick_times[run.k_tick]:
            run.tick(float(t))
    return run.finish()


class _Run:
    """One simulation's state: set up from the arguments of :func:`simulate`, advanced by
    :meth:`load_minute` and :meth:`tick`, summarised by :meth:`finish`."""

    def __init__(
        self,
        counts,
        models,
        policy: Policy,
        cfg: SimConfig,
        warmup_history,
        future_minutes,
        pipelines=(),
        stage_processing=None,
    ):
        self.t_wall = time.perf_counter()
        self.policy_s = 0.0  # time inside the policy's decide (SimResult.policy_s)
        self.pipelines = list(pipelines)
        self.n_single = len(models)
        # every model the policy scales (single models, then stages) and the jobs measured
        # (single models, then pipelines)
        self.models = list(models) + check_pipelines(models, self.pipelines)
        self.model_names = [m.name for m in self.models]
        self.names = [m.name for m in models] + [p.name for p in self.pipelines]
        self.policy, self.cfg = policy, cfg
        counts = np.asarray(counts, dtype=float)
        if counts.ndim != 2 or counts.shape[0] != len(self.names):
            what = f"models={self.n_single}" + (f" + pipelines={len(self.pipelines)}" if self.pipelines else "")
            raise ValueError(f"counts must be ({what}, minutes), got {counts.shape}")
        self.n_min = counts.shape[1]
        if self.n_min == 0:
            raise ValueError("the trace has no minutes")
        self.spec = {m.name: m for m in self.models}
        self.slo_of = {m.name: m.slo_ms / 1e3 for m in self.models}
        given = cfg.initial_replicas
        if isinstance(given, Mapping) and set(given) - set(self.model_names):
            raise ValueError(
                f"initial replicas of {', '.join(sorted(set(given) - set(self.model_names)))}: not models of the run"
            )
        init = [
            m.clamp((given.get(m.name) if isinstance(given, Mapping) else given) or m.min_replicas) for m in self.models
        ]
        over = cfg.capacity.over(
            usage({m.name: r for m, r in zip(self.models, init)}, {m.name: demand(m) for m in self.models})
        )
        if over:
            raise ValueError(f"the initial replicas ({sum(init)}) need {'; '.join(over)}")
        procs = list(cfg.processing) if isinstance(cfg.processing, tuple) else cfg.processing
        if isinstance(procs, list) and self.pipelines:  # the pipeline rows' draws are unused
            procs = procs + [procs[0]] * (len(self.names) - len(procs))
        self.work = Workload(counts, procs, cfg.router_overhead, seed=cfg.seed, draw=cfg.draw)
        self.rates = TickRates()  # the live meters' arrival-rate window (sim/rates.py)
        tick = float(policy.tick_s)
        look_ticks = int(math.ceil(cfg.look_back_s / tick)) + 1
        self.states = {
            m.name: (ModelState if i < self.n_single else StageState)(
                m.name,
                i,
                cfg.queue_limit,
                look_ticks,
                cfg.replica_hold_s,
                cfg.client_timeout_s,
                cfg.cancel_timed_out,
                None if m.batching is None else m.batching.shape(m.cpus),
                cfg.queue_per_replica,
                int(cfg.capacity_cpus // m.cpus) + 1,
                m.concurrency,
                0.0 if m.batching is None else m.batching.batch_wait_s,
                cfg.ray_batching,
            )
            for i, m in enumerate(self.models)
        }
        if cfg.ray_batching:  # a user's @serve.batch: its largest batch from the start
            for m in self.models:
                if m.batching is not None:
                    self.states[m.name].batch = m.batching.max_batch_size
        self.singles = list(self.states.values())[: self.n_single]
        # what tick() reads of each model, looked up once: (name, state, whether it batches,
        # its SLO percentile)
        self.per_model = [
            (n, s, self.spec[n].batching is not None, self.spec[n].percentile) for n, s in self.states.items()
        ]
        for s, r in zip(self.states.values(), init):
            s.scale_to(r, 0.0, 0.0)
        # every model's setting in force (autoscaler.contract.setting); models with variants start
        # with the first (the one deployed)
        self.settings = {
            m.name: Setting(replicas=r, drop_rate=0.0, variant=m.variants[0].name if m.variants else None)
            for m, r in zip(self.models, init)
        }
        for m in self.models:
            if m.variants:
                v = m.variants[0]
                self.states[m.name].switch_variant(
                    0.0,
                    v.processing_ms / (m.processing_ms or v.processing_ms),
                    None if v.batching is None else v.batching.shape(m.cpus),
                    0.0,
                )
        singles, pipes = self.models[: self.n_single], self.pipelines
        self.slo_s = np.array([m.slo_ms / 1e3 for m in singles] + [p.slo_ms / 1e3 for p in pipes])
        self.pct = np.array([m.percentile for m in singles] + [p.percentile for p in pipes])
        if warmup_history is None:
            warmup_history = np.zeros((len(self.names), 0))
        warmup_history = np.asarray(warmup_history, dtype=float)
        if warmup_history.ndim != 2 or warmup_history.shape[0] != len(self.names):
            raise ValueError("warm-up history must be (jobs, minutes): models, then pipelines")
        self.history = np.concatenate([warmup_history, self.work.counts.astype(float)], axis=1)
        self.n_warm = warmup_history.shape[1]
        if future_minutes is None:
            future_minutes = int(math.ceil(policy.cluster.window_s / 60.0)) + 1
        self.future_minutes = future_minutes
        self.end = 60.0 * self.n_min
        self.tick_times = np.arange(int(math.ceil(self.end / tick))) * tick
        self.targets_log = np.zeros((len(self.tick_times), len(self.models)), dtype=np.int32)
        self.targets_now = [s.target for s in self.states.values()]  # changed only by tick()'s decisions
        self.serving_log = np.zeros_like(self.targets_log)
        self.kinds: dict[str, int] = {}
        self.table = MinuteTable.empty(self.names, self.n_min)
        self.rec_parts: list[tuple] = []
        self.last_tick_t = 0.0
        self.open_minute = 0  # the minute whose arrivals open_count holds (with_open_minute)
        self.open_count = [0.0] * len(self.models)
        self.k_tick = 0
        self.m_next = 0
        self.pipes: PipelineSet | None = None
        if self.pipelines:
            base = cfg.processing if isinstance(cfg.processing, TimeDist) else None
            self.pipes = PipelineSet(
                self.pipelines,
                {n: cast(StageState, self.states[n]) for n in self.model_names[self.n_single :]},
                stage_processing_of(self.pipelines, base, stage_processing),
                cfg.router_overhead,
                cfg.seed,
                cfg.draw,
                self.work.counts[self.n_single :],
                warmup_history[self.n_single :],
            )
            self.stage_meter = StageMeter(self.pipes.stage_names, self.spec, self.n_min, cfg.keep_records)

    def advance(self, t0: float, t1: float) -> None:
        """Every model's queue and replicas over ``[t0, t1)``; then the pipelines, whose
        stages take their arrivals from their parents, parents first."""
        for s in self.singles:
            s.run(t0, t1)
        if self.pipes is not None:
            self.pipes.run(t0, t1)

    def load_minute(self) -> None:
        """The next minute's requests join each model's buffer; every 5 minutes the settled
        ones go to the metrics."""
        batch = self.work.minute(self.m_next)
        slices = batch.job_slices()
        for s, sl in zip(self.singles, slices):
            s.append(batch.arrival[sl], batch.proc[sl], batch.overhead[sl], batch.u[sl])
        if self.pipes is not None:  # the stages' rows follow the single models'
            for k, sl in enumerate(slices[self.n_single :]):
                self.pipes.load(k, batch.arrival[sl])
        self.m_next += 1
        if self.m_next % 5 == 0:
            self.flush(False)

    def tick(self, t: float) -> None:
        """What the live loop does every tick (``autoscaler.driving.driver``): observe, decide, apply."""
        dt = t - self.last_tick_t
        minute_now = int(t // 60.0)
        snaps, running = {}, {}
        # the open minute's arrivals so far (a tick's arrivals belong to the minute its
        # middle lies in; ticks divide minutes)
        tick_minute = int((t - dt / 2) // 60.0)
        if tick_minute != self.open_minute:
            self.open_minute, self.open_count = tick_minute, [0.0] * len(self.models)
        # the loop below runs per model per tick: what it reads of self is looked up once
        look_back, completed = self.cfg.look_back_s, self.history[:, : self.n_warm + minute_now]
        open_count, open_now, elapsed = self.open_count, self.open_minute == minute_now, t - 60.0 * minute_now
        pipes, n_single = self.pipes, self.n_single
        # every model's arrival rate at once (they tick together), before end_tick clears
        # the tick's arrivals
        rates = self.rates.rates("models", dt, [s.tick_arrivals for _, s, _, _ in self.per_model])
        serving = []
        for i, (n, s, batches, percentile) in enumerate(self.per_model):
            if s.pending is not None:  # a variant loading: it may take over now
                s.loaded(t)
            n_arr, _, area = s.end_tick()
            open_count[i] += n_arr
            running[n] = r = s.serving(t)
            serving.append(r)
            lat, proc, _ = s.observe(t, look_back, percentile)
            snaps[n] = MeterSnapshot.quick(
                arrivals_per_min=(
                    with_open_minute(completed[i], open_count[i] if open_now else 0.0, elapsed)
                    if pipes is None or i < n_single
                    else pipes.stage_history(n, minute_now)
                ),
                arrival_rate=rates[i],
                latency_ms=None if math.isnan(lat) else lat * 1e3,
                processing_ms=None if math.isnan(proc) else proc * 1e3,
                queue_length=float(s.nq),
                mean_in_flight=area / dt if dt > 0 else 0.0,
                # a batching model's front reports how long its queued requests have waited
                # (Sponge's budgets), as the live meter does (serving/direct.py)
                queued_ages_s=s.queued_ages(t) if batches else None,
                batch_size=s.batch if batches else None,
            )
        self.serving_log[self.k_tick] = serving
        # the oracle's coming minutes: one copy of the block, a row per model
        block = self.work.counts[: self.n_single, minute_now : minute_now + self.future_minutes].astype(float)
        future = dict(zip(self.names[: self.n_single], block))
        pobs = None
        if self.pipes is not None:
            future.update(self.pipes.future(minute_now, self.future_minutes))
            pobs = self.pipes.observations(t, dt, minute_now, self.cfg.look_back_s)
        obs = observe(
            t, self.cfg.capacity, None, snaps, running, self.settings, future, slo_s=self.slo_of, pipelines=pobs
        )
        t_dec = time.perf_counter()
        dec = decide(self.policy, obs)  # its exception carries the time
        self.policy_s += time.perf_counter() - t_dec
        if dec is not None:
            done = apply_decision(dec, self.settings, self.models, self.cfg.capacity, policy=self.policy.name, now=t)
            for n, r in done.changes:  # decreases first
                self.states[n].scale_to(r, t, self.cfg.cold_start_s)
            for n, new in done.changed.items():
                self._carry_out(n, new, t)
            self.settings = done.settings
            self.kinds[dec.kind] = self.kinds.get(dec.kind, 0) + 1
            self.targets_now = [s.target for s in self.states.values()]
        self.targets_log[self.k_tick] = self.targets_now
        self.last_tick_t = t
        self.k_tick += 1

    def _carry_out(self, name: str, new: Setting, t: float) -> None:
        """The fields of ``new`` beside replicas, on the simulated model: its router's drop
        rate, its replicas' batch, the variant it serves. Threads are Sponge's in-place cores,
        which its own simulator models (``batched_runner``); here a replica is one request's
        worth of CPU."""
        st = self.states[name]
        if new.drop_rate is not None:
            st.drop_rate = new.drop_rate
        if new.batch_size is not None:
            st.batch = new.batch_size
        if new.variant is not None and new.variant != self.settings[name].variant:
            self._switch(name, new.variant, t)

    def _switch(self, name: str, variant: str, t: float) -> None:
        """A model serves ``variant`` from now plus its loading latency."""
        m, st = self.spec[name], self.states[name]
        v = m.variant(variant)
        base = m.processing_ms or m.variants[0].processing_ms
        shape = None if v.batching is None else v.batching.shape(m.cpus)
        st.switch_variant(t, v.processing_ms / base, shape, self.cfg.cold_start_s if v.load_s is None else v.load_s)

    def flush(self, final: bool) -> None:
        states = self.singles
        upto = self.n_min if final else min((s.settled_until_minute() for s in states), default=self.n_min)
        if self.pipes is not None:  # (also moves the pipelines' frontiers)
            upto = min(upto, self.pipes.settled_until_minute())
            if final:
                upto = self.n_min
        parts = [s.take_settled(upto) for s in states]
        if self.pipes is not None:
            e2e, stages = self.pipes.take_settled(upto)
            parts += e2e
            self.stage_meter.add(stages)
        sizes = [p[0].size for p in parts]
        if sum(sizes) == 0:
            return
        midx = np.repeat(np.arange(len(sizes)), sizes)
        arr, lat, drp = (np.concatenate([p[k] for p in parts]) for k in range(3))
        self.table = self.table.merge(minute_table(self.names, midx, arr, lat, drp, self.slo_s, self.n_min, self.pct))
        if self.cfg.keep_records:
            self.rec_parts.append((midx, arr, lat, drp))

    def finish(self) -> SimResult:
        """Drain (no more arrivals; the replicas left serve the queues) and summarise."""
        self.advance(self.end, 1e18)
        self.flush(True)
        records = join_records(self.rec_parts, "model") if self.cfg.keep_records else None
        extra = {}
        if self.pipes is not None:
            extra = dict(
                model_names=self.model_names, pipelines=[p.name for p in self.pipelines], **self.stage_meter.result()
            )
        return SimResult(
            policy=self.policy.name,
            names=self.names,
            capacity_cpus=self.cfg.capacity_cpus,
            seed=self.cfg.seed,
            table=self.table,
            summary=summarize(self.table, self.slo_s),
            wall_s=time.perf_counter() - self.t_wall,
            policy_s=self.policy_s,
            tick_times=self.tick_times,
            targets=self.targets_log,
            serving=self.serving_log,
            decisions=self.kinds,
            records=records,
            tick_s=float(self.policy.tick_s),
            **extra,
        )
