"""The router front of one model: the paper's "modified router" (section 5) on public Ray
Serve APIs.

Every request to ``POST <route_prefix>/predict`` passes through this FastAPI ingress, which

* counts the arrival and measures end-to-end latency and the replica's processing time
  (:class:`~faro_serve.serving.stats.RouterStats`);
* drops the fraction of requests the autoscaler set (HTTP 503, reason ``drop_rate``);
* keeps the model's FIFO queue (:class:`~faro_serve.serving.routing.DispatchGate`): a
  request goes to the model deployment only when a replica is free, and a request that
  finds ``queue_limit`` requests waiting gets 503 (reason ``queue_full``) at once instead
  of queueing without bound;
* retries a request once when its replica dies under it (inference is idempotent), and
  answers 503 (reason ``replica_failed``) if that fails too, never a bare 500;
* exports Prometheus metrics through ``ray.util.metrics``, published when the autoscaler
  reads the front (every tick) rather than per request, to keep the data path short.

The autoscaler reads :meth:`Front.metrics` and sets the drop rate with :meth:`Front.control`
over handles. One front replica per model keeps the counts and the queue whole.
"""


import asyncio
import base64
import binascii
import json
import random
import time

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from ray.util import metrics as ray_metrics

from .routing import DispatchGate, running_replicas
from .stats import RouterStats

api = FastAPI(title="faro-serve model endpoint",
              description="Inference behind Faro's router front: drop control, tail-drop and "
                          "metrics for the SLO-aware autoscaler.")


