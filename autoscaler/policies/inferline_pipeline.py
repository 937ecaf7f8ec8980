"""InferLine's planner and tuner over a pipeline's stages (SoCC '20, sections 4.3 and 5),
for ``autoscaler.policies.inferline.InferLineTunerPolicy``; helpers it shares with the single-model
path (the traffic envelope, the sample's arrival times)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, cast

import numpy as np

from autoscaler.contract.policy import ModelObservation, Observation
from autoscaler.policies.service import service_of
from faro_serve.config import ModelSLO
from faro_serve.engine.inferline_plan import plan as plan_pipeline
from faro_serve.engine.inferline_plan import profiles as stage_profiles
from faro_serve.pipelines import PipelineSLO


class PipelineTuner(Protocol):
    """What the pipeline planner and tuner read and keep of the policy that runs them
    (``autoscaler.policies.inferline.InferLineTunerPolicy``): named by shape, so that this
    module need not import the policy that imports it."""

    slo: dict[str, ModelSLO]
    pipelines: tuple[PipelineSLO, ...]
    seed: int
    started: float | None
    plan_history_min: int
    down_guard_s: float
    tick_s: float
    envelope_s: float
    down_window_s: float
    pticks: dict[str, Any]  # per pipeline: its (t, queries in the tick) of the recent ticks
    pstate: dict[str, dict[str, Any]]  # per pipeline: its last plan

    def windows(self) -> list[int]: ...


def envelope_of(ticks: Iterable[tuple[float, float]], since: float, windows: list[int], tick_s: float) -> list[float]:
    """Peak rate per window of ``windows`` ticks over the ``(t, count)`` ticks after ``since``
    (windows longer than the data are left out): the traffic envelope, section 5."""
    counts = np.array([c for t, c in ticks if t > since])
    rates = []
    for k in windows:
        if counts.size < k:
            break
        rates.append(float(np.convolve(counts, np.ones(k), mode="valid").max()) / (k * tick_s))
    return rates


def sample_arrivals(per_min: np.ndarray, seed: int | Sequence[int] | None) -> np.ndarray:
    """Arrival times (s) of a per-minute count series, Poisson within each minute (each
    minute's arrivals uniform at random: a Poisson process given its count), seeded."""
    rng = np.random.default_rng(seed)
    counts = np.rint(np.maximum(np.asarray(per_min, float), 0)).astype(int)
    parts = [60.0 * i + np.sort(rng.uniform(0.0, 60.0, c)) for i, c in enumerate(counts)]
    return np.concatenate(parts) if parts else np.empty(0)


def one_request_s(m: ModelSLO, o: ModelObservation) -> float:
    """A stage's time for one request alone: measured, else its prior. A batching replica
    measures its batch's time ``p f(b)`` at the mean batch ``b`` (``service.py``)."""
    return service_of(m, o).p_s


def stage_mu(m: ModelSLO, o: ModelObservation, batch: int) -> float:
    """One replica's throughput (requests/s) at its batch: ``mu_m`` of section 5."""
    svc = service_of(m, o)
    if svc.shape is None:
        return m.concurrency / svc.p_s
    b = min(max(int(batch), 1), svc.bmax)
    return b / (svc.p_s * float(svc.shape[b]))


def plan_pipelines(
    pol: PipelineTuner,
    obs: Observation,
    due: bool,
    wanted: dict[str, int],
    order: list[str],
    batches: dict[str, int],
    info: dict[str, Any],
) -> set[str]:
    """Run the planner for every pipeline that is due (or has no plan yet and now has
    history); fill ``wanted``/``order``/``batches``/``info`` and ``pol.pstate``. Returns
    the names of the pipelines planned."""
    now, done = obs.now, set()
    h = pol.plan_history_min
    for p in pol.pipelines:
        po = obs.pipelines.get(p.name)
        hist = np.asarray(po.arrivals_per_min if po is not None else [], float)[-h:]
        if not (due or p.name not in pol.pstate) or hist.sum() <= 0:
            continue  # nothing to plan on yet: the stages stay, the tuner waits
        done.add(p.name)
        stages = {n: pol.slo[n] for n in p.stage_names}
        mods = {n: obs.models[n] for n in p.stage_names}
        times = {n: one_request_s(stages[n], mods[n]) for n in stages}
        arr = sample_arrivals(hist, [pol.seed, int(now)])
        res = plan_pipeline(
            stage_profiles(p, times, cpu_factors=(1.0,)), arr, p.slo_ms / 1e3, p.percentile, seed=pol.seed
        )
        if res.feasible:
            n = {s: c.replicas for s, c in res.configs.items()}
            b = {s: c.batch for s, c in res.configs.items()}
        else:  # keep the stages as they are and tune from there
            n = {s: mods[s].target_replicas for s in stages}
            b = {s: max(mods[s].batch_size, 1) if stages[s].batching else 1 for s in stages}
        lam = float(hist.sum()) / (60.0 * hist.size)
        rho = {
            s: min(max(lam * p.stage(s).fraction / (max(n[s], 1) * stage_mu(stages[s], mods[s], b[s])), 0.05), 0.95)
            for s in stages
        }
        # the sample's envelope from its ticks; before 15 minutes of them (the start), no
        # lower than the peak minute's rate at any window (single models: that peak alone)
        env = envelope_of(pol.pticks[p.name], now - 60.0 * h, pol.windows(), pol.tick_s)
        if now - cast(float, pol.started) < 60.0 * h - 1e-9:  # decide set it before planning
            peak = float(hist.max()) / 60.0
            env = [max(peak, env[i]) if i < len(env) else peak for i in range(len(pol.windows()))]
        pol.pstate[p.name] = {
            "rho": rho,
            "batch": b,
            "env": env,
            "changed": now,
            "n": {s: max(int(n[s]), 1) for s in stages},
        }
        wanted.update(n)
        order.extend(s for s in p.order() if s not in order)
        batches.update({s: b[s] for s in stages if stages[s].batching is not None})
        info.setdefault("pipelines", {})[p.name] = {
            "feasible": res.feasible,
            "reason": res.reason,
            "cost": res.cost,
            "latency_ms": round(res.latency_s * 1e3, 1) if math.isfinite(res.latency_s) else None,
            "rho": {s: round(r, 3) for s, r in rho.items()},
        }
    return done


def tune_pipelines(
    pol: PipelineTuner, obs: Observation, planned: set[str], wanted: dict[str, int], up: list[str], info: dict[str, Any]
) -> None:
    """Algorithms 3 and 4 per pipeline on the envelope of its entry arrivals."""
    now = obs.now
    for p in pol.pipelines:
        st = pol.pstate.get(p.name)
        if st is None or p.name in planned:
            continue
        live = envelope_of(pol.pticks[p.name], now - pol.envelope_s, pol.windows(), pol.tick_s)
        # the envelope the stages are provisioned for now: the sample's, shrunk by the
        # least provisioned stage after a scale-down (see the policy's docstring)
        f = min(1.0, min(obs.models[n].target_replicas / st["n"][n] for n in p.stage_names))
        over = [r for r, s in zip(live, st["env"]) if r > s * f]
        r_max = max(over) if over else 0.0
        rho, b = st["rho"], st["batch"]
        raised, k_up = [], {}
        for n in p.order():
            m, o = pol.slo[n], obs.models[n]
            k_up[n] = math.ceil(r_max * p.stage(n).fraction / (stage_mu(m, o, b[n]) * rho[n]) - 1e-9)
            if over and k_up[n] > o.target_replicas:
                wanted[n] = m.clamp(k_up[n])
                raised.append(n)
        up.extend(raised)
        if over:
            info.setdefault("pipelines", {})[p.name] = {"r_max": round(r_max, 3), "up": raised}
        if raised or now - st["changed"] <= pol.down_guard_s:
            continue
        recent = [c for t, c in pol.pticks[p.name] if t > now - pol.down_window_s]
        lam_new = max(recent) / pol.tick_s if recent else 0.0
        rho_p = min(rho.values())
        g = max((r / e for r, e in zip(live, st["env"]) if e > 0), default=0.0)
        for n in p.order():
            m, o = pol.slo[n], obs.models[n]
            k = math.ceil(lam_new * p.stage(n).fraction / (stage_mu(m, o, b[n]) * rho_p) - 1e-9)
            # not below what Algorithm 3 would restore next tick: the count whose share of
            # the plan keeps the threshold above the live envelope (g), nor below k_up
            k = m.clamp(max(k, k_up[n], math.ceil(g * st["n"][n] - 1e-9)))
            if k < o.target_replicas:
                wanted[n] = k
