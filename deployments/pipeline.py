"""A synthetic pipeline on Ray Serve (issue 35): stages that sleep a drawn processing time
and an ingress that walks a pipeline's DAG through handles, as a user's composed
application does. For measuring faro-serve on pipelines (``bench/pipeline_live.py``) the way
``synthetic.py`` serves single models: sleeping, so many replicas fit on 2 cores while each
stage queues as a model serving one request at a time.

The ingress takes the pipeline's shape as plain data (``stages``: name, after, fraction) and
a handle per stage; a query visits a stage with probability fraction / its parents' (the
simulator's rule, so the two see the same visits in distribution); stages after the same
parent run side by side (a fan-out); the query is answered when every stage it visits is
done.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

from faro_serve.distributions import parse_dist


@serve.deployment
class SleepStage:
    """One stage: a drawn processing time per request, one request at a time."""

    def __init__(self, processing: str, seed: int | None = None):
        self.dist = parse_dist(processing)
        self.rng = np.random.default_rng(seed)
        self._one = asyncio.Lock()

    async def run(self, payload: dict | None = None) -> dict:
        async with self._one:
            t0 = time.perf_counter()
            await asyncio.sleep(float(self.dist.sample(self.rng, 1)[0]))
            return {"processing_ms": (time.perf_counter() - t0) * 1e3}

    async def __call__(self, request: Request) -> dict:
        """Over HTTP: the same work (a single model of the same kind)."""
        await request.body()
        return await self.run()


@serve.deployment(ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=200)
class PipelineIngress:
    """Walks ``stages`` (topological order; each ``{"name", "after", "fraction"}``) over the
    stage handles given by keyword, one query per HTTP request."""

    def __init__(self, stages: list[dict], seed: int = 0, **handles):
        self.stages = stages
        self.handles = handles
        self.rng = np.random.default_rng(seed)
        missing = [s["name"] for s in stages if s["name"] not in handles]
        if missing:
            raise ValueError(f"no handle for stage(s) {', '.join(missing)}")

    def visits(self) -> set[str]:
        """The stages one query visits: each with probability fraction / parents' fraction,
        given a parent visited (an entry stage: its fraction)."""
        frac = {s["name"]: s.get("fraction", 1.0) for s in self.stages}
        out: set[str] = set()
        for s in self.stages:
            parents = s.get("after", [])
            if parents and not any(p in out for p in parents):
                continue
            base = max((frac[p] for p in parents), default=1.0)
            if self.rng.random() < frac[s["name"]] / base:
                out.add(s["name"])
        return out

    async def __call__(self, request: Request):
        await request.body()
        visit = self.visits()
        done: dict[str, asyncio.Task] = {}

        async def stage(name: str, after: list[str]) -> None:
            await asyncio.gather(*(done[p] for p in after if p in done))
            await self.handles[name].run.remote()

        try:
            for s in self.stages:  # parents first: each task waits for its parents' tasks
                if s["name"] in visit:
                    done[s["name"]] = asyncio.ensure_future(stage(s["name"], s.get("after", [])))
            await asyncio.gather(*done.values())
        except Exception as err:  # a stage refused it (Faro dropped it, or its queue was full)
            for t in done.values():
                t.cancel()
            return JSONResponse({"error": type(err).__name__}, status_code=503)
        return {"stages": sorted(visit)}
