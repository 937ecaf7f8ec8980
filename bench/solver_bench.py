"""Decision-time benchmark of ``plan(...)`` (paper sections 3.4 and 6.4, Figure 7).

Usage: ``python -m bench.solver_bench [--reps 20] [--out bench/results] [--cases a,b]``

(a) 10 models, 36 replicas, 7-minute window (7 steps), 100 forecast samples;
(b) 100 models, 320 replicas, G = 10 groups (and G = 1 for the speed-up the paper reports).
Forecasts are Gaussian samples around real per-minute rates of the Faro 10-job trace
(``../shared/traces``) at random origins, or synthetic rates of the same range when the
trace is absent. Reports the median decision time (wall clock, one process) and the
objective reached; this is a benchmark, not a timed test.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from faro_serve.config import ClusterSpec, ModelSLO
from faro_serve.engine import plan

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "faro10_days1-10.csv"


def base_rates(rng) -> np.ndarray:
    """(10 jobs, minutes) requests/s: the real trace (day 10, sample 0) or a synthetic stand-in."""
    if TRACE.exists():
        from faro_serve.traces import load_trace

        return load_trace(TRACE, days="10", sample=0).rates()
    t = np.arange(360)
    return np.stack(
        [np.clip(rng.uniform(5, 20) * (1 + 0.4 * np.sin(t / rng.uniform(20, 60))), 0.1, 26) for _ in range(10)]
    )


def forecasts(rates: np.ndarray, origin: int, n_models: int, rng, samples=100, steps=7):
    """Gaussian samples (15 % spread) around the next ``steps`` minutes of each job's rates."""
    out = {}
    for i in range(n_models):
        job = rates[i % rates.shape[0]]
        jitter = 1.0 if n_models <= rates.shape[0] else rng.uniform(0.8, 1.2)
        mean = job[origin : origin + steps] * jitter
        out[f"m{i}"] = np.abs(rng.normal(mean, 0.15 * mean + 0.05, size=(samples, steps)))
    return out


def run_case(name, n_models, capacity, groups, reps, rng, rates, objective="fair_sum"):
    models = [ModelSLO(name=f"m{i}", slo_ms=720, processing_ms=154) for i in range(n_models)]
    cluster = ClusterSpec(cpus=capacity, objective=objective, groups=groups)
    origins = rng.integers(0, rates.shape[1] - 7, size=reps + 1)
    current = {m.name: max(1, capacity // n_models) for m in models}
    plan(models, forecasts(rates, int(origins[0]), n_models, rng), current, cluster)  # JIT warm-up
    times, values, used = [], [], []
    for o in origins[1:]:
        fc = forecasts(rates, int(o), n_models, rng)
        t0 = time.perf_counter()
        a = plan(models, fc, current, cluster)
        times.append((time.perf_counter() - t0) * 1e3)
        values.append(a.objective_value)
        used.append(a.cpus_used)
        current = a.replicas
    return {
        "case": name,
        "models": n_models,
        "replicas": capacity,
        "groups": groups,
        "objective": objective,
        "reps": reps,
        "median_ms": round(statistics.median(times), 2),
        "p90_ms": round(float(np.quantile(times, 0.9)), 2),
        "mean_objective": round(float(np.mean(values)), 4),
        "mean_replicas_used": round(float(np.mean(used)), 1),
    }


def paired_groups(n_models, capacity, reps, rng, rates, objective="fair_sum"):
    """G = 10 and G = 1 on the very same forecasts and current replicas: the objective the
    grouping gives up (or gains) and its speed-up, decision by decision."""
    models = [ModelSLO(name=f"m{i}", slo_ms=720, processing_ms=154) for i in range(n_models)]
    current = {m.name: max(1, capacity // n_models) for m in models}
    ratios, speed = [], []
    for o in rng.integers(0, rates.shape[1] - 7, size=reps):
        fc = forecasts(rates, int(o), n_models, rng)
        g10, g1 = (
            plan(models, fc, current, ClusterSpec(cpus=capacity, objective=objective, groups=g)) for g in (10, 1)
        )
        # fair_sum can be negative: shift by its spread bound (gamma) before taking ratios
        ratios.append((g10.objective_value + n_models) / (g1.objective_value + n_models))
        speed.append(g1.solve_ms / g10.solve_ms)
    return {
        "case": f"{n_models} models / {capacity} replicas, G=10 vs G=1 on the same input",
        "reps": reps,
        "objective_ratio_median": round(statistics.median(ratios), 4),
        "objective_ratio_min": round(min(ratios), 4),
        "speedup_median": round(statistics.median(speed), 1),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--cases", default="a,b", help="a: 10 models; b: 100 models, with G=10 against G=1 (a,b)")
    args = ap.parse_args(argv)
    cases = set(args.cases.split(","))
    if not cases <= {"a", "b"}:
        ap.error(f"--cases: a, b or a,b (got {args.cases!r})")
    rng = np.random.default_rng(0)
    rates = base_rates(rng)
    rows = []
    if "a" in cases:
        rows += [
            run_case("(a) 10 models / 36 replicas", 10, 36, 1, args.reps, rng, rates),
            run_case("(a) 10 models / 36 replicas, faro-sum", 10, 36, 1, args.reps, rng, rates, "sum"),
            run_case("(a) 10 models / 36 replicas, penalty-sum", 10, 36, 1, args.reps, rng, rates, "penalty_sum"),
        ]
    paired = None
    if "b" in cases:
        rows += [
            run_case("(b) 100 models / 320 replicas, G=10", 100, 320, 10, args.reps, rng, rates),
            run_case("(b') 100 models / 320 replicas, G=1", 100, 320, 1, max(3, args.reps // 5), rng, rates),
        ]
        paired = paired_groups(100, 320, max(3, args.reps // 5), rng, rates)
    env = {
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "python": platform.python_version(),
        "trace": TRACE.name if TRACE.exists() else "synthetic",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "solver.json").write_text(json.dumps({"env": env, "rows": rows, "paired": paired}, indent=2))
    lines = ["| case | objective | median ms | p90 ms | mean objective | replicas used |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['case']} | {r['objective']} | {r['median_ms']} | {r['p90_ms']} | "
        f"{r['mean_objective']} | {r['mean_replicas_used']} |"
        for r in rows
    ]
    if paired:
        lines += [
            "",
            f"{paired['case']}, {paired['reps']} decisions: objective (+ gamma) G=10 / G=1 "
            f"median {paired['objective_ratio_median']}, worst {paired['objective_ratio_min']}; "
            f"G=10 is {paired['speedup_median']}x faster (median)",
        ]
    (out / "solver.md").write_text("\n".join(lines) + "\n")
    print(f"plan() decision time ({env['machine']}, Python {env['python']}, forecasts from {env['trace']})")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
