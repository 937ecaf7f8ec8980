"""The three parts of ``bench/scale_bench.py`` (its docstring describes them), each of which
``python -m bench.scale_bench --only <part>`` runs in a child process of its own: the planner's
decision times, the 1,000-job simulation and the autoscaler loop over a fake cluster adapter.
Apart from the command, which starts the children and writes the report, so each stays short."""

from __future__ import annotations

import json
import os
import resource
import statistics
import time

import numpy as np

CASES = [(300, 1000), (1000, 3000)]


def _rss_mb() -> dict:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return {"peak_rss_mb": round(peak, 1), "rss_mb": round(now, 1)}


# ---- planner ----------------------------------------------------------------------------


def _inputs(kind: str, n: int, cap: int, reps: int, rng):
    """``reps`` (models, forecasts, current) of one input set; models fixed per set."""
    from bench.solver_bench import base_rates, forecasts
    from faro_serve.config import ModelSLO

    if kind == "trace":
        models = [ModelSLO(name=f"m{i}", slo_ms=720, processing_ms=154) for i in range(n)]
        rates = base_rates(rng)
        origins = rng.integers(0, rates.shape[1] - 7, size=reps)
        fcs = [forecasts(rates, int(o), n, rng) for o in origins]
    else:
        proc = rng.uniform(40, 300, n)
        models = [
            ModelSLO(
                name=f"m{i}",
                slo_ms=float(round(p * rng.uniform(3, 8))),
                processing_ms=float(p),
                priority=float(rng.choice([1.0, 2.0])),
            )
            for i, p in enumerate(proc)
        ]
        # mean rates sized so the capacity binds (mean utility about 0.98)
        base = rng.uniform(0.2, 1.0, n) * cap / n / (proc / 1e3)
        fcs = []
        for _ in range(reps):
            mean = base * rng.uniform(0.7, 1.1, n)
            fcs.append(
                {
                    m.name: np.abs(rng.normal(mean[i], 0.15 * mean[i] + 0.05, size=(100, 7)))
                    for i, m in enumerate(models)
                }
            )
    current = {m.name: max(1, cap // n) for m in models}
    return models, fcs, current


def _configs(n: int):
    """(label, ClusterSpec overrides, every input or the first only)."""
    out = [
        ("default: G=10, groups > 20 nested", {}, True),
        ("G=32, nested", {"groups": 32}, True),
        ("G=1, integer starts only (no COBYLA)", {"groups": 1, "plan_deadline_s": 1e-9}, True),
        ("G=10, not nested (the paper's)", {"groups": 10, "group_max": n, "plan_deadline_s": None}, n <= 300),
        ("G=100, nested", {"groups": 100, "plan_deadline_s": None}, False),
        ("G=1, COBYLA, default 10 s deadline", {"groups": 1}, False),
    ]
    return out


def part_planner(args) -> dict:
    from faro_serve.config import ClusterSpec
    from faro_serve.engine import plan

    rows = []
    for n, cap in CASES:
        for kind in args.sets.split(","):
            rng = np.random.default_rng(36)
            models, fcs, current = _inputs(kind, n, cap, args.reps, rng)
            plan(models, fcs[0], current, ClusterSpec(cpus=cap))  # warm-up (solver process)
            found = []
            for label, over, every in _configs(n):
                cl = ClusterSpec(cpus=cap, **over)
                runs = []
                for k, fc in enumerate(fcs if every else fcs[:1]):
                    la = os.getloadavg()[0]
                    t0 = time.perf_counter()
                    a = plan(models, fc, current, cl)
                    runs.append(
                        {
                            "input": k,
                            "ms": (time.perf_counter() - t0) * 1e3,
                            "objective": a.objective_value,
                            "fallback": a.fallback,
                            "cpus_used": a.cpus_used,
                            "load1": la,
                        }
                    )
                    print(
                        f"{n} models / {cap} [{kind}] {label}: {runs[-1]['ms']:.0f} ms, "
                        f"objective {a.objective_value:.4f}" + (f" ({a.fallback})" if a.fallback else ""),
                        flush=True,
                    )
                found.append((label, over, every, runs))
            best = {}
            for *_, runs in found:
                for r in runs:
                    best[r["input"]] = max(best.get(r["input"], -np.inf), r["objective"])
            for label, over, every, runs in found:
                ms = [r["ms"] for r in runs]
                gaps = [(best[r["input"]] - r["objective"]) / abs(best[r["input"]]) for r in runs]
                rows.append(
                    {
                        "models": n,
                        "replicas": cap,
                        "inputs": kind,
                        "config": label,
                        "overrides": {k: v for k, v in over.items()},
                        "decisions": len(runs),
                        "median_ms": round(statistics.median(ms), 1),
                        "p90_ms": round(float(np.quantile(ms, 0.9)), 1),
                        "mean_objective": round(float(np.mean([r["objective"] for r in runs])), 4),
                        "worst_gap_pct": round(100 * max(gaps), 3),
                        "mean_gap_pct": round(100 * float(np.mean(gaps)), 3),
                        "fallbacks": sum(r["fallback"] is not None for r in runs),
                        "fallback_example": next((r["fallback"] for r in runs if r["fallback"]), None),
                        "mean_load1": round(float(np.mean([r["load1"] for r in runs])), 2),
                    }
                )
    return {"rows": rows, **_rss_mb()}


# ---- simulator --------------------------------------------------------------------------


def part_sim(args) -> dict:
    from autoscaler import make_policy
    from autoscaler.faro.hybrid import FaroPolicy
    from faro_serve.sim import simulate
    from faro_serve.sim.scenario import Scenario, run_scenario

    run_scenario(Scenario(trace=args.trace, day=10, sample=0, minutes=2), "fairshare", 36, 0)
    spent = {"decide_s": 0.0, "plans": 0, "plan_s": 0.0}
    decide, long_term = FaroPolicy.decide, FaroPolicy.long_term

    def timed_decide(self, obs):
        t = time.perf_counter()
        try:
            return decide(self, obs)
        finally:
            spent["decide_s"] += time.perf_counter() - t

    def timed_long_term(self, obs):
        t = time.perf_counter()
        try:
            return long_term(self, obs)
        finally:
            spent["plans"] += 1
            spent["plan_s"] += time.perf_counter() - t

    FaroPolicy.decide, FaroPolicy.long_term = timed_decide, timed_long_term
    sc = Scenario(trace=args.trace, day=10, sample=0, n_jobs=args.jobs, jitter=0.1, minutes=args.minutes)
    t0 = time.perf_counter()
    names, counts, warm = sc.load()
    pol = make_policy(args.sim_policy, sc.models(names), sc.cluster(args.capacity), None)
    res = simulate(counts, sc.models(names), pol, sc.sim_config(args.capacity, 0), warmup_history=warm)
    wall = time.perf_counter() - t0
    s = res.summary
    return {
        "jobs": len(names),
        "replicas": args.capacity,
        "policy": args.sim_policy,
        "minutes": res.table.minutes,
        "requests": int(s.job_requests.sum()),
        "wall_s": round(wall, 1),
        "policy_decide_s": round(spent["decide_s"], 1),
        "plans": spent["plans"],
        "plan_s": round(spent["plan_s"], 1),
        "lost_cluster_utility": round(s.lost_cluster_utility, 3),
        "slo_violation_rate": round(s.cluster_slo_violation_rate, 5),
        **_rss_mb(),
    }


# ---- autoscaler loop --------------------------------------------------------------------


class FakeCluster:
    """The loop's cluster adapter without Ray: replicas start at once; every front reports
    per-minute arrivals from ``per_min`` (models x minutes) and a latency under the SLO."""

    def __init__(self, names, per_min, cpus, clock):
        self.index = {n: i for i, n in enumerate(names)}
        self.per_min, self.cpus, self.clock = per_min, cpus, clock
        self.running = {n: 1 for n in names}
        self.start = clock()
        self.report_s = 0.0  # building the fronts' reports: the fake's cost, not the loop's

    def capacity(self):
        return float(self.cpus), None

    def running_replicas(self):
        return dict(self.running)

    def meter_reports(self, names):
        from faro_serve.meter_report import MeterReport, Processing

        t0 = time.perf_counter()
        age = self.clock() - self.start
        done = int(age // 60)
        out = {}
        for n in names:
            row = self.per_min[self.index[n]]
            rate = float(row[min(done, row.size - 1)]) / 60
            out[n] = MeterReport(
                model=n,
                now=self.clock(),
                arrival_rate=rate,
                arrivals_per_min=tuple(float(c) for c in row[:done]),
                current_minute_count=rate * (age - 60 * done),
                current_minute_elapsed_s=age - 60 * done,
                latency_ms=300.0,
                latency_p50_ms=200.0,
                latency_mean_ms=210.0,
                processing=Processing(154.0, 150.0, 300.0, 100),
                in_flight=1,
                mean_in_flight=1.0,
                queue_length=0.0,
                arrivals_total=0,
                completed_total=0,
                dropped={},
                drop_rate=0.0,
                replicas=self.running[n],
                percentile=99.0,
                setting={},
                waiting=0,
                dispatched=0,
                dispatch_capacity=0,
                replica_cpus=1.0,
                replica_memory_gb=None,
            ).wire()
        self.report_s += time.perf_counter() - t0
        return out

    def scale(self, name, replicas):
        self.running[name] = replicas

    def control(self, name, setting, percentile):
        pass


class SizedStore:
    """A StateStore that keeps the JSON text, so its size is what a real store would hold."""

    def __init__(self):
        self.text, self.saves, self.save_s = None, 0, 0.0

    def load(self):
        return None

    def save(self, state):
        t = time.perf_counter()
        self.text = json.dumps(state)
        self.saves += 1
        self.save_s += time.perf_counter() - t


def part_loop(args) -> dict:
    from autoscaler.driving.decision_log import json_default
    from autoscaler.driving.forecasters import choose_forecaster
    from autoscaler.driving.loop import AutoscalerLoop
    from autoscaler.driving.loop_config import AutoscalerConfig
    from bench.solver_bench import base_rates

    n = args.jobs
    rng = np.random.default_rng(36)
    rates = base_rates(rng)  # 10 jobs x minutes, requests/s
    jit = rng.uniform(0.8, 1.2, n)
    per_min = np.stack([np.round(rates[i % 10, 60:] * 60 * jit[i]) for i in range(n)])
    cfg = AutoscalerConfig.model_validate(
        {
            "cluster": {"cpus": args.capacity},
            "models": [{"name": f"m{i}", "slo_ms": 720, "processing_ms": 154} for i in range(n)],
            "forecaster": args.loop_forecaster,
        }
    )
    fc, fc_name = choose_forecaster(args.loop_forecaster, None)
    t = [1_800_000_000.0 - 60 * 60]  # the meters started an hour ago: 60 minutes of history
    clock = lambda: t[0]  # noqa: E731
    cluster = FakeCluster([m.name for m in cfg.models], per_min, args.capacity, clock)
    t[0] += 3600
    store = SizedStore()
    before = _rss_mb()["rss_mb"]
    loop = AutoscalerLoop(cfg, cluster, fc, clock=clock, store=store)
    ticks = []
    for _ in range(args.ticks):
        t0 = time.perf_counter()
        rec = loop.step()
        ticks.append({"ms": (time.perf_counter() - t0) * 1e3, "kind": (rec.get("decision") or {}).get("kind")})
        t[0] += loop.tick_s
    status = json.dumps(loop.status(), default=json_default)
    held = _deep_mb(list(loop.history))
    record = json.dumps(loop.history[-1], default=json_default) if loop.history else ""
    plan_ms = [x["ms"] for x in ticks if x["kind"] == "long_term"]
    other = [x["ms"] for x in ticks if x["kind"] != "long_term"]
    return {
        "models": n,
        "cpus": args.capacity,
        "forecaster": fc_name,
        "ticks": len(ticks),
        "plan_ticks": len(plan_ms),
        "plan_tick_ms_median": round(statistics.median(plan_ms), 1) if plan_ms else None,
        "plan_tick_ms_max": round(max(plan_ms), 1) if plan_ms else None,
        "other_tick_ms_median": round(statistics.median(other), 1),
        "other_tick_ms_p90": round(float(np.quantile(other, 0.9)), 1),
        "fake_reports_ms_per_tick": round(1e3 * cluster.report_s / len(ticks), 1),
        "state_json_bytes": len(store.text or ""),
        "state_save_ms_mean": round(1e3 * store.save_s / max(store.saves, 1), 1),
        "status_json_bytes": len(status),
        "decision_record_bytes": len(record),
        "history_records_kept": len(loop.history),
        "history_held_mb": round(held, 2),
        "history_maxlen": loop.history.maxlen,
        "rss_before_loop_mb": before,
        **_rss_mb(),
    }


def _deep_mb(obj) -> float:
    """Python memory of ``obj`` (a copy of it, traced): what the loop's records hold."""
    import copy
    import tracemalloc

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    dup = copy.deepcopy(obj)
    size = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del dup
    return size / 2**20


PARTS = {"planner": part_planner, "sim": part_sim, "loop": part_loop}
