"""The router front of one model: the paper's "modified router" (section 5) on public Ray
Serve APIs.

Every request to ``POST <route_prefix>/predict`` passes through this FastAPI ingress, which

* counts the arrival and measures end-to-end latency and the replica's processing time
  (:class:`~faro_serve.serving.stats.MeterStats`);
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
import random
import time

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from ..measures import REPLICA_POLL_S
from .control import MeterControl
from .payload import answer, drop_rate_refusal, read_payload, refusal_reason, reject, shutting_down
from .routing import DispatchGate, running_replicas

api = FastAPI(
    title="faro-serve model endpoint",
    description="Inference behind Faro's router front: drop control, tail-drop and "
    "metrics for the SLO-aware autoscaler.",
)


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=100_000)
@serve.ingress(api)
class Front(MeterControl):
    def __init__(
        self,
        model_handle,
        name: str,
        max_body_bytes: int = 8 << 20,
        percentile: float = 99.0,
        queue_limit: int = 50,
        replica_cpus: float | None = None,
        body_timeout_s: float | None = 5.0,
    ):
        # gRPC data plane (what RAY_SERVE_THROUGHPUT_OPTIMIZED turns on cluster-wide), for
        # this handle only: the hop to the model costs ~1.7-2.3 ms instead of 3.1-3.2 ms
        # over an actor call, and triples the rate one front sustains (docs/serving.md)
        self.model = model_handle.options(_by_reference=False)
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.queue_limit = queue_limit
        self._init_control(name, percentile, replica_cpus)
        app = serve.get_replica_context().app_name
        # before the router's first replica update, one request at a time
        self.gate = DispatchGate(lambda: running_replicas(app) or 1)
        self._ticker: asyncio.Task | None = None
        self.busy = 0  # requests admitted and not answered yet (a drain waits for them)
        self.retried = 0  # requests sent again because their replica died (never twice)

    # -- data path -----------------------------------------------------------------------
    @api.post(
        "/predict",
        summary="Run the model on one request",
        description='Body: JPEG/PNG bytes, or JSON {"image": base64}. 503 when the '
        "autoscaler drops the request or the queue is full.",
    )
    async def predict(self, request: Request):
        t0 = time.time()
        self.stats.arrival(t0)
        if self.draining_since is not None:  # a shutdown drains this model (drain.py)
            self.stats.drop(t0, "shutting_down")
            return shutting_down(self.name)
        self.busy += 1
        try:
            return await self._admitted(request, t0)
        finally:
            self.busy -= 1

    async def _admitted(self, request: Request, t0: float):
        if self.drop_rate > 0 and random.random() < self.drop_rate:
            self.stats.drop(t0, "drop_rate")
            return drop_rate_refusal(self.name, self.drop_rate)
        payload = await read_payload(request, self.name, self.max_body_bytes, self.body_timeout_s)
        if isinstance(payload, JSONResponse):
            self.stats.drop(t0, refusal_reason(payload))
            return payload
        if self.gate.waiting >= self.queue_limit:
            self.stats.drop(t0, "queue_full")
            return reject(503, self.name, "queue_full", "the model's queue is full; retry later")
        self.stats.started(time.time())
        try:
            result = await self._call(payload)
        except BackPressureError:  # Ray's own bound behind the gate (max_queued_requests)
            self.stats.drop(t0, "queue_full")
            return reject(503, self.name, "queue_full", "the model's queue is full; retry later")
        except (RayActorError, grpc.aio.AioRpcError) as err:
            self.stats.drop(t0, "replica_failed")
            return reject(
                503,
                self.name,
                "replica_failed",
                f"the replica serving this request failed ({type(err).__name__}); retry",
            )
        finally:
            self.stats.finished(time.time())
        now = time.time()
        proc = result.get("processing_ms") if isinstance(result, dict) else None
        self.stats.completed(now, now - t0, None if proc is None else proc / 1e3)
        return answer(result, self.name)  # the model's own refusal, with its status and reason

    async def _call(self, payload: bytes):
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._wake_on_scale_up())
        await self.gate.acquire()
        try:
            return await self._send(payload)
        finally:
            self.gate.release()

    async def _wake_on_scale_up(self):
        """A new replica shows up in the router, not in a release: look every
        :data:`~faro_serve.measures.REPLICA_POLL_S`."""
        while True:
            await asyncio.sleep(REPLICA_POLL_S)
            self.gate.wake()

    async def _send(self, payload: bytes):
        try:
            return await self.model.predict.remote(payload)
        except RayActorError:  # the replica died (killed, node lost): once more elsewhere
            self.retried += 1  # counted (MeterReport.retried, faro_requests{outcome="retried"})
            return await self.model.predict.remote(payload)

    @api.get("/metrics", summary="What the router front measured (JSON)")
    def metrics_json(self):
        return self.metrics(reset_mean=False)  # a person looking must not reset the average

    # -- control path (autoscaler, over handles): MeterControl ---------------------------
    def drain_state(self) -> dict:
        """One front replica holds the model's whole queue: it is told at once."""
        return {
            "model": self.name,
            "draining": self.draining_since is not None,
            "replicas": 1,
            "told": int(self.draining_since is not None),
            "busy": self.busy,
            "queued": 0,
        }

    def _queue_state(self) -> dict:
        return {
            "waiting": self.gate.waiting,
            "dispatched": self.gate.in_flight,
            "dispatch_capacity": self.gate.capacity(),
            "retried": self.retried,
        }
