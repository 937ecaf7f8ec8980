"""Sponge live on Ray Serve against a static replica, with clients behind a varying network
(issue 20).

Usage: ``python -m bench.sponge_live [--out runs/sponge-live] [--minutes 2] [--seed 0]``

One torchvision ResNet18 replica (random weights, 224 px) reserving both CPUs of this
machine, serving dynamic batches of up to 8 on the direct path; SLO 1 s at p99 end to end,
as in Sponge's evaluation. The replay sends JPEGs at a low rate for ``--minutes``, then three
times that rate for as long, each request declaring a network time from Sponge's bandwidth
walk (``--network-delay bandwidth``: 0.2 MB at 0.5-7 MB/s plus 20 ms), which counts in its
latency. Two runs of the same schedule on the same replica:

* ``static-2``: 2 threads, batch 1, the autoscaler measuring only (what the replica reserves);
* ``sponge``: the autoscaler runs Sponge every second: threads (its cores, within the 2 CPUs
  reserved: Ray cannot resize a replica) and batch size, from the queued requests' budgets
  net of their clients' network time and from the arrival rate (``profiles/resnet18.json``).

Reports SLO violations (over 1 s end to end, or failed), p99, and the mean threads (cores)
in use, time-weighted over Sponge's decisions. Loopback only; starts and stops its own
local Ray. About ``4 x minutes + 2`` minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import httpx
import numpy as np

from faro_serve.config import Batching, ClusterSpec, ModelSLO
from faro_serve.replay.network import parse_network
from faro_serve.traces import Trace

ROOT = Path(__file__).resolve().parents[1]
NAME = "detector"
LOW_PER_S, HIGH_PER_S = 6.0, 18.0  # ResNet18 here: 49 ms alone on 1 thread, 31 ms on 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/sponge-live", help="output directory (runs/sponge-live)")
    ap.add_argument("--minutes", type=int, default=2, help="minutes at each rate (2)")
    ap.add_argument("--seed", type=int, default=0, help="schedule and network seed (0)")
    args = ap.parse_args()
    from ray import serve

    from faro_serve.demo.live import demo_image
    from faro_serve.replay.client import send_schedule
    from faro_serve.replay.loadgen import build_schedule
    from faro_serve.replay.replay_report import client_latency, replay_result
    from faro_serve.serving.app import deploy
    from faro_serve.serving.names import METER
    from faro_serve.validation.live_runs import LiveCluster

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    slo = ModelSLO(
        name=NAME,
        slo_ms=1000,
        percentile=99,
        processing_ms=49,
        cpus=2,
        min_replicas=1,
        max_replicas=1,
        batching=Batching(profile=str(ROOT / "profiles/resnet18.json"), max_batch_size=8),
    )
    app = {"model": {"kind": "vision", "arch": "resnet18"}, "max_batch_size": 8, "data_path": "direct"}
    cluster = ClusterSpec(cpus=2, objective="fair_sum")
    counts = np.array([[LOW_PER_S * 60] * args.minutes + [HIGH_PER_S * 60] * args.minutes])
    sched = build_schedule(Trace([NAME], counts), seed=args.seed, network=parse_network("bandwidth"))
    body = demo_image()

    results = {}
    with LiveCluster(2) as lc:  # loopback-only local Ray, stopped at the end
        base = lc.base
        deploy([(slo, app)], cluster, dashboard_url=lc.dashboard, enabled=False)
        front = serve.get_deployment_handle(METER, app_name=NAME)
        for _ in range(20):  # warm the model: the first passes are slow
            httpx.post(f"{base}/{NAME}/predict", content=body, timeout=60)
        for policy in ("static-2", "sponge"):
            lc.deploy_autoscaler(
                {
                    "cluster": cluster.model_dump(),
                    "models": [slo.model_dump()],
                    "policy": "sponge",
                    "enabled": policy == "sponge",
                }
            )
            if policy == "static-2":
                front.control.remote(batch_size=1, threads=2).result(timeout_s=30)
            time.sleep(5)
            front.control.remote(reset_stats=True).result(timeout_s=30)
            t0 = time.time()
            rec = asyncio.run(send_schedule(sched, base, body=body, timeout_s=30, status_every_s=None))
            res = replay_result(sched, rec, {NAME: 1000.0}, {NAME: 99.0}, policy=policy, capacity=2)
            decisions = httpx.get(f"{base}/faro/decisions", params={"limit": 500}, timeout=10).json()
            ticks = [d for d in decisions if d["time"] >= t0 and d.get("decision")]
            threads = [d["decision"].get("threads", {}).get(NAME) for d in ticks]
            batches = [d["decision"].get("batch_sizes", {}).get(NAME) for d in ticks]
            m = front.metrics.remote(reset_mean=False).result(timeout_s=30)
            served, lat = client_latency(sched, rec)
            results[policy] = {
                "requests": int(sched.size),
                "answered_200": int(served.sum()),
                "slo_violation_rate": round(float(res.summary.cluster_slo_violation_rate), 5),
                "p99_ms": round(float(np.percentile(lat, 99, method="higher")) * 1e3, 1),
                "violations_per_minute": [
                    round(float(v), 4)
                    for v in (res.table.over_slo[0] + res.table.dropped[0]) / np.maximum(res.table.requests[0], 1)
                ],
                "failures": {
                    s: int(n) for s, n in zip(*np.unique([x for x in rec.status if x != "200"], return_counts=True))
                },
                "processing_ms_mean": (m.get("processing") or {}).get("mean_ms"),
                "mean_threads": round(float(np.mean(threads)), 3) if threads else 2.0,
                "mean_batch_set": round(float(np.mean(batches)), 3) if batches else 1.0,
                "mean_batch_served": round(float(m.get("mean_batch") or 1.0), 3),
                "network_ms_mean": round(float(sched.network_s.mean()) * 1e3, 1),
                "sponge_decisions": len(ticks),
                "wall_s": round(time.time() - t0, 1),
            }
            print(policy, results[policy], flush=True)
    doc = {
        "machine": "x86_64, 2 cores",
        "model": "resnet18 (random weights, 224 px)",
        "rates_per_s": [LOW_PER_S, HIGH_PER_S],
        "minutes_each": args.minutes,
        "seed": args.seed,
        "slo_ms": 1000,
        "network": str(sched.network),
        "results": results,
    }
    (out / "sponge-live.json").write_text(json.dumps(doc, indent=2) + "\n")
    rows = [
        "| policy | SLO violations | p99 end to end | mean threads (cores) | mean batch served |",
        "|---|---:|---:|---:|---:|",
    ]
    for p, r in results.items():
        rows.append(
            f"| {p} | {100 * r['slo_violation_rate']:.2f} % | {r['p99_ms']:.0f} ms | "
            f"{r['mean_threads']:.2f} | {r['mean_batch_served']:.2f} |"
        )
    text = "\n".join(
        [
            f"ResNet18 on one replica of 2 CPUs, {LOW_PER_S:g} then {HIGH_PER_S:g} "
            f"requests/s for {args.minutes} min each, network {sched.network} "
            f"(mean {results['sponge']['network_ms_mean']:.0f} ms), SLO 1 s p99 end to end",
            "",
            *rows,
            "",
        ]
    )
    (out / "sponge-live.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
