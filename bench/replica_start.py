"""What starting a ResNet replica costs on this machine (issue 19, the demo): wall time from
the scale-up call to the replica serving, CPU-seconds all Ray processes used for it (above
their idle rate), and what it does to a replica already serving: its processing time
while a start runs against before.

Usage: ``python -m bench.replica_start [--arch resnet34] [--starts 3]``

One model application on a local Ray (loopback only), scaled 1 -> 2 -> ... through the
external scaling API the autoscaler uses, while one client keeps one request in flight to
it. Writes ``bench/results/replica_start.json``.
"""

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.procstat import ray_cpu_seconds
from faro_serve.demo.live import demo_image
from faro_serve.validation.calibration import wait_until as _wait
from faro_serve.validation.live_runs import LiveCluster


def _serve_load(base: str, name: str, body: bytes, stop: threading.Event, out: list) -> None:
    """One request in flight: (wall time, processing ms) of each answer."""
    with httpx.Client(base_url=base, timeout=60, trust_env=False) as c:
        while not stop.is_set():
            r = c.post(f"/{name}/predict", content=body)
            if r.status_code == 200:
                out.append((time.time(), r.json()["processing_ms"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="resnet34", choices=("resnet18", "resnet34", "resnet50"))
    ap.add_argument("--starts", type=int, default=3, help="scale-ups to measure (3)")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    if not 1 <= args.starts <= 6:
        ap.error("--starts must be in 1..6")
    from ray import serve

    from faro_serve.serving.app import model_app

    name, body = "rn", demo_image()
    starts, served, spans = [], [], []
    with LiveCluster(8) as lc:
        serve.run(
            model_app({"name": name, "model": {"kind": "vision", "arch": args.arch}, "cpus": 0.25}),
            name=name,
            route_prefix=f"/{name}",
            external_scaler_enabled=True,
            blocking=False,
        )
        _wait(lambda: lc.running().get(name) == 1, 300, "the model to serve")
        stop = threading.Event()
        load = threading.Thread(target=_serve_load, args=(lc.base, name, body, stop, served), daemon=True)
        load.start()
        time.sleep(10)  # warm the serving replica; its processing time settles
        c0, t0 = ray_cpu_seconds(), time.time()
        time.sleep(10)
        idle_rate = (ray_cpu_seconds() - c0) / (time.time() - t0)  # serving, no start
        for k in range(2, args.starts + 2):
            c0, t0 = ray_cpu_seconds(), time.time()
            lc.scale(name, k)
            _wait(lambda: lc.running().get(name) == k, 300, f"{name} to scale to {k}", every_s=0.1)
            wall = time.time() - t0
            cpu = ray_cpu_seconds() - c0 - idle_rate * wall
            starts.append({"to": k, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
            spans.append((t0, t0 + wall))
            time.sleep(8)
        stop.set()
        load.join(timeout=60)
    t = np.array([a for a, _ in served])
    p = np.array([b for _, b in served])
    during = np.zeros(t.size, bool)
    for a, b in spans:
        during |= (t >= a) & (t <= b)
    before = t < spans[0][0]
    res = {
        "env": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "arch": args.arch,
        "starts": starts,
        "wall_s_median": float(np.median([s["wall_s"] for s in starts])),
        "cpu_s_median": float(np.median([s["cpu_s"] for s in starts])),
        "idle_cpu_rate": round(idle_rate, 3),
        "serving_processing_ms": {
            "before_p50": float(np.median(p[before])) if before.any() else None,
            "during_start_p50": float(np.median(p[during])) if during.any() else None,
            "during_start_max": float(p[during].max()) if during.any() else None,
            "n_before": int(before.sum()),
            "n_during": int(during.sum()),
        },
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "replica_start.json").write_text(json.dumps(res, indent=2))
    sp = res["serving_processing_ms"]
    print(
        f"{args.arch} replica start ({res['env']}): wall median {res['wall_s_median']:.1f} s, "
        f"CPU median {res['cpu_s_median']:.1f} CPU-s above the serving rate ({len(starts)} starts: "
        + ", ".join(f"{s['wall_s']} s / {s['cpu_s']} CPU-s" for s in starts)
        + ")"
    )
    print(
        f"the serving replica's processing: p50 {sp['before_p50']:.0f} ms before, "
        f"{sp['during_start_p50']:.0f} ms during starts (max {sp['during_start_max']:.0f} ms; "
        f"{sp['n_before']} / {sp['n_during']} requests)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
