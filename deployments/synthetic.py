"""A synthetic model whose per-request time follows a configurable distribution.

It sleeps instead of computing, so tens of replicas fit on a 2-core machine while queueing
behaves as with a real model serving one request at a time. The default is the paper's
measured ResNet34 processing time (lognormal, mean about 154 ms).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from faro_serve.distributions import PAPER_PROCESSING, parse_dist


class SyntheticModel:
    def __init__(self, processing: str = str(PAPER_PROCESSING), seed: int | None = None, batch_share: float = 1.0):
        self.dist = parse_dist(processing)
        self.rng = np.random.default_rng(seed)
        if not 0 < batch_share <= 1:
            raise ValueError(f"batch_share must be in (0, 1] (got {batch_share:g})")
        self.batch_share = batch_share
        self._one_at_a_time = asyncio.Lock()  # the front may hand over the next request early

    async def predict_batch(self, payloads: list[bytes]) -> list[dict]:
        """A batch of ``b`` served together: one drawn processing time x ``share b + 1 -
        share`` (the simulator's batched service, faro_serve/sim/kernels.py)."""
        async with self._one_at_a_time:
            t0 = time.perf_counter()
            b = len(payloads)
            p = float(self.dist.sample(self.rng, 1)[0])
            await asyncio.sleep(p * (self.batch_share * b + 1.0 - self.batch_share))
            done = {"result": "ok", "processing_ms": (time.perf_counter() - t0) * 1e3, "batch": b}
            return [dict(done) for _ in payloads]

    async def predict(self, payload: bytes = b"") -> dict:
        """``waited_ms``: time spent behind another request on this replica (0 when the
        router sent it to a free replica)."""
        arrived = time.perf_counter()
        async with self._one_at_a_time:
            t0 = time.perf_counter()
            await asyncio.sleep(float(self.dist.sample(self.rng, 1)[0]))
            return {
                "result": "ok",
                "processing_ms": (time.perf_counter() - t0) * 1e3,
                "waited_ms": (t0 - arrived) * 1e3,
            }
