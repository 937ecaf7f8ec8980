"""The plain Ray Serve application ``bench/whatif_live.py`` serves: two deployments under
Ray's own autoscaling, no faro-serve code (what a platform engineer runs before faro-serve).
Each request sleeps 50 ms; each deployment is its own application (``a`` at ``/a``, ``b``
at ``/b``), so the proxy's latency histogram, labelled by application, is each one's."""

import time

from ray import serve
from starlette.requests import Request

RAY_AUTOSCALING = {
    "min_replicas": 1,
    "max_replicas": 5,
    "target_ongoing_requests": 2,
    "upscale_delay_s": 30,
    "downscale_delay_s": 120,
    "metrics_interval_s": 2,
    "look_back_period_s": 10,
}


@serve.deployment(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=5, autoscaling_config=RAY_AUTOSCALING)
class A:
    async def __call__(self, request: Request) -> dict:
        await request.body()
        time.sleep(0.05)
        return {"ok": True}


@serve.deployment(
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=5,
    autoscaling_config={**RAY_AUTOSCALING, "upscale_delay_s": 10},
)
class B:
    async def __call__(self, request: Request) -> dict:
        await request.body()
        time.sleep(0.05)
        return {"ok": True}


a = A.bind()  # application "a", route /a
b = B.bind()  # application "b", route /b
