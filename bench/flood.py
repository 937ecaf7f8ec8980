"""The flood of issue 19, with the client that sends it measured too (docs/serving.md
"Under a flood").

Usage: ``python -m bench.flood [--requests 1500] [--concurrency 300] [--client aiohttp|httpx|both]``

One synthetic model with the paper's ResNet34 processing time (mean 154 ms), 3 replicas,
the default queue limit (50), on the default data path. ``--requests`` POSTs, at most
``--concurrency`` open at once, as fast as answers come back. Per client library: how many
got 200 and 503, how long they took, and the CPU seconds the client process and Ray's
proxy used. The bound: an admitted request waits at most (50 + 2 x 3) / 3 x 154 ms, about
2.9 s, then its own processing. Loopback only; starts its own local Ray and stops it.
"""

import argparse
import asyncio
import json
import os
import resource
import time

import numpy as np

from faro_serve.distributions import PAPER_PROCESSING
from faro_serve.replay.client import post_burst
from faro_serve.validation.live_runs import LiveCluster

from .procstat import ray_cpu_seconds

REPLICAS = 3


async def _aiohttp(url: str, n: int, concurrency: int) -> list[tuple]:
    return await post_burst(url, n, concurrency)


async def _httpx(url: str, n: int, concurrency: int) -> list[tuple]:
    import httpx

    out, sem = [], asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(
        timeout=120, trust_env=False, limits=httpx.Limits(max_connections=concurrency + 10)
    ) as c:

        async def one():
            async with sem:
                t0 = time.perf_counter()
                try:
                    r = await c.post(url, content=b"x")
                    out.append((r.status_code, time.perf_counter() - t0, None))
                except Exception as err:
                    out.append((type(err).__name__, time.perf_counter() - t0, None))

        await asyncio.gather(*(one() for _ in range(n)))
    return out


CLIENTS = {"aiohttp": _aiohttp, "httpx": _httpx}


def _cpu_self() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process, Ray's included
    return r.ru_utime + r.ru_stime


def flood(url: str, client: str, n: int, concurrency: int) -> dict:
    ray0, me0, t0 = ray_cpu_seconds(), _cpu_self(), time.perf_counter()
    res = asyncio.run(CLIENTS[client](url, n, concurrency))
    wall = time.perf_counter() - t0
    codes = [r[0] for r in res]
    ok = np.array([t for c, t, _ in res if c == 200])
    no = np.array([t for c, t, _ in res if c == 503])
    return {
        "client": client,
        "wall_s": round(wall, 1),
        "200": int(ok.size),
        "503": int(no.size),
        "other": n - int(ok.size) - int(no.size),
        "max_200_s": round(float(ok.max()), 2) if ok.size else None,
        "median_503_s": round(float(np.median(no)), 2) if no.size else None,
        "p90_503_s": round(float(np.percentile(no, 90)), 2) if no.size else None,
        "client_cpu_s": round(_cpu_self() - me0, 1),
        "ray_cpu_s": round(ray_cpu_seconds() - ray0, 1),
        "lost": len([c for c in codes if not isinstance(c, int)]),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1500, help="POSTs in all (1500)")
    ap.add_argument("--concurrency", type=int, default=300, help="open at once at most (300)")
    ap.add_argument(
        "--client",
        choices=("aiohttp", "httpx", "both"),
        default="both",
        help="the client library that sends the flood (both: one after the other)",
    )
    args = ap.parse_args(argv)
    if not (1 <= args.concurrency <= args.requests <= 20_000 and args.concurrency <= 1000):
        ap.error("need 1 <= --concurrency <= --requests <= 20000 and --concurrency <= 1000")
    clients = ["aiohttp", "httpx"] if args.client == "both" else [args.client]
    with LiveCluster(REPLICAS) as lc:
        lc.deploy_models(["flood"], str(PAPER_PROCESSING))  # the paper's ResNet34
        lc.scale("flood", REPLICAS)
        end = time.time() + 120
        while time.time() < end and lc.running().get("flood") != REPLICAS:
            time.sleep(1)
        url = f"{lc.base}/flood/predict"
        for client in clients:
            time.sleep(5)  # the previous flood's queue drains
            print(json.dumps(flood(url, client, args.requests, args.concurrency)), flush=True)
    print(f"machine: {os.cpu_count()} cores; 1-min load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
