"""The data path's ceiling, through one Serve proxy and through two (issue 36, paper section 5).

Usage: ``python -m bench.proxy_bench [--seconds 10] [--concurrency 16] [--replay-s 30]
[--profile] [--out bench/results]``

Two real Ray nodes on this machine (``bench.ray_nodes``: one CPU each, a Serve proxy on each,
``proxy_location: EveryNode``, the worker's on a port of its own). On them, the same 0-ms
synthetic model twice, 4 replicas of 0.25 CPU each: faro-serve's direct path (the queue in
each proxy's router, ``ProxyQueueRouter``) and a plain Ray Serve deployment (Ray's default
router, ``max_ongoing_requests`` 2 as faro-serve's replicas, the router backoff faro-serve
uses). No autoscaler: this measures the data path alone.

* **ceiling**: a closed loop of ``--concurrency`` clients for ``--seconds`` through the head's
  proxy, then with the clients split over both proxies: completed requests per second, and
  the CPU-seconds every Ray process used per 1,000 (read from /proc; the client excluded);
* **replay**: an open loop (Poisson arrivals) at half the one-proxy faro ceiling for
  ``--replay-s``, through one proxy and then split over both: sent, answered by status,
  p50/p99. Every request must be accounted for; the target is the two-proxy p99 within
  10 % of the one-proxy p99;
* ``--profile``: py-spy samples the head's proxy during a faro closed loop, and the report
  gives the share of its samples in faro-serve's router against Ray's own code.

On this 2-core machine two proxies share the same two cores as the replicas and the client,
so the two-proxy ceiling shows correctness and cost under contention, not scale-out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

from bench.procstat import ray_cpu_seconds
from bench.ray_nodes import two_nodes, wait_for

DEPLOY = """
import sys
import ray
from ray import serve
from starlette.requests import Request
from deployments.synthetic import SyntheticModel
from faro_serve.serving.app import ROUTER, model_app

class PlainSynthetic(SyntheticModel):
    async def __call__(self, request: Request) -> dict:
        return await self.predict(await request.body())

ray.init(address=sys.argv[1], log_to_driver=False)
serve.start(proxy_location="EveryNode", http_options={"host": "127.0.0.1", "port": int(sys.argv[2])})
serve.run(model_app({"name": "faro", "model": {"kind": "synthetic", "processing": "const:0"},
                     "cpus": 0.25, "queue_limit": 1000, "data_path": "direct", "initial_replicas": 4}),
          name="faro", route_prefix="/faro")
plain = serve.deployment(PlainSynthetic, name="Plain", num_replicas=4, max_ongoing_requests=2,
                         request_router_config=ROUTER, ray_actor_options={"num_cpus": 0.25})
