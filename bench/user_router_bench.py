"""What Faro costs a user's own deployment (issue 34): the same user deployment, a JSON
model and a streaming one (0 ms of work), served by plain Ray Serve and under Faro
(``faro_serve.scaled``: guard, Faro's router, meter), one replica each, in one run.

Usage: ``python -m bench.user_router_bench [--requests 400] [--seconds 10] [--concurrency 16]``

Latency: sequential requests, the paths interleaved, p50 and p99. Throughput and cost: a
closed loop of ``--concurrency`` for ``--seconds``; Ray CPU-seconds (every Ray process, from
/proc) per 1,000 completed requests (``bench.router_bench``'s method). Plain Ray Serve runs
at its defaults (``max_ongoing_requests`` 5) and again at Faro's bound of 2 (``plain2``);
under Faro a replica holds 2 (concurrency 1).
Starts its own local Ray on a free loopback port and shuts it down at the end.
"""

from pathlib import Path

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

import faro_serve
from bench.router_bench import measure, result_head, save_and_show, start


class JsonModel:
    async def __call__(self, request: Request):
        body = await request.body()
        return JSONResponse({"label": "pos", "bytes": len(body)})


class StreamModel:
    async def __call__(self, request: Request):
        await request.body()

        async def chunks():
            for i in range(3):
                yield f"chunk-{i};"

        return StreamingResponse(chunks(), media_type="text/plain")


def main(argv=None) -> int:
    args, port = start(__doc__, argv)
    paths = {}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for kind, cls in (("json", JsonModel), ("stream", StreamModel)):
            dep = serve.deployment(cls, name=cls.__name__, ray_actor_options={"num_cpus": 0.25})
            serve.run(dep.bind(), name=f"plain-{kind}", route_prefix=f"/plain-{kind}")
            slo = faro_serve.SLO(name=f"faro-{kind}", slo_ms=1000, cpus=0.25)
            serve.run(
                faro_serve.scaled(dep, slo, queue_limit=1000).bind(), name=f"faro-{kind}", route_prefix=f"/faro-{kind}"
            )
            # plain again, at Faro's bound per replica (2 ongoing): the routers compared alike
            serve.run(
                dep.options(name=f"{cls.__name__}2", max_ongoing_requests=2).bind(),
                name=f"plain2-{kind}",
                route_prefix=f"/plain2-{kind}",
            )
            paths |= {
                f"plain-{kind}": f"/plain-{kind}",
                f"plain2-{kind}": f"/plain2-{kind}",
                f"faro-{kind}": f"/faro-{kind}",
            }
        rows = measure(f"http://127.0.0.1:{port}", paths, args.requests, args.seconds, args.concurrency)
    finally:
        serve.shutdown()
        ray.shutdown()
    res = result_head(args, rows)
    for kind in ("json", "stream"):
        for base in ("plain", "plain2"):
            f, p = rows[f"faro-{kind}"], rows[f"{base}-{kind}"]
            res[f"{kind}_vs_{base}"] = {
                "p50_overhead_ms": round(f["p50_ms"] - p["p50_ms"], 3),
                "p99_overhead_ms": round(f["p99_ms"] - p["p99_ms"], 3),
                "throughput_ratio": round(f["throughput_rps"] / p["throughput_rps"], 3),
                "cpu_ratio": round(f["cpu_s_per_1000"] / p["cpu_s_per_1000"], 3),
            }
    save_and_show(
        res,
        Path(args.out) / "user_router.json",
        f"a user's deployment, plain Ray Serve vs under Faro, 0-ms models ({res['env']})",
    )
    for kind in ("json", "stream"):
        for base in ("plain", "plain2"):
            r = res[f"{kind}_vs_{base}"]
            print(
                f"{kind} against {base}: p50 overhead {r['p50_overhead_ms']} ms (target <= 1), "
                f"p99 overhead {r['p99_overhead_ms']} ms, throughput ratio "
                f"{r['throughput_ratio']}, CPU per request {r['cpu_ratio']}x (target <= 1.25)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
