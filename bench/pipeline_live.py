"""One pipeline and two single models live under faro-serve, against the simulator on the
same workload (issue 35's live target).

Live: a local Ray cluster on this machine; the pipeline ``shop`` (``detect`` -> ``classify``,
and ``detect`` -> ``explain`` for 40 % of the queries: a chain and a fan-out) built of
sleeping stages (``deployments/pipeline.py``) behind an ingress that walks the DAG through
handles, and two single models of the same kind, every one scaled by a faro-serve policy
(``faro_serve.run``). Three jobs of ``faro10_days1-10.csv`` (day 9, from minute 301: a slice
the simulator's other checks did not use) replayed open-loop to ``/shop``, ``/m1``, ``/m2``;
processing times and SLOs x ``--slowdown`` with rates / it, as ``faro-serve validate`` does,
so the machine's own overheads weigh less. Every request's status and latency recorded; the
ingress meter's count checked against what was sent.

Simulated: the same per-minute counts, models, pipeline and policy in the matched simulator
(``faro_serve.sim``), with the overhead measured on this machine before the run (per
single-model request and per pipeline query: end to end minus the replicas' processing).

    python -m bench.pipeline_live                 # 12 trace minutes, faro-fairsum
    python -m bench.pipeline_live --minutes 4     # a short look

Prints and writes ``bench/results/pipeline-live.json``: per job (the pipeline end to end,
each model) live and simulated p99 latency, SLO violations and the accounting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT.parent / "shared" / "traces" / "faro10_days1-10.csv"
OUT = ROOT / "bench" / "results" / "pipeline-live.json"


def setup(slowdown: float):
    """The pipeline, the two models and every stage's processing distribution."""
    from faro_serve import SLO, Pipeline, Stage
    from faro_serve.distributions import PAPER_PROCESSING

    k = slowdown
    means = {"detect": 0.040, "classify": 0.080, "explain": 0.060, "m1": 0.100, "m2": 0.060}
    proc = {n: PAPER_PROCESSING.scaled_to_mean(m * k) for n, m in means.items()}
    pipe = Pipeline(
        name="shop",
        slo_ms=450 * k,
        ingress="Ingress",
        stages=[
            Stage(name="detect", deployment="Detect", cpus=1, processing_ms=40 * k, max_replicas=8),
            Stage(
                name="classify", deployment="Classify", after=["detect"], cpus=1, processing_ms=80 * k, max_replicas=8
            ),
            Stage(
                name="explain",
                deployment="Explain",
                after=["detect"],
                fraction=0.4,
                cpus=1,
                processing_ms=60 * k,
                max_replicas=8,
            ),
        ],
    )
    models = [
        SLO(name="m1", slo_ms=400 * k, processing_ms=100 * k, cpus=1, max_replicas=8),
        SLO(name="m2", slo_ms=250 * k, processing_ms=60 * k, cpus=1, max_replicas=8),
    ]
    return pipe, models, proc


def apps(pipe, models, proc) -> dict:
    import faro_serve
    from deployments.pipeline import PipelineIngress, SleepStage

    stages = {
        s.name: faro_serve.scaled(SleepStage.options(name=s.model_extra["deployment"]), pipe, stage=s.name).bind(
            str(proc[s.name]), seed=i
        )
        for i, s in enumerate(pipe.stages)
    }
    shape = [{"name": n, "after": pipe.stage(n).after, "fraction": pipe.stage(n).fraction} for n in pipe.order()]
    out = {
        pipe.app_name: faro_serve.scaled(PipelineIngress.options(name="Ingress"), pipe).bind(shape, seed=7, **stages)
    }
    for i, m in enumerate(models):
        out[m.name] = faro_serve.scaled(SleepStage.options(name=f"M{i + 1}"), m).bind(str(proc[m.name]), seed=10 + i)
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(cond, timeout_s: float, every: float = 1.0):
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            got = cond()
        except Exception:
            got = None
        if got:
            return got
        time.sleep(every)
    return None


def calibrate(base: str, pipe, models, n: int = 60) -> dict:
    """Overheads at light load (one request at a time): end to end minus the processing the
    replicas report, per single model and per pipeline query (its hops included)."""
    import httpx

    out = {"model_s": [], "pipeline_s": []}
    with httpx.Client(base_url=base, timeout=30) as c:
        for _ in range(n):
            for m in models:
                t0 = time.perf_counter()
                r = c.post(f"/{m.name}", content=b"x")
                took = time.perf_counter() - t0
                if r.status_code == 200:
                    out["model_s"].append(took - r.json()["processing_ms"] / 1e3)
            t0 = time.perf_counter()
            r = c.post(f"/{pipe.app_name}", content=b"x")
            if r.status_code == 200:
                out["pipeline_s"].append(time.perf_counter() - t0)
    return out


