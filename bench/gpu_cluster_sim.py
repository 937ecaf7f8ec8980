"""One run of the GPU cluster scenario that ``bench/gpu_cluster.py`` describes and reports: the
batch curves of replicas sharing an H200, the jobs' SLOs as each policy runs them, and one
policy simulated on one day at one GPU count and seed. Apart from the command and its report
so that its worker processes and the tests import the scenario alone."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"
ARCHS = ("resnet18",) * 4 + ("resnet34",) * 3 + ("resnet50",) * 3  # job0..job9
POLICIES = ("faro", "faro-batch1", "ray-tuned-b16", "ray-tuned-b32", "inferline", "sponge", "oracle")
FORECASTING = ("faro", "faro-batch1", "oracle")
NOISE = 0.05  # lognormal sigma of one request's time around the profile's median


@dataclass(frozen=True)
class Run:
    policy: str
    day: int
    seed: int
    gpus: int
    rate_scale: float
    slo_ms: float
    queue_limit: int
    forecaster_dir: str | None
    start: int = 0  # the slice of the day simulated: minutes start..end (its minutes before: history)
    end: int = 360
    share: float = 1.0  # of a GPU, per replica


def curve(arch: str, share: float = 1.0):
    """The batch curve of one replica holding ``share`` of an H200 (bench/gpu_cluster.py's docstring)."""
    from faro_serve.batch_curve import BatchCurve
    from faro_serve.config import Batching

    alone = Batching(profile=str(ROOT / "profiles" / f"h200-{arch}.json")).curve()
    k = round(1.0 / share)
    if k <= 1:
        return alone
    bs = np.array([b for b, _ in alone.points])
    lat = alone.latency(bs)
    best = float(np.max(bs / lat))  # requests/s of one replica alone at its best batch
    slow = np.array([sharing_factor(arch, k, b) for b in bs])
    return BatchCurve(tuple(zip(bs.tolist(), np.maximum(lat / slow, k * bs / best).tolist())))


def sharing_factor(arch: str, k: int, b: float) -> float:
    """Throughput of each of ``k`` replicas on one GPU against one alone, at batch ``b``:
    measured at batch 1 and 8 (at most 1), log-interpolated between, held beyond 8."""
    if arch == "resnet34":  # not measured: between its neighbours
        return 0.5 * (sharing_factor("resnet18", k, b) + sharing_factor("resnet50", k, b))
    sh = json.loads((ROOT / "profiles" / "h200-sharing.json").read_text())
    f1 = min(1.0, sh[f"{arch}_b1_k{k}_img_s"] / (k * sh[f"{arch}_b1_k1_img_s"]))
    f8 = min(1.0, sh[f"{arch}_b8_k{k}_img_s"] / (k * sh[f"{arch}_b8_k1_img_s"]))
    w = min(math.log(max(b, 1.0)) / math.log(8.0), 1.0)
    return f1 ** (1.0 - w) * f8**w


def models(policy: str, names: list[str], slo_ms: float, share: float = 1.0):
    """The jobs' SLOs as ``policy`` runs them: batching up to 64 (or the Ray user's fixed
    batch and wait), or none (the paper's Faro); each replica ``share`` of a GPU."""
    from faro_serve.config import Batching, ModelSLO

    out = []
    for name, arch in zip(names, ARCHS):
        c = curve(arch, share)
        points = {int(b): t * 1e3 for b, t in c.points}
        if policy == "faro-batch1":
            batching = None
        elif policy.startswith("ray-tuned-b"):
            batching = Batching(latency_ms=points, max_batch_size=int(policy.rsplit("b", 1)[1]), batch_wait_s=0.004)
        else:
            batching = Batching(latency_ms=points, max_batch_size=64)
        out.append(
            ModelSLO(
                name=name,
                slo_ms=slo_ms,
                processing_ms=float(c.latency(1.0)) * 1e3,
                cpus=1.0,
                gpus=share,
                max_replicas=200,
                batching=batching,
            )
        )
    return out


def policy_for(run: Run, ms, cluster, forecaster):
    from autoscaler import make_policy
    from autoscaler.policies.ray_rule import RAY_TUNED_BATCH, ray_serve_policy

    if run.policy.startswith("ray-tuned-b"):
        b = int(run.policy.rsplit("b", 1)[1])
        return ray_serve_policy(RAY_TUNED_BATCH(b), run.policy)(ms, cluster)
    name = {"faro": "faro-fairsum", "faro-batch1": "faro-fairsum"}.get(run.policy, run.policy)
    return make_policy(name, ms, cluster, forecaster)


def run_one(run: Run) -> dict:
    """One policy on one day at one GPU count and seed: the summary row."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from autoscaler.driving.forecasters import choose_forecaster, set_daily, set_recurrence
    from autoscaler.policies.ray_rule import RAY_TUNED_BATCH
    from faro_serve.config import ClusterSpec
    from faro_serve.distributions import TimeDist
    from faro_serve.sim.runner import SimConfig, simulate
    from faro_serve.traces import default_warmup, load_trace, previous_day_tail
    from forecasting.daily import DEFAULT_WEIGHT
    from forecasting.recurrence import DEFAULT_SHARE

    tr = load_trace(str(TRACE), days=run.day, sample=0)
    warm = previous_day_tail(str(TRACE), run.day, 0, default_warmup(str(TRACE), run.day, 0, None))
    warm = np.zeros((len(tr.names), 0)) if warm is None else warm
    warm = np.concatenate([warm, tr.counts[:, : run.start]], axis=1) * run.rate_scale
    counts = tr.counts[:, run.start : run.end] * run.rate_scale
    ms = models(run.policy, tr.names, run.slo_ms, run.share)
    cluster = ClusterSpec(cpus=1000, gpus=run.gpus)
    fc = None
    if run.policy in FORECASTING:
        import torch

        torch.set_num_threads(1)
        fc, _ = choose_forecaster(None, run.forecaster_dir)
        set_daily(fc, (tr.counts.shape[1], DEFAULT_WEIGHT))
        set_recurrence(fc, DEFAULT_SHARE)
    pol = policy_for(run, ms, cluster, fc)
    ray = run.policy.startswith("ray-tuned-b")
    per_replica = 0
    if ray:  # Ray holds max_ongoing_requests at each replica beyond the proxy's queue
        per_replica = RAY_TUNED_BATCH(ms[0].batching.max_batch_size)["max_ongoing_requests"]
    procs = tuple(TimeDist("lognorm", (NOISE, 0.0, float(curve(a, run.share).latency(1.0)))) for a in ARCHS)
    cfg = SimConfig(
        capacity_cpus=1000,
        capacity_gpus=run.gpus,
        cold_start_s=60.0,
        queue_limit=run.queue_limit,
        queue_per_replica=per_replica,
        processing=procs,
        seed=run.seed,
        ray_batching=ray,
    )
    t0 = time.perf_counter()
    res = simulate(counts, ms, pol, cfg, warmup_history=warm)
    s = res.summary
    gpu_hours = float(res.targets.sum()) * res.tick_s / 3600.0
    return {
        **asdict(run),
        "forecaster_dir": None,
        "lost_cluster_utility": s.lost_cluster_utility,
        "slo_violation_rate": s.cluster_slo_violation_rate,
        "requests": int(s.job_requests.sum()),
        "dropped": int(s.job_dropped.sum()),
        "mean_gpus": float(res.targets.sum(axis=1).mean()) * run.share,
        "gpu_hours": gpu_hours * run.share,
        "decisions": dict(res.decisions),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
