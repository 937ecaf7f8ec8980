"""Issue 48's live measurement: a plain Ray Serve application (two deployments under Ray's
own autoscaling, no faro-serve code: ``bench/plain_app.py``) serves a 20-minute slice of a
shared trace while a real Prometheus scrapes it and a faro autoscaler in shadow mode
(``observe: prometheus``) advises on it. Then:

1. ``forecasting.rayserve`` reads the minutes back: each deployment's per-minute requests
   against what was sent (the target: within 2 %);
2. ``faro-serve whatif``'s core replays them as they ran: the simulated SLO violation rate of
   Ray's settings against the one the proxy measured (target: within 15 %), and Faro's column;
3. the shadow's long-term plans against the same policy driven by the simulator on the
   recorded minutes (same models, same cluster, the same forecaster), plan by plan;
4. Serve's replica counts, polled all along, against what Ray's own autoscaler may set: the
   shadow never scaled anything (every count change is one Ray's target had asked for).

    python -m bench.whatif_live --out docs/results/whatif-live   # about 25 minutes

Loopback only; Prometheus from Debian's package (``make install`` as root installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "faro10_days1-10.csv"
SLO_MS = 100.0
CAPACITY = 1.0  # CPUs the shadow may plan within (each replica: 0.1)
LONG_TERM_S = 60.0
PHASE_S = 25.0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout, every=1.0):
    end = time.time() + timeout
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(every)
    return cond()


def start_prometheus(tmp: Path, scrape_s: int) -> tuple[subprocess.Popen, str]:
    gen = Path("/tmp/ray/session_latest/metrics/prometheus/prometheus.yml")
    if not _wait(gen.is_file, 30):
        raise SystemExit(f"Ray wrote no {gen}")
    cfg = tmp / "prometheus.yml"
    cfg.write_text(re.sub(r"scrape_interval: \S+", f"scrape_interval: {scrape_s}s", gen.read_text()))
    port = _free_port()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    if not _wait(lambda: _ok(f"{url}/-/ready"), 30):
        raise SystemExit("prometheus did not start")
    return proc, url


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


class Poller(threading.Thread):
    """Every 5 s: the shadow's status, and Serve's running and target replicas per deployment."""

    def __init__(self, base: str):
        super().__init__(daemon=True)
        self.base, self.rows, self.stop = base, [], threading.Event()

    def run(self):
        from ray import serve

        while not self.stop.is_set():
            try:
                st = httpx.get(f"{self.base}/faro/status", timeout=5).json()
                apps = serve.status().applications
                reps = {
                    a: {d: dict(x.replica_states) for d, x in app.deployments.items()}
                    for a, app in apps.items()
                    if a in ("a", "b")
                }
                self.rows.append({"t": time.time(), "status": st, "serve": reps})
            except Exception as err:  # noqa: BLE001 (a poll that fails is recorded as such)
                self.rows.append({"t": time.time(), "error": str(err)})
            self.stop.wait(5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=int, default=20)
    ap.add_argument("--day", type=int, default=9, help="the trace day (not one any setting was tuned on)")
    ap.add_argument("--jobs", default="job3,job7")
    ap.add_argument("--start", type=int, default=200, help="the slice's first minute of the day")
    ap.add_argument("--rescale", default="60,720", help="requests per minute, low,high")
    ap.add_argument("--scrape-s", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/whatif-live")
    args = ap.parse_args(argv)
    if shutil.which("prometheus") is None:
        raise SystemExit("needs Debian's prometheus (make install as root installs it)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import ray
    from ray import serve

    from faro_serve.config import ClusterSpec, ModelSLO
    from faro_serve.replay.client import send_schedule
    from faro_serve.replay.loadgen import build_schedule
    from faro_serve.serving.app import run_autoscaler
    from faro_serve.traces import Trace, load_trace

    jobs = args.jobs.split(",")
    tr = load_trace(TRACE, days=str(args.day), sample=0, jobs=jobs)
    sl = Trace(tr.names, tr.counts[:, args.start : args.start + args.minutes])
    lo, hi = (float(x) for x in args.rescale.split(","))
    sl = sl.rescale(lo, hi)
    names = ["a", "b"]
    schedule = build_schedule(sl, names, seed=args.seed)

    dash, http = _free_port(), _free_port()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dash,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": http})
    base, dashboard = f"http://127.0.0.1:{http}", f"http://127.0.0.1:{dash}"
    prom_proc, prom = start_prometheus(out, args.scrape_s)
    try:
        from bench import plain_app

        serve.run(plain_app.a, name="a", route_prefix="/a", blocking=False)
        serve.run(plain_app.b, name="b", route_prefix="/b", blocking=False)
        slos = [
            ModelSLO(name=n, app=n, deployment=d, slo_ms=SLO_MS, processing_ms=50, cpus=0.1, max_replicas=5)
            for n, d in (("a", "A"), ("b", "B"))
        ]
        spec = ClusterSpec(cpus=CAPACITY, objective="fair_sum", long_term_interval_s=LONG_TERM_S)
        # the replay starts at a minute's start (t0) and the shadow PHASE_S later: its plans
        # then see the minutes the simulator's plans see at t0 + 60 k (autoscaler/driving/serve_metrics.py
        # takes a minute as complete LAG_S after its end)
        time.sleep(60.0 - time.time() % 60.0)
        t0 = time.time()
        sender = threading.Thread(
            target=lambda: box.append(
                asyncio.run(send_schedule(schedule, base, path="/{model}", status_every_s=None, timeout_s=30.0))
            )
        )
        box: list = []
        sender.start()
        time.sleep(max(0.0, t0 + PHASE_S - time.time()))
        run_autoscaler(
            slos,
            spec,
            dashboard_url=dashboard,
            forecaster="fallback",
            mode="shadow",
            observe="prometheus",
            prometheus_url=prom,
        )
        poller = Poller(base)
        poller.start()
        sender.join()
        rec = box[0]
        sent_end = time.time()
        time.sleep(75 + args.scrape_s)  # the last minute complete and scraped
        poller.stop.set()
        poller.join()
        decisions = httpx.get(f"{base}/faro/decisions", params={"limit": 500}, timeout=10).json()
        from forecasting.rayserve import read_serve_history

        minutes = args.minutes
        hist = read_serve_history(prom, minutes, end=t0 + 60 * minutes, dashboard_url=dashboard)
        hist.save(out / "export.json")
        (out / "polls.json").write_text(json.dumps(poller.rows, default=str))
        (out / "decisions.json").write_text(json.dumps(decisions, default=str))
        (out / "schedule.json").write_text(
            json.dumps({"t0": t0, "counts": schedule.counts.tolist(), "accounting": rec.counts()})
        )
        doc = analyse(hist, schedule, rec, decisions, poller.rows, slos, spec, t0, out)
        doc.update(
            {
                "t0": t0,
                "sent_end": sent_end,
                "prometheus_scrape_s": args.scrape_s,
                "trace": f"{TRACE.name} day {args.day} jobs {args.jobs} minutes {args.start}.."
                f"{args.start + minutes - 1} rescaled to {args.rescale} req/min",
            }
        )
        (out / "result.json").write_text(json.dumps(doc, indent=1, default=str))
        print(json.dumps({k: v for k, v in doc.items() if k != "plans"}, indent=1, default=str))
    finally:
        prom_proc.terminate()
        serve.shutdown()
        ray.shutdown()
    return 0


def analyse(hist, schedule, rec, decisions, polls, slos, spec, t0, out: Path) -> dict:
    """The four checks of the module docstring, as figures."""
    from autoscaler.catalogue.registry import make_policy
    from autoscaler.driving.driver import decide as drive  # noqa: F401 (the sim drives it the same way)
    from faro_serve.sim.history_replay import processing_of, run_whatif
    from faro_serve.sim.runner import SimConfig, simulate

    # 1. reconstruction: requests answered per minute (by send time) against the reader's
    keys = {"a": "a/A", "b": "b/B"}
    sent = np.asarray(schedule.counts, float)
    read = np.stack([np.asarray(hist.deployments[keys[n]].arrivals) for n in ("a", "b")])
    rec_doc = {
        "sent": sent.sum(axis=1).tolist(),
        "read": read.sum(axis=1).tolist(),
        "total_error": (np.abs(read.sum(axis=1) - sent.sum(axis=1)) / sent.sum(axis=1)).round(4).tolist(),
        "worst_minute_error": (np.abs(read - sent) / np.maximum(sent, 1)).max(axis=1).round(4).tolist(),
        "minutes_within_2pct": ((np.abs(read - sent) / np.maximum(sent, 1)) <= 0.02).sum(axis=1).tolist(),
        "per_minute": {"sent": sent.tolist(), "read": read.tolist()},
    }
    # 2. the simulator's check on the settings as they ran, and Faro's column
    w = run_whatif(
        hist.select(list(keys.values())), CAPACITY, slos={keys[n]: (SLO_MS, 99.0) for n in ("a", "b")}, forecaster=None
    )
    from faro_serve.sim.history_replay_report import figures

    fig = figures(w)
    # 2b. how much the as-run figure hangs on the service time read back: the same replay
    # with every service time scaled (faro-serve whatif --service-scale)
    sens = {}
    for f in (0.85, 0.9, 0.95, 1.05):
        wf = figures(
            run_whatif(
                hist.select(list(keys.values())),
                CAPACITY,
                forecaster=None,
                service_scale=f,
                slos={keys[n]: (SLO_MS, 99.0) for n in ("a", "b")},
            )
        )
        sens[f"{f:g}"] = {
            k: {"service_ms": r["processing_mean_ms"], "as_run": r["as_run"]["slo_violation_rate"]}
            for k, r in wf["deployments"].items()
        }
    # 3. the shadow's long-term plans against the simulator's on the same minutes
    live = [
        (float(d["time"]) - t0 - PHASE_S, d["decision"]["replicas"])
        for d in decisions
        if d.get("decision") and d["decision"]["kind"] == "long_term"
    ]
    procs = [processing_of(hist.deployments[keys[m.name]], [])[0] for m in slos]
    cfg = SimConfig(capacity_cpus=CAPACITY, processing=tuple(procs), seed=0)
    planned: list[tuple[float, dict]] = []
    pol = make_policy(f"faro-{spec.objective.replace('_', '')}", slos, spec, None)
    inner = pol.decide

    def recording(obs):
        d = inner(obs)
        if d is not None and d.kind == "long_term":
            planned.append((obs.now, {n: s.replicas for n, s in d.settings.items() if s.replicas is not None}))
        return d

    pol.decide = recording
    simulate(read, slos, pol, cfg)
    pairs = []
    for t, reps in live:
        sim = min(planned, key=lambda p: abs(p[0] - t), default=None)
        if sim is not None and abs(sim[0] - t) <= spec.reactive_interval_s + 1:
            pairs.append(
                {
                    "t": round(t, 1),
                    "shadow": reps,
                    "sim_t": sim[0],
                    "sim": sim[1],
                    "equal": all(sim[1].get(n) == r for n, r in reps.items()),
                }
            )
    # 4. the shadow never scaled: Serve's targets move only where Ray's autoscaler set them
    counts = [(r["t"] - t0, r["serve"]) for r in polls if "serve" in r]
    return {
        "reconstruction": rec_doc,
        "whatif": fig,
        "service_scale": sens,
        "plans": pairs,
        "plans_equal": f"{sum(p['equal'] for p in pairs)}/{len(pairs)}",
        "replicas_seen": counts[-5:],
        "accounting": rec.counts(),
    }


if __name__ == "__main__":
    sys.exit(main())
