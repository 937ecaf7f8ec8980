"""Two plain Ray Serve deployments with no faro-serve code in them, as a platform engineer
runs them today (issue 48): ``auto`` under Ray's own autoscaling, ``fixed`` at a fixed
replica count in an application that lets an external scaler set it. Each sleeps 50 ms."""

import time

from ray import serve
from starlette.requests import Request


class _Sleeper:
    async def __call__(self, request: Request) -> dict:
        await request.body()
        time.sleep(0.05)
        return {"ok": True}


Auto = serve.deployment(
    _Sleeper,
    name="Auto",
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=5,
    autoscaling_config={
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 2,
        "upscale_delay_s": 5,
        "downscale_delay_s": 60,
        "metrics_interval_s": 2,
        "look_back_period_s": 10,
    },
)
Fixed = serve.deployment(
    _Sleeper, name="Fixed", num_replicas=1, ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=5
)
auto = Auto.bind()
fixed = Fixed.bind()
