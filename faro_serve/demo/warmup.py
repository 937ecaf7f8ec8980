"""The demo fits the machine it runs on (issue 19): a short measured warm-up, then the
rate scale at which the slice's busiest minutes are servable here.

The bundled slice's load was sized on one 2-core VM; on another of the same size the
ResNets' processing times tripled and every model missed its SLO, so the demo measured the
machine, not the policy. Before the replay every model gets a closed loop of one request
in flight for a few seconds, all models at once (so the CPU-bound ResNets contend as they
will in the replay), and reports its processing time and the CPU time a request used.
:func:`size_rate` then takes the largest rate scale, at most the default, at which

* every model's busiest-minute rate is met by the replicas the M/D/c estimate asks for
  (paper section 4.2) within its ``max_replicas``, and all of them fit the capacity;
* the CPU-bound work of those minutes, sum of rate x CPU per request, stays within
  :data:`CPU_SHARE` of the machine's cores (the rest goes to Ray Serve's proxy, Ray and
  the load generator on the same cores).

A slower machine gets a lighter demo, not a failing one; the report says what was chosen
and why.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import numpy as np

from ..engine.latency import min_replicas_for_slo

CPU_SHARE = 0.5  # of the cores, for model compute at the busiest minutes
WARMUP_S = 8.0


@dataclass
class ModelFit:
    name: str
    slo_ms: float
    percentile: float
    cpus: float
    max_replicas: int
    processing_ms: float  # measured under the warm-up's mix
    cpu_ms: float  # CPU per request (0 for a model that sleeps)
    peak_rps: float  # busiest minute at rate scale 1


def _need(m: ModelFit, scale: float) -> int | None:
    lam = m.peak_rps * scale
    if lam <= 0:
        return 1
    try:
        return min_replicas_for_slo(
            lam, m.processing_ms / 1e3, m.slo_ms / 1e3, m.percentile / 100, limit=m.max_replicas
        )[0]
    except ValueError:
        return None  # not even max_replicas meet the SLO at this rate


def check(models: list[ModelFit], scale: float, capacity_cpus: float, cores: int) -> list[str]:
    """What stops ``scale`` from being servable here (empty: nothing)."""
    why, cpus = [], 0.0
    for m in models:
        n = _need(m, scale)
        if n is None:
            why.append(f"{m.name} would need more than its {m.max_replicas} replicas")
        else:
            cpus += n * m.cpus
    if cpus > capacity_cpus + 1e-9:
        why.append(f"the replicas needed take {cpus:g} of {capacity_cpus:g} CPUs")
    compute = sum(m.peak_rps * scale * m.cpu_ms / 1e3 for m in models)
    if compute > CPU_SHARE * cores:
        why.append(
            f"the models' compute needs {compute:.2f} cores of the {CPU_SHARE * cores:g} "
            f"left to them ({CPU_SHARE:g} x {cores} cores)"
        )
    return why


def size_rate(
    models: list[ModelFit], base_scale: float, capacity_cpus: float, cores: int | None = None
) -> tuple[float, str]:
    """(rate scale, why): ``base_scale`` when it is servable, else the largest servable one
    below it (bisection to 1 %), never below 5 % of it."""
    cores = cores or os.cpu_count() or 1
    blocked = check(models, base_scale, capacity_cpus, cores)
    if not blocked:
        return base_scale, f"the default rate scale {base_scale:g} fits this machine"
    lo, hi = 0.05 * base_scale, base_scale
    if check(models, lo, capacity_cpus, cores):
        return lo, (
            f"even {lo:.3g} does not fit ({'; '.join(check(models, lo, capacity_cpus, cores))}); "
            f"the demo runs at that lightest load"
        )
    while hi - lo > 0.01 * base_scale:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if not check(models, mid, capacity_cpus, cores) else (lo, mid)
    return round(lo, 4), (
        f"at the default {base_scale:g}: {'; '.join(blocked)}; so {lo:.3g}, the largest rate scale at which it fits"
    )


async def measure(url: str, names: list[str], body: bytes, seconds: float = WARMUP_S) -> dict:
    """Per model: median processing and CPU ms of its answers under a closed loop of one
    request in flight for each model at once, and how many answered."""
    import httpx

    got: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    end = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=30.0, trust_env=False) as c:

        async def loop(n: str):
            while time.monotonic() < end:
                try:
                    r = await c.post(f"/{n}/predict", content=body)
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    d = r.json()
                    got[n].append((float(d.get("processing_ms", np.nan)), float(d.get("cpu_ms", 0.0))))

        await asyncio.gather(*(loop(n) for n in names))
    out = {}
    for n, v in got.items():
        a = np.array(v) if v else np.full((1, 2), np.nan)
        out[n] = {"processing_ms": float(np.nanmedian(a[:, 0])), "cpu_ms": float(np.nanmedian(a[:, 1])), "n": len(v)}
    return out
