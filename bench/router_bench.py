"""What the router front costs (paper section 5): the same 0-ms synthetic model served
through faro-serve's front, on its direct path (``data_path: direct``: queue in the proxy,
no second hop) and as a plain Ray Serve deployment, in one run.

Usage: ``python -m bench.router_bench [--requests 400] [--seconds 10] [--concurrency 16]``

* latency: sequential requests (one in flight), paths interleaved, p50 and p99;
* throughput: a closed loop with ``--concurrency`` requests in flight for ``--seconds``;
  the completed requests per second is the highest rate each path sustains here;
* cost: CPU-seconds used by every Ray process (raylet, GCS, proxy, controller, replicas,
  read from /proc) during that loop, per 1,000 completed requests. The client is not
  counted; every path's deployments stay up throughout, so idle work is in every row.
Starts its own local Ray on free loopback ports and shuts it down at the end.
"""

import argparse
import asyncio
import json
import platform
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import ray
from ray import serve
from starlette.requests import Request

from bench.procstat import ray_cpu_seconds
from deployments.synthetic import SyntheticModel
from faro_serve.serving.app import ROUTER, model_app


class PlainSynthetic(SyntheticModel):
    """The same model as a plain Serve HTTP deployment: no front, no drops, no metrics."""

    async def __call__(self, request: Request) -> dict:
        return await self.predict(await request.body())


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _latency(base, paths, n):
    lat = {p: [] for p in paths}
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        for p in paths:  # warm up
            for _ in range(20):
                await c.post(p, content=b"x")
        for _ in range(n):
            for p in paths:
                t0 = time.perf_counter()
                r = await c.post(p, content=b"x")
                lat[p].append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text
    return lat


async def _throughput(base, path, seconds, concurrency):
    done, codes = 0, {}
    end = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=httpx.Limits(max_connections=concurrency)) as c:

        async def worker():
            nonlocal done
            while time.perf_counter() < end:
                r = await c.post(path, content=b"x")
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                done += r.status_code == 200

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        wall = time.perf_counter() - t0
    return done / wall, codes


def measure(base: str, paths: dict[str, str], requests: int, seconds: float, concurrency: int) -> dict[str, dict]:
    """Per named path: p50/p99 of ``requests`` sequential requests (the paths interleaved),
    then the throughput of a closed loop and the Ray CPU-seconds per 1,000 it completed."""
    lat = asyncio.run(_latency(base, list(paths.values()), requests))
    rows = {}
    for name, p in paths.items():
        cpu0 = ray_cpu_seconds()
        rps, codes = asyncio.run(_throughput(base, p, seconds, concurrency))
        cpu = ray_cpu_seconds() - cpu0
        a = np.array(lat[p])
        rows[name] = {
            "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3),
            "throughput_rps": round(rps, 1),
            "codes": codes,
            "cpu_s_per_1000": round(1000 * cpu / max(codes.get(200, 0), 1), 3),
        }
    return rows


def start(doc: str, argv=None) -> tuple[argparse.Namespace, int]:
    """The router benches' flags (``--requests --seconds --concurrency --out``) parsed, and a
    local Ray on 2 CPUs with Serve's proxy on a free loopback port (returned)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    port = _port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    return args, port


def result_head(args, rows: dict) -> dict:
    """What every router bench result starts with: the machine, the run's flags, the rows."""
    return {
        "env": f"{platform.machine()}, {__import__('os').cpu_count()} cores, Python "
        f"{platform.python_version()}, ray {ray.__version__}",
        "requests": args.requests,
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "rows": rows,
    }


