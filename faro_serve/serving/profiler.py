"""What ``faro-serve profile`` deploys (issues 20 and 47), on a local Ray Serve:

* ``--arch``: faro-serve's own ResNet, a replica that times its own forward passes over a
  grid of batch sizes and thread counts (Sponge's latency model). It reserves as many Ray
  CPUs as the largest thread count, and the GPUs asked for: on a GPU it runs there
  (``deployments.vision``), so the profile is of the device it will serve on.
* ``--deployment``: a user's deployment by import path, with a ``@serve.batch`` method. It
  is deployed under Faro exactly as it will serve (``faro_serve.scaled``: its CPUs and GPUs,
  Ray's batch queue fed through Faro's gate), the batch size in force set to each size in
  turn through the meter, as the autoscaler sets it; each round sends that many requests at
  once, so the gate lets them through as one batch, and Faro's timer around the user's
  batched function (``batch_method.py``) reports its time to the meter, whose per-size
  medians are the profile.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from ray import serve

from deployments.vision import ImageClassifier

from ..model_slo import Batching
from .names import meter_name
from .user import ScaledDeployment


@serve.deployment(num_replicas=1, max_ongoing_requests=1)
class Profiler:
    def __init__(self, arch: str, checkpoint: str | None = None):
        self.model = ImageClassifier(arch, checkpoint=checkpoint, threads=1)

    def profile(self, batches: list[int], threads: list[int], repeats: int, image_size: int) -> list[dict]:
        return self.model.profile(batches, threads, repeats, image_size)


def profile_app(arch: str, max_threads: int, checkpoint: str | None = None, gpus: float = 0.0):
    return Profiler.options(ray_actor_options={"num_cpus": max_threads, "num_gpus": gpus}).bind(arch, checkpoint)


def deploy_for_profile(dep, name: str, init_kwargs: dict, cpus: float, gpus: float, largest: int) -> str:
    """``dep`` under Faro on the running Serve, one replica, its batches up to ``largest``
    and a gate that waits for a full batch (a round's requests arrive together); its route."""
    scaled = ScaledDeployment(
        dep, name, cpus=cpus, gpus=gpus, initial_replicas=1, batching=Batching(max_batch_size=largest, batch_wait_s=1.0)
    )
    if not scaled.batch_methods:
        raise ValueError(
            f"{dep.name} has no @serve.batch method (an async def that takes a "
            "list): profile --deployment times a batching deployment's batches"
        )
    serve.run(scaled.bind(**init_kwargs), name=name, route_prefix=f"/{name}", external_scaler_enabled=True)
    return f"/{name}"


def meter_of(name: str, deployment: str):
    return serve.get_deployment_handle(meter_name(deployment), app_name=name)


def time_batches(
    base_url: str,
    path: str,
    name: str,
    deployment: str,
    batches: list[int],
    repeats: int,
    body: bytes,
    headers: dict,
    log=print,
) -> list[dict]:
    """Every batch size in turn: set it in force, wait until the replica runs it, send
    ``repeats + 1`` rounds of that many requests at once (the first warms up); then the
    meter's per-size medians of the batch times (rows of batch, latency_s, batches)."""
    meter = meter_of(name, deployment)
    for b in batches:
        meter.control.remote(batch_size=b).result(timeout_s=30)
        until = time.time() + 30
        while meter.metrics.remote(reset_mean=False).result(timeout_s=30).get("batch_size") != b:
            if time.time() > until:
                raise RuntimeError(f"the replica did not take batch size {b} within 30 s")
            time.sleep(0.2)
        codes = asyncio.run(_rounds(base_url + path, b, repeats + 1, body, headers))
        bad = [c for c in codes if c != 200]
        if bad:
            raise RuntimeError(
                f"batch {b}: {len(bad)} of {len(codes)} requests answered "
                f"{sorted(set(bad))} (the body must be one your route accepts)"
            )
        log(f"  batch {b}: {repeats + 1} rounds")
    time.sleep(1.5)  # the replica's last report
    rows = meter.metrics.remote(reset_mean=False).result(timeout_s=30).get("batch_times") or []
    return [{"batch": int(b), "latency_s": float(t), "batches": float(n)} for b, n, t in rows if int(b) in batches]


async def _rounds(url: str, b: int, rounds: int, body: bytes, headers: dict) -> list[int]:
    codes = []
    async with httpx.AsyncClient(timeout=120, trust_env=False) as c:
        for _ in range(rounds):
            rs = await asyncio.gather(*(c.post(url, content=body, headers=headers) for _ in range(b)))
            codes += [r.status_code for r in rs]
    return codes
