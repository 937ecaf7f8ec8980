"""``faro-serve whatif`` at scale (issue 48, item 2): ``python -m bench.whatif_scale``.

Builds a synthetic export of a Ray Serve cluster, by default a week of minutes (10,080) of
100 deployments in 20 applications, and times what ``faro-serve whatif --export`` does with
it: reading the export, the as-run replay (Ray's rule with each deployment's settings), the
Faro replay, and the report (whatif.json and report.md; the plots apart, ``--plots``).
Target: reading and both replays within 5 minutes on the 2-core machine.

The cluster: each deployment's rate a daily cycle (its own phase and size, 5 to 300
requests a minute, a quieter weekend, 10 % noise), processing a lognormal of 20 to 300 ms;
7 in 10 autoscale (half at Ray's defaults, half as Ray's guide tunes for latency: target
1, 3 s up and 60 s down, 2 s metrics interval), 2 in 10 are fixed, 1 in 10 takes a quarter
GPU; the recorded replicas what a 60 % utilisation needs. Capacity: the busiest minute's
need plus 20 %. Writes whatif_scale.json and .md to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 300.0
PROC_LE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, math.inf]
LAT_LE = [10, 25, 50, 100, 200, 400, 800, 1600, 3200, 6400, math.inf]
TUNED = {
    "target_ongoing_requests": 1,
    "upscale_delay_s": 3,
    "downscale_delay_s": 60,
    "metrics_interval_s": 2,
    "look_back_period_s": 10,
}


def _cdf(le, median: float, shape: float) -> np.ndarray:
    from scipy.special import ndtr

    x = np.asarray(le, float)
    with np.errstate(divide="ignore"):
        return np.where(np.isinf(x), 1.0, ndtr(np.log(x / median) / shape))


def synthetic_history(deployments: int = 100, minutes: int = 10080, seed: int = 0):
    """(ServeHistory, capacity CPUs, capacity GPUs) of the cluster the module docstring says."""
    from forecasting.rayserve import LATENCY_STEPS
    from forecasting.serve_history import AppLatency, DeploymentHistory, ServeHistory

    rng = np.random.default_rng(seed)
    t = np.arange(minutes)
    start = 1_767_225_600.0  # 2026-01-01 00:00 UTC, a Thursday
    weekend = np.isin(((start / 86400 + t / 1440) // 1 + 4) % 7, (5, 6))  # Sat, Sun
    deps, need_cpu, need_gpu, by_app = {}, np.zeros(minutes), 0.0, {}
    for i in range(deployments):
        app, dep = f"app{i // 5}", f"Model{i % 5}"
        rate = math.exp(rng.uniform(math.log(5), math.log(300)))
        cycle = 1 + rng.uniform(0.3, 0.8) * np.sin(2 * np.pi * t / 1440 + rng.uniform(0, 2 * np.pi))
        arr = rate * cycle * np.where(weekend, 0.7, 1.0) * rng.lognormal(0, 0.1, minutes)
        med, shape = math.exp(rng.uniform(math.log(20), math.log(300))), rng.uniform(0.2, 0.6)
        mean = med * math.exp(shape * shape / 2)
        need = np.maximum(1, np.ceil(arr * mean / 6e4 / 0.6))
        kind = i % 10
        gpus = 0.25 if kind == 9 else 0.0
        if kind in (7, 8):
            cfg = {"num_replicas": int(need.max()), "max_ongoing_requests": 5, "max_queued_requests": -1}
            rec = np.full(minutes, float(need.max()))
        else:
            ac = {"min_replicas": 1, "max_replicas": int(need.max() * 2), **(TUNED if i % 2 else {})}
            cfg = {"autoscaling_config": ac, "max_ongoing_requests": 5, "max_queued_requests": -1}
            rec = need.astype(float)
        cfg["ray_actor_options"] = {"num_cpus": 1, "num_gpus": gpus}
        need_cpu += rec
        need_gpu += gpus * rec.max()
        n = float(arr.sum())
        deps[f"{app}/{dep}"] = DeploymentHistory(
            app,
            dep,
            arr.round(3).tolist(),
            rec.tolist(),
            PROC_LE,
            (_cdf(PROC_LE, med, shape) * n).round(1).tolist(),
            mean,
            cfg,
        )
        by_app[app] = by_app.get(app, np.zeros(minutes)) + arr
    k = max(1, math.ceil(minutes / LATENCY_STEPS))
    latency = {}
    for app, arr in by_app.items():
        steps = np.add.reduceat(arr, np.arange(0, minutes, k))
        cdf = _cdf(LAT_LE, rng.uniform(50, 400), 0.5)
        latency[app] = AppLatency(LAT_LE, 60.0 * k, (steps[:, None] * cdf[None, :]).round(1).tolist())
    hist = ServeHistory(start, minutes, deps, latency, [], "synthetic (bench/whatif_scale.py)")
    return hist, float(math.ceil(need_cpu.max() * 1.2)), float(math.ceil(need_gpu * 1.2 + 1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deployments", type=int, default=100)
    ap.add_argument("--minutes", type=int, default=10080)
    ap.add_argument("--policy", default=None, help="Faro's policy (whatif's default)")
    ap.add_argument("--forecaster", default=None, help="shipped (default), fallback, ...")
    ap.add_argument("--plots", action="store_true", help="time the plots too")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)

    from autoscaler.driving.forecasters import choose_forecaster
    from faro_serve.commands.whatif import ReplayProgress
    from faro_serve.sim.history_replay import DEFAULT_POLICY, run_whatif
    from faro_serve.sim.history_replay_report import write_report
    from forecasting.serve_history import ServeHistory

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    hist, cpus, gpus = synthetic_history(args.deployments, args.minutes)
    export = hist.save(out / "whatif_scale_export.json")
    build_s = time.perf_counter() - t0
    policy = args.policy or DEFAULT_POLICY
    fc, kind = choose_forecaster(args.forecaster)
    t0 = time.perf_counter()
    hist = ServeHistory.load(export)
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    w = run_whatif(hist, cpus, gpus, policy=policy, forecaster=fc, progress=ReplayProgress())  # stderr
    sim_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    f = write_report(w, out / "whatif_scale_report", {"forecaster": kind}, plots=args.plots)
    report_s = time.perf_counter() - t0
    row = {
        "deployments": args.deployments,
        "minutes": args.minutes,
        "capacity_cpus": cpus,
        "capacity_gpus": gpus,
        "policy": policy,
        "forecaster": kind,
        "requests": f["total"]["requests"],
        "export_mb": round(export.stat().st_size / 2**20, 1),
        "build_s": round(build_s, 1),
        "read_s": round(read_s, 1),
        "as_run_s": round(w.as_run.wall_s, 1),
        "faro_s": round(w.faro.wall_s, 1),
        "faro_policy_s": round(w.faro.policy_s, 2),  # of faro_s, Faro's own decisions
        "as_run_policy_s": round(w.as_run.policy_s, 2),
        "read_and_simulate_s": round(read_s + sim_s, 1),
        "report_s": round(report_s, 1),
        "plots": args.plots,
        "target_s": TARGET_S,
        "meets_target": read_s + sim_s <= TARGET_S,
        "violations": {k: f["total"][k]["slo_violation_rate"] for k in ("as_run", "faro")},
        "replica_hours": {k: f["total"][k]["replica_hours"] for k in ("as_run", "faro")},
        "faro_decisions": f["decisions"]["faro"],
    }
    env = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    (out / "whatif_scale.json").write_text(json.dumps({"env": env, "row": row}, indent=2) + "\n")
    md = [
        "# whatif at scale (`python -m bench.whatif_scale`)",
        "",
        f"{env['machine']}, Python {env['python']}; load average at the end {env['load_average']}.",
        "",
        "| deployments | minutes | requests | policy | forecaster | read s | as run s | Faro s | "
        "of it Faro's own decisions s | read + simulate s | target s | report s |",
        "|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
        f"| {args.deployments} | {args.minutes:,} | {row['requests']:,} | {policy} | {kind} | {row['read_s']} | "
        f"{row['as_run_s']} | {row['faro_s']} | {row['faro_policy_s']} | {row['read_and_simulate_s']} | "
        f"{TARGET_S:.0f} | {row['report_s']} |",
    ]
    (out / "whatif_scale.md").write_text("\n".join(md) + "\n")
    print("\n".join(md[4:]))
    print(f"wrote {out / 'whatif_scale.json'} and {out / 'whatif_scale.md'}")
    return 0 if row["meets_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
