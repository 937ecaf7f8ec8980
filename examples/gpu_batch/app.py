"""A GPU-like image model written as Ray Serve users batch on GPUs: ``__call__`` awaits
``self.infer(body)``, ``infer`` is ``@serve.batch`` and runs the whole list. Nothing here
knows of faro-serve; ``config.yaml`` beside it puts it under Faro, and the same class runs
on plain Ray Serve (``bench/gpu_live.py`` runs both).

It computes nothing: a batch of ``b`` sleeps ``scale x l(b)``, ``l`` the forward pass of
ResNet50 measured on an NVIDIA H200 (fp32: 3.3 ms alone, 4.3 ms for 16, 9.5 ms for 64;
``profiles/h200-resnet50.json``), so a replica on this CPU machine serves batches the way a
GPU replica does, nearly flat in the batch, at a speed Serve's HTTP proxy here can feed:
with ``scale`` 40, 133 ms alone, 170 ms for 16 (94 requests/s), 380 ms for 64. Each answer
says the batch it was served in.

    curl -X POST http://127.0.0.1:8000/gpu --data-binary @cat.jpg
    {"result": "ok", "batch": 1, "bytes": 2048}
"""

from __future__ import annotations

import asyncio
import random

from ray import serve
from starlette.requests import Request

# the H200's ResNet50 fp32 forward pass, ms per batch (profiles/h200-resnet50.json, medians
# made non-decreasing: faro_serve.batch_curve.BatchCurve.from_points)
H200_RESNET50_MS = {1: 3.332, 2: 4.07, 4: 4.07, 8: 4.09, 16: 4.26, 32: 5.303, 64: 9.508, 128: 17.72}


def batch_ms(b: int, points: dict[int, float] = H200_RESNET50_MS) -> float:
    """``l(b)`` in ms: the points joined linearly, the last segment extended."""
    bs = sorted(points)
    for lo, hi in zip(bs, bs[1:]):
        if b <= hi:
            return points[lo] + (points[hi] - points[lo]) * (b - lo) / (hi - lo) if b > lo else points[lo]
    lo, hi = bs[-2], bs[-1]
    return points[hi] + (points[hi] - points[lo]) * (b - hi) / (hi - lo)


@serve.deployment
class GpuLikeClassifier:
    def __init__(
        self, scale: float = 40.0, jitter: float = 0.05, seed: int | None = None, batch_wait_s: float | None = None
    ):
        self.scale, self.jitter = float(scale), float(jitter)
        self.rng = random.Random(seed)
        if batch_wait_s is not None:  # Ray's documented way to set it from a config
            self.infer.set_batch_wait_timeout_s(batch_wait_s)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.004)
    async def infer(self, bodies: list[bytes]) -> list[dict]:
        b = len(bodies)
        await asyncio.sleep(self.scale * batch_ms(b) / 1e3 * self.rng.lognormvariate(0.0, self.jitter))
        return [{"result": "ok", "batch": b, "bytes": len(x)} for x in bodies]

    async def __call__(self, request: Request) -> dict:
        return await self.infer(await request.body())