def save_and_show(res: dict, path: Path, title: str) -> None:
    """The result as JSON at ``path``, and its rows as a markdown table under ``title``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=2))
    print(title)
    print("| path | p50 ms | p99 ms | throughput req/s | Ray CPU-s per 1,000 |\n|---|---|---|---|---|")
    for name, r in res["rows"].items():
        print(f"| {name} | {r['p50_ms']} | {r['p99_ms']} | {r['throughput_rps']} | {r['cpu_s_per_1000']} |")


def main(argv=None) -> int:
    args, port = start(__doc__, argv)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for path in ("front", "direct"):
            serve.run(
                model_app(
                    {
                        "name": path,
                        "model": {"kind": "synthetic", "processing": "const:0"},
                        "cpus": 0.25,
                        "queue_limit": 1000,
                        "data_path": path,
                    }
                ),
                name=path,
                route_prefix=f"/{path}",
            )
        plain = serve.deployment(
            PlainSynthetic, name="Plain", max_ongoing_requests=1, ray_actor_options={"num_cpus": 0.25}
        )
        serve.run(plain.bind(processing="const:0"), name="plain", route_prefix="/plain")
        # the same plain deployment with the router backoff the model deployments use, so the
        # difference to "front" is the front alone
        tuned = plain.options(name="PlainTuned", request_router_config=ROUTER)
        serve.run(tuned.bind(processing="const:0"), name="plain-tuned", route_prefix="/plain-tuned")
        base = f"http://127.0.0.1:{port}"
        paths = {
            "plain": "/plain",
            "plain-tuned": "/plain-tuned",
            "front": "/front/predict",
            "direct": "/direct/predict",
        }
        rows = measure(base, paths, args.requests, args.seconds, args.concurrency)
    finally:
        serve.shutdown()
        ray.shutdown()
    res = {
        **result_head(args, rows),
        "p50_overhead_ms": round(rows["front"]["p50_ms"] - rows["plain"]["p50_ms"], 3),
        "p99_overhead_ms": round(rows["front"]["p99_ms"] - rows["plain"]["p99_ms"], 3),
        "throughput_ratio": round(rows["front"]["throughput_rps"] / rows["plain"]["throughput_rps"], 3),
        "p50_overhead_vs_tuned_ms": round(rows["front"]["p50_ms"] - rows["plain-tuned"]["p50_ms"], 3),
        "throughput_ratio_vs_tuned": round(rows["front"]["throughput_rps"] / rows["plain-tuned"]["throughput_rps"], 3),
        "direct_p50_overhead_ms": round(rows["direct"]["p50_ms"] - rows["plain"]["p50_ms"], 3),
        "direct_p99_overhead_ms": round(rows["direct"]["p99_ms"] - rows["plain"]["p99_ms"], 3),
        "direct_throughput_ratio": round(rows["direct"]["throughput_rps"] / rows["plain"]["throughput_rps"], 3),
        "direct_throughput_ratio_vs_tuned": round(
            rows["direct"]["throughput_rps"] / rows["plain-tuned"]["throughput_rps"], 3
        ),
        "direct_cpu_ratio_vs_tuned": round(rows["direct"]["cpu_s_per_1000"] / rows["plain-tuned"]["cpu_s_per_1000"], 3),
        "front_cpu_ratio_vs_tuned": round(rows["front"]["cpu_s_per_1000"] / rows["plain-tuned"]["cpu_s_per_1000"], 3),
    }
    save_and_show(
        res, Path(args.out) / "router.json", f"router front vs plain Ray Serve, 0-ms synthetic model ({res['env']})"
    )
    print(
        f"front: p50 overhead {res['p50_overhead_ms']} ms (target <= 2), p99 overhead "
        f"{res['p99_overhead_ms']} ms, throughput ratio {res['throughput_ratio']} (target >= 0.8)"
    )
    print(
        f"against plain with the same router backoff: p50 overhead {res['p50_overhead_vs_tuned_ms']} ms, "
        f"throughput ratio {res['throughput_ratio_vs_tuned']}"
    )
    print(
        f"direct: p50 overhead {res['direct_p50_overhead_ms']} ms (target <= 2), p99 overhead "
        f"{res['direct_p99_overhead_ms']} ms, throughput ratio {res['direct_throughput_ratio']} "
        f"(target >= 0.8), {res['direct_throughput_ratio_vs_tuned']} against plain-tuned"
    )
    print(
        f"CPU per request against plain-tuned: direct {res['direct_cpu_ratio_vs_tuned']}x, "
        f"front {res['front_cpu_ratio_vs_tuned']}x (target <= 1.25)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
