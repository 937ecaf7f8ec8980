"""The replica hold idle and under load (docs/validation.md): how long a Ray Serve replica
stays idle between two queued requests, measured by the matched validation's burst
calibration, first on a quiet cluster, then while three other models take open-loop
Poisson load.

Usage: ``python -m bench.replica_hold [--rate 4.3] [--seconds 90] [--data-path direct|front]``

Four synthetic models with the validation's processing time (the paper's ResNet34
lognormal x3): ``m0`` with one replica takes the bursts; ``m1..m3`` with three replicas
each get ``--rate`` requests/s each (4.3 x 3 is about the validation workload's mean rate).
Loopback only; starts its own local Ray and stops it at the end.
"""

import argparse
import asyncio
import os
import time

import numpy as np

from faro_serve.replay.client import send_schedule
from faro_serve.replay.loadgen import build_schedule
from faro_serve.traces import Trace
from faro_serve.validation.calibration import burst_hold
from faro_serve.validation.live_runs import LiveCluster

PROCESSING = "lognorm:0.4225,0.2379,0.2058"
LOADED = ("m1", "m2", "m3")


def _schedule(rate: float, seconds: float):
    """Open-loop Poisson arrivals at ``rate`` per loaded model: the replay's own generator."""
    minutes = int(np.ceil(seconds / 60))
    return build_schedule(Trace(list(LOADED), np.full((len(LOADED), minutes), rate * 60.0)))


async def _measure(lc: LiveCluster, rate: float, seconds: float) -> dict:
    idle = await burst_hold(lc.base, "m0", 30)
    stop = asyncio.Event()
    bg = asyncio.create_task(
        send_schedule(_schedule(rate, seconds), lc.base, timeout_s=60.0, status_every_s=None, stop_sending=stop)
    )
    await asyncio.sleep(min(30.0, seconds / 3))  # let queues and the load average settle
    loaded = await burst_hold(lc.base, "m0", 30)
    load_avg = os.getloadavg()[0]
    stop.set()
    rec = await bg
    sent = int(np.isfinite(rec.send_s).sum())
    return {"idle": idle, "loaded": loaded, "load_average": load_avg, "sent": sent}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=4.3, help="requests/s to each loaded model (4.3)")
    ap.add_argument("--seconds", type=float, default=90.0, help="at most this long under load (90)")
    ap.add_argument(
        "--data-path", choices=("direct", "front"), default="direct", help="the models' data path (direct, the default)"
    )
    args = ap.parse_args(argv)
    if not (0 < args.rate <= 50 and 10 <= args.seconds <= 600):
        ap.error("--rate must be in (0, 50] and --seconds in [10, 600]")
    with LiveCluster(12, args.data_path) as lc:
        lc.deploy_models(["m0", *LOADED], PROCESSING)
        for n in LOADED:
            lc.scale(n, 3)
        end = time.time() + 120
        while time.time() < end and any(lc.running().get(n) != 3 for n in LOADED):
            time.sleep(1)
        res = asyncio.run(_measure(lc, args.rate, args.seconds))
    print(
        f"data path: {args.data_path}; load: {args.rate:g} req/s on each of {len(LOADED)} models (3 replicas each), "
        f"{res['sent']} requests; 1-min load average {res['load_average']:.2f}"
    )
    for k in ("idle", "loaded"):
        h = np.asarray(res[k]) * 1e3
        print(f"{k}: replica hold p50 {np.median(h):.1f} ms, p90 {np.percentile(h, 90):.1f} ms ({h.size} gaps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