def _reject(status: int, model: str, reason: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": detail, "reason": reason, "model": model}, status_code=status)


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000)
@serve.ingress(api)
class Front:
    def __init__(self, model_handle, name: str, max_body_bytes: int = 8 << 20,
                 percentile: float = 99.0, queue_limit: int = 50):
        # gRPC data plane (what RAY_SERVE_THROUGHPUT_OPTIMIZED turns on cluster-wide), for
        # this handle only: the hop to the model costs ~1.7-2.3 ms instead of 3.1-3.2 ms
        # over an actor call, and triples the rate one front sustains (docs/serving.md)
        self.model = model_handle.options(_by_reference=False)
        self.name = name
        self.max_body_bytes = max_body_bytes
        self.percentile = percentile
        self.queue_limit = queue_limit
        self.stats = RouterStats(start=time.time())
        self.drop_rate = 0.0
        self.replicas = 1
        tags = ("model",)
        self._requests = ray_metrics.Counter("faro_requests", "requests by outcome",
                                             tag_keys=("model", "outcome"))
        self._latency = ray_metrics.Gauge("faro_latency_ms", "SLO-percentile end-to-end latency "
                                          "over the last 30 s (ms)", tag_keys=tags)
        self._queue = ray_metrics.Gauge("faro_queue_length", "requests waiting", tag_keys=tags)
        self._drop = ray_metrics.Gauge("faro_drop_rate", "drop rate in force", tag_keys=tags)
        self._published: dict[str, int] = {}
        app = serve.get_replica_context().app_name
        # before the router's first replica update, one request at a time
        self.gate = DispatchGate(lambda: running_replicas(app) or 1)
        self._ticker: asyncio.Task | None = None

    # -- data path -----------------------------------------------------------------------
    async def _payload(self, request: Request) -> bytes | JSONResponse:
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > self.max_body_bytes:
            return _reject(413, self.name, "too_large", f"body of {length} bytes exceeds the "
                           f"limit of {self.max_body_bytes} bytes")
        body = await request.body()
        if len(body) > self.max_body_bytes:
            return _reject(413, self.name, "too_large", f"body exceeds {self.max_body_bytes} bytes")
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                doc = json.loads(body or b"{}")
                data = doc.get("image", "") if isinstance(doc, dict) else None
                if not isinstance(data, str):
                    raise ValueError
                return base64.b64decode(data, validate=True)
            except (ValueError, binascii.Error, UnicodeDecodeError):
                return _reject(400, self.name, "bad_request",
                               'JSON bodies must be {"image": "<base64 of JPEG/PNG bytes>"}')
        return body

    @api.post("/predict", summary="Run the model on one request",
              description="Body: JPEG/PNG bytes, or JSON {\"image\": base64}. 503 when the "
                          "autoscaler drops the request or the queue is full.")
    async def predict(self, request: Request):
        t0 = time.time()
        self.stats.arrival(t0)
        if self.drop_rate > 0 and random.random() < self.drop_rate:
            self.stats.drop(t0, "drop_rate")
            return _reject(503, self.name, "drop_rate",
                           f"dropped by the autoscaler (drop rate {self.drop_rate:.3f})")
        payload = await self._payload(request)
        if isinstance(payload, JSONResponse):
            self.stats.drop(t0, "bad_request")
            return payload
        if self.gate.waiting >= self.queue_limit:
            self.stats.drop(t0, "queue_full")
            return _reject(503, self.name, "queue_full", "the model's queue is full; retry later")
        self.stats.started(time.time())
        try:
            result = await self._call(payload)
        except BackPressureError:  # Ray's own bound behind the gate (max_queued_requests)
            self.stats.drop(t0, "queue_full")
            return _reject(503, self.name, "queue_full", "the model's queue is full; retry later")
        except (RayActorError, grpc.aio.AioRpcError) as err:
            self.stats.drop(t0, "replica_failed")
            return _reject(503, self.name, "replica_failed",
                           f"the replica serving this request failed ({type(err).__name__}); retry")
        finally:
            self.stats.finished(time.time())
        now = time.time()
        proc = result.get("processing_ms") if isinstance(result, dict) else None
        self.stats.completed(now, now - t0, None if proc is None else proc / 1e3)
        if isinstance(result, dict) and "error" in result:
            return _reject(int(result.get("status", 400)), self.name, "bad_request", result["error"])
        return result

    async def _call(self, payload: bytes):
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._wake_on_scale_up())
        await self.gate.acquire()
        try:
            return await self._send(payload)
        finally:
            self.gate.release()

    async def _wake_on_scale_up(self):
        """A new replica shows up in the router, not in a release: look 10 times a second."""
        while True:
            await asyncio.sleep(0.1)
            self.gate.wake()

    async def _send(self, payload: bytes):
        try:
            return await self.model.predict.remote(payload)
        except RayActorError:  # the replica died (killed, node lost): once more elsewhere
            return await self.model.predict.remote(payload)

    @api.get("/metrics", summary="What the router front measured (JSON)")
    def metrics_json(self):
        return self.metrics(reset_mean=False)  # a person looking must not reset the average

    # -- control path (autoscaler, over handles) ------------------------------------------
    def metrics(self, reset_mean: bool = True) -> dict:
        """The autoscaler's read, once per tick: the in-flight average restarts with it."""
        snap = self.stats.snapshot(time.time(), self.percentile, self.replicas, reset_mean)
        snap.update(model=self.name, drop_rate=self.drop_rate, replicas=self.replicas,
                    percentile=self.percentile, waiting=self.gate.waiting,
                    dispatched=self.gate.in_flight, dispatch_capacity=self.gate.capacity())
        self._publish(snap)
        return snap

    def _publish(self, snap: dict) -> None:
        """Prometheus: request counters as deltas since the last read, plus gauges."""
        tags = {"model": self.name}
        counts = {"arrival": snap["arrivals_total"], "completed": snap["completed_total"],
                  **{f"dropped_{k}": v for k, v in snap["dropped"].items()}}
        for outcome, total in counts.items():
            delta = total - self._published.get(outcome, 0)
            if delta > 0:
                self._requests.inc(delta, tags={**tags, "outcome": outcome})
            self._published[outcome] = total
        self._queue.set(snap["queue_length"], tags=tags)
        if snap["latency_ms"] is not None:
            self._latency.set(snap["latency_ms"], tags=tags)

    def control(self, drop_rate: float | None = None, replicas: int | None = None,
                percentile: float | None = None, reset_stats: bool = False) -> dict:
        """Set what the autoscaler decided; ``reset_stats`` starts the measurements afresh
        (minute bins from now), as matched validation does to align them with a replay."""
        if reset_stats:
            self.stats = RouterStats(start=time.time())
            self._published = {}
        if drop_rate is not None:
            self.drop_rate = min(max(float(drop_rate), 0.0), 1.0)
            self._drop.set(self.drop_rate, tags={"model": self.name})
        if replicas is not None:
            self.replicas = max(0, int(replicas))
        if percentile is not None:
            self.percentile = float(percentile)
        return {"drop_rate": self.drop_rate, "replicas": self.replicas}
