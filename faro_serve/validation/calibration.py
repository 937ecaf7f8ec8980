"""What the simulator must assume about this machine, measured live before matched
validation's first policy (paper section 6.5): the per-request overhead outside the model
(HTTP, proxy, router), how long a replica stays idle between two queued requests (the
router's dispatch round trip), and how long a new replica takes to serve (cold start)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

import httpx
import numpy as np


def wait_until(cond, timeout_s: float, what: str, every_s: float = 0.5):
    """``cond()``'s first true value, polled every ``every_s``; TimeoutError naming ``what``."""
    end = time.time() + timeout_s
    while time.time() < end:
        v = cond()
        if v:
            return v
        time.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@dataclass
class Calibration:
    overhead_s: list[float]  # per request: end-to-end latency minus the replica's processing
    cold_start_s: float  # scale request -> the new replica serving
    hold_s: list[float] | None = None  # per queued request: gap between completions - processing

    @property
    def hold_median_s(self) -> float | None:
        return float(np.median(self.hold_s)) if self.hold_s else None

    def to_dict(self) -> dict:
        x = np.asarray(self.overhead_s)
        hold = (
            {
                "hold_ms": {
                    "n": len(self.hold_s),
                    "p50": round(self.hold_median_s * 1e3, 3),
                    "p90": round(float(np.percentile(self.hold_s, 90)) * 1e3, 3),
                }
            }
            if self.hold_s
            else {}
        )
        return hold | {
            "overhead_ms": {
                "n": int(x.size),
                "mean": round(float(x.mean()) * 1e3, 3),
                "p50": round(float(np.median(x)) * 1e3, 3),
                "p99": round(float(np.percentile(x, 99)) * 1e3, 3),
            },
            "cold_start_s": round(self.cold_start_s, 2),
        }


class Cluster(Protocol):
    """What calibration needs of a live cluster (``live_runs.LiveCluster`` is one)."""

    base: str  # the HTTP proxy's address

    def scale(self, name: str, replicas: int) -> None: ...
    def running(self) -> dict[str, int]: ...  # model -> running replicas


def calibrate(lc: Cluster, name: str, n: int = 200, burst: int = 30) -> Calibration:
    """Overhead from ``n`` sequential requests; the replica hold from a burst of ``burst``
    requests queued on one replica; cold start from one scale-up 1 -> 2."""
    overhead = []
    with httpx.Client(base_url=lc.base, timeout=30, trust_env=False) as c:
        for k in range(n + 10):
            t0 = time.perf_counter()
            r = c.post(f"/{name}/predict", content=b"")
            lat = time.perf_counter() - t0
            if r.status_code == 200 and k >= 10:  # the first ones warm the path up
                overhead.append(lat - r.json()["processing_ms"] / 1e3)
    hold = asyncio.run(burst_hold(lc.base, name, burst))
    t0 = time.time()
    lc.scale(name, 2)
    wait_until(lambda: lc.running().get(name) == 2, 120, f"{name} to scale to 2", every_s=0.1)
    cold = time.time() - t0
    lc.scale(name, 1)
    wait_until(lambda: lc.running().get(name) == 1, 120, f"{name} to scale back to 1", every_s=0.2)
    return Calibration(overhead, cold, hold)


async def burst_hold(base: str, name: str, burst: int) -> list[float]:
    """``burst`` requests at once on a single replica serve back to back, so the gap
    between two completions is the next request's processing plus the replica's idle
    hold; the client's return path cancels out in the difference."""
    done: list[tuple[float, float]] = []
    async with httpx.AsyncClient(base_url=base, timeout=120, trust_env=False) as c:

        async def one():
            r = await c.post(f"/{name}/predict", content=b"")
            if r.status_code == 200:
                done.append((time.perf_counter(), r.json()["processing_ms"] / 1e3))

        await asyncio.gather(*(one() for _ in range(burst)))
    done.sort()
    # the first completions may overlap the burst's own arrival; skip them
    return [t1 - t0 - p for (t0, _), (t1, p) in zip(done[2:], done[3:])]
