"""A user's unchanged ``@serve.batch`` deployment, plain Ray Serve against Faro, one replica
(issue 47's target): ``python -m bench.user_batch_bench``.

The deployment is ``examples/gpu_batch/app.py``'s, written as Ray Serve's docs batch:
``__call__`` awaits ``self.infer(body)``, ``infer`` is ``@serve.batch(max_batch_size=16,
batch_wait_timeout_s=0.004)``; a batch of ``b`` sleeps ``--scale`` x the H200's ResNet50
``l(b)``. Plain Ray Serve runs it as a user tunes it (one replica, ``max_ongoing_requests``
32: two batches, Ray's warning asks at least one); Faro runs it through
``faro_serve.scaled`` with an SLO and nothing else changed (its own router, guard and gate;
``max_replicas`` 1). The same ``--clients`` closed-loop clients for ``--seconds`` each, on a
local Ray (loopback only): requests/s, latency and the batches the answers report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


async def _clients(url: str, clients: int, seconds: float) -> list[tuple[int, float, int]]:
    """Closed-loop clients: (status, seconds, batch the answer reports) per request."""
    import httpx

    out, end = [], time.perf_counter() + seconds

    async def one(c):
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                r = await c.post(url, content=b"x" * 64)
                batch = r.json().get("batch", 0) if r.status_code == 200 else 0
                out.append((r.status_code, time.perf_counter() - t0, batch))
            except Exception as err:
                out.append((type(err).__name__, time.perf_counter() - t0, 0))

    async with httpx.AsyncClient(timeout=60, trust_env=False, limits=httpx.Limits(max_connections=clients + 4)) as c:
        await asyncio.gather(*(one(c) for _ in range(clients)))
    return out


def _summary(res: list, seconds: float) -> dict:
    ok = [r for r in res if r[0] == 200]
    lat = np.array([r[1] for r in ok]) if ok else np.array([np.nan])
    batches = np.array([r[2] for r in ok]) if ok else np.array([0])
    codes: dict = {}
    for r in res:
        if r[0] != 200:
            codes[str(r[0])] = codes.get(str(r[0]), 0) + 1
    return {
        "requests": len(res),
        "ok": len(ok),
        "errors": len(res) - len(ok),
        "codes": codes,
        "rps": round(len(ok) / seconds, 1),
        "p50_ms": round(float(np.median(lat)) * 1e3, 1),
        "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 1),
        "mean_batch": round(float(batches.mean()), 2),
        "max_batch": int(batches.max()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument(
        "--scale", type=float, default=10.0, help="x the H200 ResNet50 curve (10: 33 ms alone, 43 ms for 16)"
    )
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "user-batch-bench.md"))
    args = ap.parse_args(argv)

    import ray
    from ray import serve

    import faro_serve
    from examples.gpu_batch.app import GpuLikeClassifier
    from faro_serve import SLO, Cluster
    from faro_serve.ports import free_port

    port, dash = free_port(), free_port()
    # the dashboard serves the REST API the autoscaler scales through (one replica here, but
    # its ticks must not fail: a failing tick applies nothing)
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=1,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=dash,
        log_to_driver=False,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url, out = f"http://127.0.0.1:{port}", {}
    try:
        plain = GpuLikeClassifier.options(max_ongoing_requests=32, ray_actor_options={"num_cpus": 0.2, "num_gpus": 1})
        serve.run(plain.bind(scale=args.scale, seed=0), name="plain", route_prefix="/plain")
        asyncio.run(_clients(url + "/plain", 4, 2.0))  # warm up
        out["plain"] = _summary(asyncio.run(_clients(url + "/plain", args.clients, args.seconds)), args.seconds)
        serve.delete("plain")
        slo = SLO(name="gpu", slo_ms=2000, cpus=0.2, gpus=1, max_replicas=1)
        app = faro_serve.scaled(GpuLikeClassifier.options(ray_actor_options={"num_cpus": 0.2}), slo)
        faro_serve.run(
            {"gpu": app.bind(scale=args.scale, seed=0)},
            [slo],
            Cluster(cpus=2, gpus=1),
            forecaster="fallback",
            dashboard_url=f"http://127.0.0.1:{dash}",
        )
        asyncio.run(_clients(url + "/gpu", 4, 2.0))
        out["faro"] = _summary(asyncio.run(_clients(url + "/gpu", args.clients, args.seconds)), args.seconds)
    finally:
        serve.shutdown()
        ray.shutdown()
    ratio = out["faro"]["rps"] / out["plain"]["rps"]
    lines = [
        "# A user's @serve.batch deployment: plain Ray Serve against Faro, one replica (issue 47)",
        "",
        f"`python -m bench.user_batch_bench --clients {args.clients} --seconds {args.seconds:g} "
        f"--scale {args.scale:g}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, this "
        "machine, one run). examples/gpu_batch's GpuLikeClassifier, @serve.batch(max_batch_size=16, "
        "batch_wait_timeout_s=0.004), unchanged in both.",
        "",
        "| | requests | not 200 | req/s | p50 ms | p99 ms | mean batch | largest batch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k, r in out.items():
        bad = ", ".join(f"{n} x {c}" for c, n in sorted(r["codes"].items())) or "0"
        lines.append(
            f"| {k} | {r['requests']} | {bad} | {r['rps']} | {r['p50_ms']} | "
            f"{r['p99_ms']} | {r['mean_batch']} | {r['max_batch']} |"
        )
    lines += ["", f"Faro serves {ratio:.2f}x plain Ray Serve's requests/s (issue 47's target: at least 0.8x)."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps({"args": vars(args), **out}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
