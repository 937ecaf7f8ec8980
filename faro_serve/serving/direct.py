"""The direct data path of one model: the front's work without its hop (paper section 5).

With ``data_path: direct`` a model's application has

* :class:`DirectModel` as the HTTP ingress: each replica checks the body (413/400), drops
  the autoscaler's fraction of requests (503, reason ``drop_rate``) and runs the model;
* :class:`~faro_serve.serving.proxy_queue.ProxyQueueRouter` as its request router, in Ray
  Serve's proxy: the FIFO queue, one request per replica, arrival and latency measurement;
  Ray's ``max_queued_requests`` answers 503 past the queue limit (tail-drop);
* :class:`Meter`, deployed under the front's name, off the data path: it merges what the
  router and the replicas report and offers the autoscaler the front's control plane.

What changes against the router front (docs/serving.md): a drop is decided when the request
leaves the queue, not on arrival; the tail-drop 503 is Ray's, with Ray's text body, and the
requests it refuses are not counted as arrivals; a replica that dies under a request gives
Ray's 500 instead of a retry.
"""

import asyncio
import logging
import random
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from .control import FrontControl
from .payload import drop_rate_refusal, read_payload, refusal_reason, run_model
from .proxy_queue import MAX_EVENTS, REPORT_S

log = logging.getLogger("faro_serve.serving")

api = FastAPI(title="faro-serve model endpoint (direct path)",
              description="Inference with Faro's drop control, tail-drop and metrics, served "
                          "by the model replicas themselves.")


@serve.ingress(api)
class DirectModel:
    def __init__(self, meter, name: str, model_cls: type, model_kwargs: dict,
                 max_body_bytes: int = 8 << 20):
        self.meter = meter
        self.name = name
        self.model = model_cls(**model_kwargs)
        self.max_body_bytes = max_body_bytes
        self.drop_rate = 0.0
        self.events: list[tuple] = []  # ("p", t, processing s) and ("d", t, reason)
        self._reporter: asyncio.Task | None = None

    @api.post("/predict", summary="Run the model on one request",
              description="Body: JPEG/PNG bytes, or JSON {\"image\": base64}. 503 when the "
                          "autoscaler drops the request or the queue is full.")
    async def predict(self, request: Request):
        if self._reporter is None:
            self._reporter = asyncio.get_running_loop().create_task(self._report_loop())
        if self.drop_rate > 0 and random.random() < self.drop_rate:
            self._event(("d", time.time(), "drop_rate"))
            return drop_rate_refusal(self.name, self.drop_rate)
        payload = await read_payload(request, self.name, self.max_body_bytes)
        if isinstance(payload, JSONResponse):
            self._event(("d", time.time(), refusal_reason(payload)))
            return payload
        result = await run_model(self.model, self.name, payload)
        if isinstance(result, JSONResponse):
            self._event(("d", time.time(), "bad_request"))
            return result
        proc = result.get("processing_ms") if isinstance(result, dict) else None
        if proc is not None:
            self._event(("p", time.time(), proc / 1e3))
        return result

    @api.get("/metrics", summary="What the meter gathered for this model (JSON)")
    async def metrics_json(self):
        # a person looking must not reset the autoscaler's in-flight average
        return await self.meter.metrics.remote(reset_mean=False)

    def _event(self, ev: tuple) -> None:
        self.events.append(ev)
        if len(self.events) > MAX_EVENTS:
            del self.events[:len(self.events) - MAX_EVENTS]

    async def _report_loop(self) -> None:
        """Report once a second; the answer carries the drop rate in force."""
        source = f"replica-{serve.get_replica_context().replica_id.unique_id}"
        warned = False

        async def ingest(events):  # here, not at module level: Ray may ship this class by value
            return await self.meter.ingest.remote(source, {"events": events})

        while True:
            await asyncio.sleep(REPORT_S)
            events, self.events = self.events, []
            try:
                ans = await asyncio.wait_for(ingest(events), 10)
                self.drop_rate = float(ans.get("drop_rate", 0.0))
                warned = False
            except Exception as err:  # the meter restarts: keep the events for the next try
                self.events[:0] = events
                if not warned:
                    log.warning("cannot report to the meter of %s: %s", self.name, err)
                    warned = True


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
class Meter(FrontControl):
    """The front's control plane for the direct path: the reports of the proxy's router
    (arrivals, latencies, queue) and of the replicas (processing times, drops) merged into
    one :class:`~faro_serve.serving.stats.RouterStats`."""

    def __init__(self, name: str, percentile: float = 99.0):
        self._init_control(name, percentile)
        self._queues: dict[str, tuple[float, dict]] = {}  # router -> (time, its queue)

    def ingest(self, source: str, batch: dict) -> dict:
        now = time.time()
        st = self.stats
        for ev in sorted(batch.get("events", []), key=lambda e: e[1]):
            kind, t = ev[0], min(float(ev[1]), now)
            if kind == "a":
                st.arrival(now, t)
                st.started(t)
            elif kind == "f":  # at its own time: the look-back window is the simulator's
                st.finished(t)
                st.completed(t, float(ev[2]), None)
            elif kind == "x":  # queued, then given up (client gone): no answer to count
                st.finished(t)
            elif kind == "p":
                st.processed(now, float(ev[2]))
            elif kind == "d":
                st.drop(now, str(ev[2]))
        if "waiting" in batch:
            self._queues[source] = (now, {k: int(batch.get(k, 0))
                                          for k in ("waiting", "dispatched", "replicas")})
        return {"drop_rate": self.drop_rate}

    def _queue_state(self) -> dict:
        now = time.time()
        fresh = [q for t, q in self._queues.values() if now - t < 10 * REPORT_S]
        return {"waiting": sum(q["waiting"] for q in fresh),
                "dispatched": sum(q["dispatched"] for q in fresh),
                "dispatch_capacity": max((q["replicas"] for q in fresh), default=0)}
