"""``faro-serve whatif``'s core (issue 48): a plain Ray Serve cluster's recorded minutes
replayed twice in the matched simulator, as it ran and under Faro.

The history is a :class:`forecasting.serve_history.ServeHistory` (Prometheus or its export).
Both runs share the minutes, the deployments, their processing times, the queue settings
and the seed (so the very same requests): only the autoscaler differs.

* as run: Ray's own rule (``autoscaler.policies.ray_rule.RayServePolicy``) with each deployment's
  ``autoscaling_config``; a fixed ``num_replicas`` is min = max; a deployment whose config
  is unknown stays at its median recorded replicas. Each starts at its recorded replicas.
* Faro: the policy named (Faro-FairSum by default, as the live autoscaler), each deployment
  from one replica up to what the stated capacity holds.

A deployment's simulated processing time is a lognormal through its recorded p50 and p90;
the planner's prior is the recorded mean. The SLO is the user's, or the p99 its application
measured end to end over the range ("derived"); both are read in
``faro_serve.sim.history_replay_inputs``. The simulator checks itself: the as-run
replay against what the cluster measured (violation rate, replicas). Ray-free.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from autoscaler.catalogue.registry import make_policy
from autoscaler.policies.common import faro_policy_name
from autoscaler.policies.ray_rule import RAY_DEFAULTS, RayServePolicy
from faro_serve.config import ClusterSpec, ModelSLO
from forecasting.serve_history import ServeHistory

from ..distributions import TimeDist
from .history_replay_inputs import SLO, derived_slo, first_recorded, processing_of, ray_settings
from .runner import SimConfig, SimResult, simulate

DEFAULT_POLICY = faro_policy_name(ClusterSpec.model_fields["objective"].default)  # faro-fairsum
AS_RUN = "ray-serve (as run)"
UNBOUNDED_QUEUE = 10**6  # max_queued_requests -1 (no limit), as compare's simulation
PARALLEL_FROM = 50_000  # deployment-minutes (a process's start, a few seconds, then pays)
V = TypeVar("V")  # what a by-name mapping (--slo) holds per deployment


@dataclass
class Deployment:
    """One deployment as the replay takes it (``key`` is ``app/deployment``)."""

    key: str
    name: str  # the simulator's model name: the key with "/" as "." (made unique)
    mode: str  # "autoscaling", "fixed" or "unknown" (no config: its median recorded replicas)
    min_replicas: int  # as run
    max_replicas: int
    rule: dict  # Ray's autoscaling_config fields the rule reads (RULE_FIELDS)
    cpus: float
    gpus: float
    initial: int  # recorded replicas at the first minute
    processing: TimeDist
    processing_mean_ms: float
    slo: SLO
    max_ongoing_requests: int
    max_queued_requests: int
    faro_max: int = 1  # what the capacity holds


@dataclass
class WhatIf:
    """Both runs and what they were built from (``faro_serve.sim.history_replay_report`` reports it)."""

    hist: ServeHistory
    deployments: list[Deployment]
    as_run: SimResult
    faro: SimResult
    config: SimConfig
    policy: str
    capacity_cpus: float
    capacity_gpus: float | None
    queue: dict  # the deployments' max_ongoing_requests / max_queued_requests taken (queue_settings)
    notes: list[str] = field(default_factory=list)


def model_names(keys: list[str]) -> dict[str, str]:
    """``app/deployment`` -> a model name the config accepts (``app.deployment``), unique."""
    out, used = {}, set()
    for k in keys:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", k.replace("/", "."))
        base = (base if base[:1].isalnum() else "d" + base)[:60]
        name, i = base, 2
        while name in used:
            name, i = f"{base}-{i}", i + 1
        used.add(name)
        out[k] = name
    return out


def resolve(names: Mapping[str, V], hist: ServeHistory, what: str) -> dict[str, V]:
    """A mapping by ``app/deployment`` or unique deployment name -> by key; an unknown or
    ambiguous name raises, listing the deployments."""
    out: dict[str, V] = {}
    for n, v in names.items():
        hits = [k for k, d in hist.deployments.items() if n in (k, d.deployment)]
        if len(hits) != 1:
            why = "matches several deployments" if hits else "is not a deployment of this history"
            raise ValueError(f"{what} {n!r} {why}; it has {', '.join(sorted(hist.deployments))}")
        out[hits[0]] = v
    return out


def build(
    hist: ServeHistory,
    capacity_cpus: float,
    capacity_gpus: float | None = None,
    slos: Mapping[str, tuple[float, float]] | None = None,
    service_scale: float = 1.0,
) -> tuple[list[Deployment], list[str]]:
    """Every deployment as the replay takes it, and the notes on what was assumed;
    ``service_scale``: every service time read back times this (how much the figures hang
    on it)."""
    if not hist.deployments:
        raise ValueError("the history has no deployments")
    if not (math.isfinite(service_scale) and service_scale > 0):
        raise ValueError(f"--service-scale must be a finite number > 0 (got {service_scale:g})")
    notes: list[str] = []
    if service_scale != 1.0:
        notes.append(f"every service time read back times {service_scale:g} (--service-scale)")
    given = resolve(dict(slos or {}), hist, "--slo")
    keys = sorted(hist.deployments)
    names = model_names(keys)
    out = []
    for k in keys:
        d = hist.deployments[k]
        dist, mean = processing_of(d, notes)
        if service_scale != 1.0:
            dist, mean = dist.scaled_to_mean(dist.mean * service_scale), mean * service_scale
        if k in given:
            ms, pct = given[k]
            if not ms > mean:
                raise ValueError(f"--slo {k}={ms:g}: not above its mean processing time ({mean:.0f} ms)")
            slo = SLO(float(ms), float(pct), False)
        else:
            slo = derived_slo(hist, d, mean, notes)
        mode, lo, hi, rule = ray_settings(d, notes)
        opts = (d.config or {}).get("ray_actor_options") or {}
        cpus = 1.0 if opts.get("num_cpus") is None else float(opts["num_cpus"])
        if cpus <= 0:
            notes.append(f"{k}: num_cpus {cpus:g} taken as 0.01 (the simulator counts every replica)")
            cpus = 0.01
        gpus = float(opts.get("num_gpus") or 0.0)
        if gpus > 0 and capacity_gpus is None:
            raise ValueError(f"{k} takes {gpus:g} GPU(s) per replica: give --capacity-gpus")
        holds = math.floor(capacity_cpus / cpus + 1e-9)
        if gpus > 0 and capacity_gpus is not None:  # (None raised above)
            holds = min(holds, math.floor(capacity_gpus / gpus + 1e-9))
        if holds < 1:
            raise ValueError(f"--capacity holds no replica of {k} ({cpus:g} CPUs, {gpus:g} GPUs each)")
        ongoing = (d.config or {}).get("max_ongoing_requests")
        queued = (d.config or {}).get("max_queued_requests")
        first = first_recorded(d.replicas)
        out.append(
            Deployment(
                key=k,
                name=names[k],
                mode=mode,
                min_replicas=lo,
                max_replicas=hi,
                rule=rule,
                cpus=cpus,
                gpus=gpus,
                initial=lo if first is None else first,
                processing=dist,
                processing_mean_ms=mean,
                slo=slo,
                max_ongoing_requests=RAY_DEFAULTS["max_ongoing_requests"] if ongoing is None else int(ongoing),
                max_queued_requests=RAY_DEFAULTS["max_queued_requests"] if queued is None else int(queued),
                faro_max=holds,
            )
        )
    check_fits(hist, out, capacity_cpus, capacity_gpus, notes)
    return out, notes


def check_fits(hist, deps: list[Deployment], cpus: float, gpus: float | None, notes: list[str]) -> None:
    """The first minute's recorded replicas must fit the capacity (both runs start there);
    a later minute that needed more is noted (the replay is held to the capacity)."""
    start = {
        "CPUs": sum(max(min(d.initial, d.max_replicas), d.min_replicas) * d.cpus for d in deps),
        "GPUs": sum(max(min(d.initial, d.max_replicas), d.min_replicas) * d.gpus for d in deps),
    }
    for what, cap in (("CPUs", cpus), ("GPUs", gpus)):
        if cap is not None and start[what] > cap + 1e-9:
            flag = "--capacity" if what == "CPUs" else "--capacity-gpus"
            raise ValueError(
                f"{flag} {cap:g}: the deployments start at {start[what]:g} {what} (their "
                f"recorded replicas at the first minute, within their bounds); give at "
                f"least that, or fewer --deployments"
            )
    rec = np.stack([np.asarray(hist.deployments[d.key].replicas, float) * d.cpus for d in deps])
    used = np.nansum(rec, axis=0)
    if used.size and used.max() > cpus + 1e-9:
        m = int(np.argmax(used))
        notes.append(
            f"the recorded replicas took up to {used[m]:g} CPUs (minute {m}), more than "
            f"--capacity {cpus:g}: the replay holds both runs to the capacity"
        )


def queue_settings(deps: list[Deployment], counts: np.ndarray, notes: list[str]) -> dict:
    """SimConfig's one queue_limit and queue_per_replica: the deployments' most common
    max_queued_requests and max_ongoing_requests (named when they differ)."""
    picked = {}
    for f in ("max_ongoing_requests", "max_queued_requests"):
        c = Counter(getattr(d, f) for d in deps)
        picked[f] = c.most_common(1)[0][0]
        if len(c) > 1:
            seen = ", ".join(f"{v} for {n}" for v, n in c.most_common())
            notes.append(
                f"{f} differs between deployments ({seen}); the simulator takes one for "
                f"all: {picked[f]}, the most common"
            )
    limit = picked["max_queued_requests"]
    # no limit: a queue cannot outgrow a deployment's requests (their Poisson draw: the mean
    # and 6 SD), so that bound is exact and keeps the ring small
    total = float(counts.sum(axis=1).max(initial=0.0))
    most = int(total + 6 * math.sqrt(total) + 100)
    return {
        "queue_limit": min(UNBOUNDED_QUEUE, most) if limit < 0 else limit,
        "queue_per_replica": max(0, picked["max_ongoing_requests"] - 1),
        "max_ongoing_requests": picked["max_ongoing_requests"],
        "max_queued_requests": limit,
    }


def as_run_models(deps: list[Deployment]) -> list[ModelSLO]:
    return [
        ModelSLO(
            name=d.name,
            slo_ms=d.slo.ms,
            percentile=d.slo.percentile,
            processing_ms=d.processing_mean_ms,
            min_replicas=d.min_replicas,
            max_replicas=d.max_replicas,
            cpus=d.cpus,
            gpus=d.gpus,
        )
        for d in deps
    ]


def faro_models(deps: list[Deployment]) -> list[ModelSLO]:
    return [
        ModelSLO(
            name=d.name,
            slo_ms=d.slo.ms,
            percentile=d.slo.percentile,
            processing_ms=d.processing_mean_ms,
            min_replicas=1,
            max_replicas=d.faro_max,
            cpus=d.cpus,
            gpus=d.gpus,
        )
        for d in deps
    ]


def simulate_as_run(
    counts: np.ndarray,
    models: list[ModelSLO],
    rules: dict,
    cfg: SimConfig,
    cluster: ClusterSpec,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """The as-run replay: Ray's rule with each model's own ``autoscaling_config`` (``rules``)."""
    policy = RayServePolicy(models, cluster, name=AS_RUN, per_model=rules)
    return simulate(counts, models, policy, cfg, progress=progress)


def _reporter(progress: Callable[[str, int, int], None] | None, replay: str) -> Callable[[int, int], None] | None:
    return None if progress is None else lambda done, total: progress(replay, done, total)


def run_whatif(
    hist: ServeHistory,
    capacity_cpus: float,
    capacity_gpus: float | None = None,
    slos: Mapping[str, tuple[float, float]] | None = None,
    policy: str = DEFAULT_POLICY,
    forecaster=None,
    seed: int = 0,
    cold_start_s: float = 60.0,
    parallel: bool | None = None,
    service_scale: float = 1.0,
    progress: Callable[[str, int, int], None] | None = None,
) -> WhatIf:
    """Replay ``hist`` as it ran and under ``policy`` (module docstring); ``slos``: by
    deployment (``app/deployment`` or a unique deployment name), ``(ms, percentile)``.
    ``parallel``: the as-run replay in a process of its own while this one runs Faro's, the
    same results in about the time of the longer (None: when the history has over
    :data:`PARALLEL_FROM` deployment-minutes and the machine two cores). ``service_scale``:
    every deployment's service time times this (:func:`build`). ``progress(replay, minutes
    started, minutes)``: as each minute of a replay starts, ``replay`` "as run" or the policy's
    name; in parallel only Faro's replay reports (the longer one: its planning)."""
    if not (math.isfinite(capacity_cpus) and capacity_cpus > 0):
        raise ValueError(f"--capacity must be a finite number > 0 (got {capacity_cpus:g})")
    deps, notes = build(hist, capacity_cpus, capacity_gpus, slos, service_scale)
    counts = np.stack([np.asarray(hist.deployments[d.key].arrivals, float) for d in deps])
    q = queue_settings(deps, counts, notes)
    cfg = SimConfig(
        capacity_cpus=capacity_cpus,
        capacity_gpus=capacity_gpus,
        cold_start_s=cold_start_s,
        queue_limit=q["queue_limit"],
        queue_per_replica=q["queue_per_replica"],
        processing=tuple(d.processing for d in deps),
        initial_replicas={d.name: d.initial for d in deps},
        seed=seed,
    )
    cluster = ClusterSpec(cpus=capacity_cpus, gpus=capacity_gpus)
    ray_args = (counts, as_run_models(deps), {d.name: d.rule for d in deps if d.rule}, cfg, cluster)
    fm = faro_models(deps)
    faro_policy = make_policy(policy, fm, cluster, forecaster)  # a bad policy fails before any run
    if parallel is None:
        parallel = counts.size > PARALLEL_FROM and (os.cpu_count() or 1) > 1
    if parallel:
        ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold torch
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:
            job = pool.submit(simulate_as_run, *ray_args)
            faro = simulate(counts, fm, faro_policy, cfg, progress=_reporter(progress, policy))
            as_run = job.result()
    else:
        as_run = simulate_as_run(*ray_args, progress=_reporter(progress, "as run"))
        faro = simulate(counts, fm, faro_policy, cfg, progress=_reporter(progress, policy))
    return WhatIf(hist, deps, as_run, faro, cfg, policy, capacity_cpus, capacity_gpus, q, list(hist.notes) + notes)