def cluster_spec(args):
    """The cluster both sides plan for: a plan a minute, reactive steps every 5 s after 10 s
    over an SLO (the trace slice is minutes long, not hours)."""
    from faro_serve.config import ClusterSpec

    return ClusterSpec(
        cpus=args.capacity,
        long_term_interval_s=60,
        window_s=180,
        cold_start_s=args.cold_start_s,
        reactive_interval_s=5,
        reactive_trigger_s=10,
    )


def live_run(args, pipe, models, proc, tr) -> dict:
    import ray
    from ray import serve

    import faro_serve
    from faro_serve.replay.client import send_schedule
    from faro_serve.replay.loadgen import build_schedule
    from faro_serve.serving.names import meter_name

    dash, http = free_port(), free_port()
    # logical CPUs: the replicas sleep, so the capacity's replicas fit on 2 cores
    ray.init(
        address="local",
        num_cpus=int(args.capacity) + 1,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dash,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": http})
    base = f"http://127.0.0.1:{http}"
    cluster = cluster_spec(args)
    try:
        faro_serve.run(
            apps(pipe, models, proc),
            models + [pipe],
            cluster,
            policy=args.policy,
            dashboard_url=f"http://127.0.0.1:{dash}",
            forecaster="fallback",
        )
        import httpx

        names = {m.name for m in models} | set(pipe.stage_names)
        assert wait_for(
            lambda: set(httpx.get(f"{base}/faro/status", timeout=5).json().get("models", {})) >= names, 180
        ), "the autoscaler did not see every model"
        cal = calibrate(base, pipe, models)
        time.sleep(3)  # the routers report every second: the calibration's queries counted first
        ingress = serve.get_deployment_handle(meter_name("Ingress"), app_name=pipe.app_name)
        before = ingress.metrics.remote(reset_mean=False).result(timeout_s=30)["arrivals_total"]
        # rows as the simulator takes them (single models, then the pipeline), so both draw
        # the same per-minute counts from the seed
        sched = build_schedule(tr, [m.name for m in models] + [pipe.app_name], 1.0, 1.0, args.seed)
        t0 = time.time()
        rec = asyncio.run(send_schedule(sched, base, path="/{model}", body=b"x", timeout_s=60.0, max_in_flight=400))
        wall = time.time() - t0
        time.sleep(3)  # the routers report every second
        after = ingress.metrics.remote(reset_mean=False).result(timeout_s=30)["arrivals_total"]
    finally:
        serve.shutdown()
        ray.shutdown()
    j = sched.names.index(pipe.app_name)
    sent_pipe = int(sum(1 for i, s in zip(sched.model, rec.status) if i == j and s != "not_sent"))
    return {
        "schedule": sched,
        "expected": np.asarray(tr.counts, float),
        "records": rec,
        "calibration": cal,
        "wall_s": wall,
        "ingress_arrivals": after - before,
        "sent_to_pipeline": sent_pipe,
    }


def summarize_live(run: dict, pipe, models) -> dict:
    sched, rec = run["schedule"], run["records"]
    errors: dict[str, int] = {}
    for st, why in zip(rec.status, rec.reason):
        if st not in ("200",):
            errors[f"{st} {why}".strip()] = errors.get(f"{st} {why}".strip(), 0) + 1
    out = {
        "accounting": rec.counts(),
        "not_200": errors,
        "ingress_meter_counted": run["ingress_arrivals"],
        "sent_to_pipeline": run["sent_to_pipeline"],
    }
    slos = {pipe.app_name: pipe.slo_ms} | {m.name: m.slo_ms for m in models}
    for j, name in enumerate(sched.names):
        ok = np.array([s == "200" for s in rec.status]) & (sched.model == j)
        lat = rec.latency_s[ok] * 1e3
        n = int((sched.model == j).sum())
        out[name] = {
            "requests": n,
            "ok": int(ok.sum()),
            "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
            "slo_violation": float(np.mean(lat > slos[name])) if lat.size else None,
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=int, default=12)
    ap.add_argument("--start", type=int, default=301)
    ap.add_argument("--day", type=int, default=9)
    ap.add_argument("--jobs", default="job5,job8,job3", help="trace jobs of m1, m2 and the pipeline's entry")
    ap.add_argument("--rate-scale", type=float, default=1.0)
    ap.add_argument("--slowdown", type=float, default=2.0)
    ap.add_argument("--capacity", type=float, default=9.0)
    ap.add_argument("--cold-start-s", type=float, default=5.0)
    ap.add_argument("--policy", default="faro-fairsum")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--no-sim", action="store_true", help="the live run only")
    ap.add_argument("--draws", type=int, default=3, help="simulator draws (median reported)")
    ap.add_argument(
        "--resimulate", action="store_true", help="simulate the saved live run (<out>.pkl) again, without running live"
    )
    args = ap.parse_args(argv)
    from faro_serve.traces import load_trace

    pipe, models, proc = setup(args.slowdown)
    saved = Path(args.out).with_suffix(".pkl")
    if args.resimulate:  # the saved live run, simulated again (a changed simulator)
        run = pickle.loads(saved.read_bytes())
    else:
        tr = load_trace(str(TRACE), days=args.day, sample=0, jobs=args.jobs.split(","))
        tr = tr.window(args.start, args.start + args.minutes).scale(args.rate_scale / args.slowdown)
        run = live_run(args, pipe, models, proc, tr)
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_bytes(pickle.dumps(run))
    live = summarize_live(run, pipe, models)
    sim = {} if args.no_sim else simulate_same(args, pipe, models, proc, run)
    doc = {
        "args": vars(args),
        "machine": f"{os.cpu_count()} cores",
        "live": live,
        "sim": sim,
        "calibration": {k: float(np.median(v)) if v else None for k, v in run["calibration"].items()},
    }
    for name in [m.name for m in models] + [pipe.app_name]:
        lv, sv = live[name]["p99_ms"], sim.get(name, {}).get("p99_ms")
        doc.setdefault("p99_ratio_live_over_sim", {})[name] = None if not (lv and sv) else lv / sv
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2, default=float) + "\n")
    print(
        json.dumps(
            {k: doc[k] for k in ("live", "sim", "p99_ratio_live_over_sim", "calibration")}, indent=2, default=float
        )
    )
    return 0


