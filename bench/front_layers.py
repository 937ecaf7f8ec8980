"""Where the router front's latency goes (paper section 5): the 0-ms synthetic model behind
ingresses that each add one layer of the front, in one run.

Usage: ``python -m bench.front_layers [--requests 300] [--rounds 3]``

* ``plain``: the model as a plain Serve HTTP deployment (proxy -> model);
* ``ingress``: the front's kind of replica (FastAPI, its actor options) reading the body and
  answering itself: what an ingress costs without a second hop;
* ``ingress+hop``: the same, calling the model deployment once (gRPC handle, as the front);
* ``front``: faro-serve's front (gate, drops, statistics) in front of the same model.

Sequential requests, paths interleaved; prints each path's median minus plain's per round.
Starts its own local Ray on free loopback ports and shuts it down at the end.
"""

import argparse
import asyncio
import json
import statistics
from pathlib import Path

import ray
from fastapi import FastAPI, Request
from ray import serve

from bench.router_bench import PlainSynthetic, _latency, _port
from faro_serve.serving.app import FRONT_ACTOR, model_app, model_deployment

_bare = FastAPI()


@serve.deployment(ray_actor_options=FRONT_ACTOR)
@serve.ingress(_bare)
class BareIngress:
    """An ingress that answers without calling anything."""

    @_bare.post("/predict")
    async def predict(self, request: Request):
        await request.body()
        return {"result": "ok"}


_hop = FastAPI()


@serve.deployment(ray_actor_options=FRONT_ACTOR)
@serve.ingress(_hop)
class HopIngress:
    """An ingress that makes the front's one call to the model, and nothing else."""

    def __init__(self, model):
        self.model = model.options(_by_reference=False)

    @_hop.post("/predict")
    async def predict(self, request: Request):
        return await self.model.predict.remote(await request.body())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300, help="sequential requests per path and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args(argv)
    port = _port()
    model = {"name": "m", "model": {"kind": "synthetic", "processing": "const:0"}, "cpus": 0.25,
             "queue_limit": 1000}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rounds = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        plain = serve.deployment(PlainSynthetic, name="Plain", max_ongoing_requests=1,
                                 ray_actor_options={"num_cpus": 0.25})
        serve.run(plain.bind(processing="const:0"), name="plain", route_prefix="/plain")
        serve.run(BareIngress.bind(), name="ingress", route_prefix="/ingress")
        serve.run(HopIngress.bind(model_deployment(model)), name="hop", route_prefix="/hop")
        serve.run(model_app(model), name="front", route_prefix="/front")
        paths = {"plain": "/plain", "ingress": "/ingress/predict", "ingress+hop": "/hop/predict",
                 "front": "/front/predict"}
        for _ in range(args.rounds):
            lat = asyncio.run(_latency(f"http://127.0.0.1:{port}", list(paths.values()), args.requests))
            med = {name: statistics.median(lat[p]) for name, p in paths.items()}
            rounds.append({"plain_p50_ms": round(med["plain"], 3),
                           **{f"{k}_over_plain_ms": round(v - med["plain"], 3)
                              for k, v in med.items() if k != "plain"}})
    finally:
        serve.shutdown()
        ray.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "front_layers.json").write_text(json.dumps({"requests": args.requests, "rounds": rounds}, indent=2))
    print("p50 over plain (ms), per round: | round | plain p50 | ingress | ingress+hop | front |")
    for i, r in enumerate(rounds, 1):
        print(f"| {i} | {r['plain_p50_ms']} | {r['ingress_over_plain_ms']} | "
              f"{r['ingress+hop_over_plain_ms']} | {r['front_over_plain_ms']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
