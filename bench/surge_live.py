"""The surge step live and simulated, with Faro's surge response off (as before issue 18) and
on (the default): the recovery time and the damage of the step's first two minutes
(``faro_serve.recovery``), measured the same way on both sides (docs/compare.md).

Usage: ``python -m bench.surge_live [--out runs/surge-live] [--seed 0]``

Two synthetic models with the paper's ResNet34 processing time (lognormal, mean 154 ms) and
SLO (720 ms at p99) on a local Ray cluster of 12 CPUs, each starting at one replica. Model
``a`` takes 0.8x what one replica serves within its SLO for 3 minutes, then steps to 5x for
4 minutes; ``b`` takes 1x throughout, so the cluster has free capacity. ``faro-fairsum``
runs live twice on freshly deployed models (surge off, then on); the simulator runs the same
schedule's counts with the cold start measured live (the median lag from a target increase
to the replicas serving). Loopback only; starts its own local Ray and stops it at the end.
About 20 minutes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from autoscaler import make_policy
from faro_serve.config import ModelSLO
from faro_serve.distributions import PAPER_PROCESSING
from faro_serve.engine import max_rate_for_slo
from faro_serve.recovery import surge_report
from faro_serve.replay.client import ERROR, NOT_SENT
from faro_serve.replay.loadgen import build_schedule
from faro_serve.replay.replay_report import replay_step
from faro_serve.sim.runner import SimConfig, simulate
from faro_serve.traces import Trace
from faro_serve.validation.comparison import REPLAY_TIMEOUT_S, cluster_spec, scale_up_lags

CAPACITY = 12
STEP_MIN, MINUTES = 3, 7
MODELS = [ModelSLO(name="a", slo_ms=720, processing_ms=154), ModelSLO(name="b", slo_ms=720, processing_ms=154)]
POLICY = "faro-fairsum"


def step_counts() -> np.ndarray:
    r1 = max_rate_for_slo(1, 0.154, 0.72, 0.99)  # requests/s one replica serves within the SLO
    counts = np.empty((2, MINUTES))
    counts[0] = 0.8 * r1 * 60
    counts[0, STEP_MIN:] = 5 * r1 * 60
    counts[1] = r1 * 60
    return counts


def simulated(counts: np.ndarray, surge: bool, cold_start_s: float, seed: int) -> dict:
    pol = make_policy(POLICY, MODELS, cluster_spec(CAPACITY).model_copy(update={"surge": surge}))
    res = simulate(
        counts,
        MODELS,
        pol,
        SimConfig(
            capacity_cpus=CAPACITY,
            cold_start_s=cold_start_s,
            client_timeout_s=REPLAY_TIMEOUT_S,
            keep_records=True,
            seed=seed,
        ),
    )
    r = res.records
    rep = surge_report(
        [m.name for m in MODELS], r["model"], r["arrival_s"], r["latency_s"], r["dropped"], 0.72, 99.0, 60.0 * STEP_MIN
    )
    return {**rep["models"]["a"], "surge_decisions": res.decisions.get("surge", 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/surge-live", help="output directory (runs/surge-live)")
    ap.add_argument("--seed", type=int, default=0, help="schedule and simulator seed (0)")
    args = ap.parse_args()
    from faro_serve.validation.live_runs import LiveCluster

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    counts = step_counts()
    sched = build_schedule(Trace([m.name for m in MODELS], counts), seed=args.seed)
    slo = {m.name: m.slo_ms for m in MODELS}
    pct = {m.name: m.percentile for m in MODELS}
    live, lags = {}, []
    with LiveCluster(CAPACITY) as lc:
        for surge in (False, True):
            t0 = time.time()
            _, rec, _ = lc.run_policy(
                POLICY, sched, MODELS, CAPACITY, str(PAPER_PROCESSING), None, cluster={"surge": surge}
            )
            lags += scale_up_lags(rec.status_polls, sched.names)
            rep = replay_step(sched, rec, slo, pct, 60.0 * STEP_MIN)["models"]["a"]
            decided = [(st.get("last_decision") or {}).get("kind") for _, st in rec.status_polls]
            live["on" if surge else "off"] = {
                **rep,
                "sent": int(sched.size),
                "answered": int(sum(s not in (ERROR, NOT_SENT) for s in rec.status)),
                "wall_s": round(time.time() - t0, 1),
                "surge_seen_in_status": "surge" in decided,
            }
            print("live, surge", "on" if surge else "off", live["on" if surge else "off"], flush=True)
    cold = float(np.median(lags)) if lags else 10.0
    sim = {k: simulated(counts, k == "on", cold, args.seed) for k in ("off", "on")}
    doc = {
        "step_s": 60.0 * STEP_MIN,
        "capacity": CAPACITY,
        "policy": POLICY,
        "requests": int(sched.size),
        "cold_start_s_live": round(cold, 2),
        "scale_up_lags_s": [round(x, 2) for x in lags],
        "live": live,
        "sim": sim,
    }
    (out / "surge.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        "| side | surge rule | recovery (s) | dropped | over SLO | bad of requests (first 2 min) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for side, d in (("live", live), ("sim", sim)):
        for k in ("off", "on"):
            r = d[k]
            rec_s = "not within 2 min" if r["recovery_s"] is None else f"{r['recovery_s']:.1f}"
            rows.append(
                f"| {side} | {k} | {rec_s} | {r['dropped']} | {r['over_slo']} | {r['bad']} of {r['requests']} |"
            )
    text = "\n".join(
        [
            f"Step at {60 * STEP_MIN} s, model a 0.8x -> 5x one replica's SLO rate, "
            f"capacity {CAPACITY}; live cold start (median scale-up lag) {cold:.1f} s; "
            f"target: recovery <= cold start + 15 s = {cold + 15:.1f} s",
            "",
            *rows,
            "",
        ]
    )
    (out / "surge.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