def simulate_same(args, pipe, models, proc, run) -> dict:
    """The matched simulation of the live run: the same counts (the schedule's seed), models,
    pipeline, stage processing times and policy; the router overhead a lognormal fitted to
    the single models' measured overhead (each stage visit draws one), clients giving up
    after the replay's 60 s. Per job: the p50/p99 of served requests and SLO violations,
    the median over ``--draws`` draws of the per-request randomness."""
    from autoscaler import make_policy
    from faro_serve.pipelines import expand
    from faro_serve.sim.runner import SimConfig, simulate
    from faro_serve.validation.comparison import fit_overhead, scale_up_lags

    cluster = cluster_spec(args)
    ovh = fit_overhead(np.asarray(run["calibration"]["model_s"]))
    # the cold start the live run showed (target raised -> replicas serving, median over
    # every model and stage), as `faro-serve validate` takes it; the configured one without
    lags = scale_up_lags(run["records"].status_polls, [m.name for m in expand(models, [pipe])])
    cold = float(np.median(lags)) if len(lags) >= 3 else args.cold_start_s
    slos = {pipe.app_name: pipe.slo_ms} | {m.name: m.slo_ms for m in models}
    per: dict[str, list[dict]] = {}
    for draw in range(args.draws):
        pol = make_policy(args.policy, expand(models, [pipe]), cluster, None, pipelines=[pipe])
        cfg = SimConfig(
            capacity_cpus=args.capacity,
            cold_start_s=cold,
            processing=tuple(proc[m.name] for m in models),
            router_overhead=ovh,
            client_timeout_s=60.0,
            seed=args.seed,
            draw=draw,
            keep_records=True,
        )
        # the expected counts: the simulator draws the schedule's own counts from the seed
        res = simulate(
            run["expected"], models, pol, cfg, pipelines=[pipe], stage_processing={n: proc[n] for n in pipe.stage_names}
        )
        rec = res.records
        for j, name in enumerate(res.names):
            mine = rec["model"] == j
            lat = rec["latency_s"][mine & ~rec["dropped"].astype(bool)] * 1e3
            per.setdefault(name, []).append(
                {
                    "requests": int(mine.sum()),
                    "ok": int(lat.size),
                    "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                    "p99_ms": float(np.percentile(lat, 99)) if lat.size else None,
                    "slo_violation": float(np.mean(lat > slos[name])) if lat.size else None,
                }
            )
    out = {}
    for name, runs in per.items():
        out[name] = {
            k: (float(np.median([r[k] for r in runs])) if all(r[k] is not None for r in runs) else None)
            for k in runs[0]
        }
    out["router_overhead"] = str(ovh)
    out["cold_start_s"] = cold
    out["scale_up_lags_s"] = [round(x, 1) for x in sorted(lags)]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