serve.run(plain.bind(processing="const:0"), name="plain", route_prefix="/plain")
print("deployed")
"""
PATHS = {"faro": "/faro/predict", "plain": "/plain"}


async def closed_loop(bases: list[str], path: str, seconds: float, concurrency: int):
    """``concurrency`` clients spread over ``bases`` for ``seconds``: (req/s of 200s, codes)."""
    codes: Counter = Counter()
    end = time.perf_counter() + seconds
    clients = [httpx.AsyncClient(base_url=b, timeout=30, trust_env=False) for b in bases]

    async def worker(c):
        while time.perf_counter() < end:
            try:
                codes[(await c.post(path, content=b"x")).status_code] += 1
            except httpx.HTTPError as err:
                codes[type(err).__name__] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*[worker(clients[i % len(clients)]) for i in range(concurrency)])
    wall = time.perf_counter() - t0
    for c in clients:
        await c.aclose()
    return codes[200] / wall, dict(codes)


async def replay(bases: list[str], path: str, rate: float, seconds: float, seed: int = 0):
    """Poisson arrivals at ``rate``/s for ``seconds``, each to the next proxy in turn:
    (sent, codes, latencies of the 200s in ms)."""
    rng = random.Random(seed)
    clients = [
        httpx.AsyncClient(base_url=b, timeout=60, trust_env=False, limits=httpx.Limits(max_connections=200))
        for b in bases
    ]
    codes: Counter = Counter()
    lat: list[float] = []

    async def one(c):
        t = time.perf_counter()
        try:
            r = await c.post(path, content=b"x")
            codes[r.status_code] += 1
            if r.status_code == 200:
                lat.append((time.perf_counter() - t) * 1e3)
        except httpx.HTTPError as err:
            codes[type(err).__name__] += 1

    tasks, t, start, k = [], 0.0, time.perf_counter(), 0
    while True:
        t += rng.expovariate(rate)
        if t > seconds:
            break
        await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
        tasks.append(asyncio.create_task(one(clients[k % len(clients)])))
        k += 1
    await asyncio.gather(*tasks)
    for c in clients:
        await c.aclose()
    return len(tasks), dict(codes), lat


def proxy_pids() -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(b"ray::ProxyActor"):
                    out.append(int(pid))
        except OSError:
            continue
    return out


THROUGH = (
    ("faro-serve (any frame)", "faro_serve/"),
    ("Ray's request router", "serve/_private/router.py"),
    ("Ray's HTTP proxy", "serve/_private/proxy.py"),
    ("uvicorn", "uvicorn/"),
    ("replica result / actor calls", "serve/_private/replica_result.py"),
    ("grpc", "grpc"),
)


def profile_shares(raw: str) -> dict:
    """py-spy's raw (collapsed) stacks -> the share of the proxy's samples whose stack passes
    through each of :data:`THROUGH` (a sample may pass through several), and the five
    busiest innermost Python frames (native work shows as the frame that called it)."""
    total = 0
    through: Counter = Counter()
    leaves: Counter = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        n = int(n)
        total += n
        for name, key in THROUGH:
            through[name] += n * (key in stack)
        leaves[stack.split(";")[-1] or "(no Python frame)"] += n
    share = lambda k: round(k / max(total, 1), 3)  # noqa: E731
    return {
        "samples": total,
        "through": {k: share(v) for k, v in through.most_common()},
        "busiest_innermost": [(k, share(v)) for k, v in leaves.most_common(5)],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--replay-s", type=float, default=30.0)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    res: dict = {
        "env": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "replay_s": args.replay_s,
        "loadavg_before": os.getloadavg()[0],
    }
    with two_nodes() as n:
        dep = subprocess.run(
            [sys.executable, "-c", DEPLOY, n.gcs, n.http.rsplit(":", 1)[1]],
            env=n.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if dep.returncode != 0 or "deployed" not in dep.stdout:
            raise RuntimeError(dep.stderr[-3000:])
        both = [n.http, n.http2]
        for base in both:  # both proxies up (the worker's starts with its first replica)
            for p in PATHS.values():
                if not wait_for(lambda: httpx.post(base + p, content=b"x", trust_env=False).status_code == 200, 60):
                    raise RuntimeError(f"{base}{p} does not answer")
        asyncio.run(closed_loop(both, PATHS["faro"], 2, 4))  # warm both routers
        asyncio.run(closed_loop(both, PATHS["plain"], 2, 4))
        rows = {}
        for proxies, bases in (("one", [n.http]), ("two", both)):
            for name, p in PATHS.items():
                cpu0 = ray_cpu_seconds()
                rps, codes = asyncio.run(closed_loop(bases, p, args.seconds, args.concurrency))
                cpu = ray_cpu_seconds() - cpu0
                rows[f"{name}, {proxies} prox{'y' if proxies == 'one' else 'ies'}"] = {
                    "throughput_rps": round(rps, 1),
                    "codes": codes,
                    "cpu_s_per_1000": round(1000 * cpu / max(codes.get(200, 0), 1), 3),
                }
                print(name, proxies, rows[list(rows)[-1]], flush=True)
        res["ceiling"] = rows
        rate = round(0.5 * rows["faro, one proxy"]["throughput_rps"], 1)
        res["replay_rate"] = rate
        rep = {}
        for name, p in PATHS.items():
            for proxies, bases in (("one", [n.http]), ("two", both)):
                sent, codes, lat = asyncio.run(replay(bases, p, rate, args.replay_s))
                a = np.array(lat) if lat else np.array([np.nan])
                rep[f"{name}, {proxies}"] = {
                    "sent": sent,
                    "codes": codes,
                    "answered": sum(codes.values()),
                    "p50_ms": round(float(np.percentile(a, 50)), 2),
                    "p99_ms": round(float(np.percentile(a, 99)), 2),
                }
                print(name, proxies, rep[f"{name}, {proxies}"], flush=True)
        res["replay"] = rep
        if args.profile:
            pids = proxy_pids()
            outs = []
            for pid in pids:
                f = Path(n.tmp) / f"spy-{pid}.txt"
                outs.append(
                    (
                        pid,
                        f,
                        subprocess.Popen(
                            [
                                str(Path(sys.executable).parent / "py-spy"),
                                "record",
                                "--pid",
                                str(pid),
                                "--format",
                                "raw",
                                "--rate",
                                "200",
                                "--duration",
                                str(int(args.seconds)),
                                "--output",
                                str(f),
                                "--nonblocking",
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        ),
                    )
                )
            asyncio.run(closed_loop([n.http], PATHS["faro"], args.seconds + 1, args.concurrency))
            prof = {}
            for pid, f, proc in outs:
                proc.wait(timeout=60)
                if f.exists():
                    prof[pid] = profile_shares(f.read_text())
            res["profile"] = max(prof.values(), key=lambda v: v["samples"], default=None)
    res["loadavg_after"] = os.getloadavg()[0]
    one, two = res["replay"]["faro, one"], res["replay"]["faro, two"]
    res["faro_two_proxy_p99_ratio"] = round(two["p99_ms"] / one["p99_ms"], 3)
    res["faro_cpu_ratio_vs_plain_one_proxy"] = round(
        rows["faro, one proxy"]["cpu_s_per_1000"] / rows["plain, one proxy"]["cpu_s_per_1000"], 3
    )
    out = Path(args.out) / "proxy.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k not in ("ceiling", "replay")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
