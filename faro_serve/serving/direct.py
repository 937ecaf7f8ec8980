"""The direct data path of one model: the router front's work without its hop (paper section 5).

With ``data_path: direct`` a model's application has

* :class:`DirectModel` as the HTTP ingress: each replica checks the body (413/400), drops
  the autoscaler's fraction of requests (503, reason ``drop_rate``) and runs the model;
* :class:`~faro_serve.serving.proxy_queue.ProxyQueueRouter` as its request router, in Ray
  Serve's proxy: the FIFO queue, one request per replica, arrival and latency measurement;
  Ray's ``max_queued_requests`` answers 503 past the queue limit (tail-drop);
* :class:`Meter`, deployed as the model's ``Meter``, off the data path: it merges what the
  router and the replicas report and offers the autoscaler the model's control plane.

What changes against the router front (docs/serving.md): a drop is decided when the request
leaves the queue, not on arrival; the tail-drop 503 is Ray's, with Ray's text body, and the
requests it refuses are not counted as arrivals; a replica that dies under a request gives
Ray's 500 instead of a retry.
"""

import asyncio
import logging
import random
import time
from collections import deque

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from ..measures import LOOK_BACK_S, NETWORK_S, REPORT_STALE_S
from .control import MeterControl
from .edf_gate import EDFGate
from .messages import (
    Answered,
    Arrival,
    Dropped,
    Event,
    GaveUp,
    MessageError,
    MeterAnswer,
    NetworkTime,
    Processed,
    ReplicaReport,
    RouterReport,
    decode,
)
from .names import NETWORK_HEADER
from .payload import answer, drop_rate_refusal, read_payload, refusal_reason, run_model, shutting_down
from .proxy_queue import MAX_EVENTS
from .replica_report import ReplicaReporter
from .uploads import Uploads

BATCH_TIMES_S = 600.0  # a batch curve measured live fits the last ten minutes' batches
BATCH_TIMES_KEPT = 200  # batches kept per size

log = logging.getLogger("faro_serve.serving")

api = FastAPI(
    title="faro-serve model endpoint (direct path)",
    description="Inference with Faro's drop control, tail-drop and metrics, served by the model replicas themselves.",
)


@serve.ingress(api)
class DirectModel:
    """A model replica as the HTTP ingress. With ``max_batch_size`` > 1 it serves dynamic
    batches through ``serve.batch`` (no wait for a batch to fill): the batch size in force,
    up to that maximum, and the model's threads are set by :meth:`reconfigure`, from the
    deployment's ``user_config`` or live from the autoscaler through the meter (issue 20)."""

    def __init__(
        self,
        meter,
        name: str,
        model_cls: type,
        model_kwargs: dict,
        max_body_bytes: int = 8 << 20,
        max_batch_size: int = 1,
        body_timeout_s: float | None = 5.0,
    ):
        self.meter = meter
        self.name = name
        self.body_timeout_s = body_timeout_s
        self.uploads = Uploads()  # bodies still arriving here (uploads.py)
        self.model = model_cls(**model_kwargs)
        self.max_body_bytes = max_body_bytes
        self.drop_rate = 0.0
        self.max_batch = int(max_batch_size)
        if self.max_batch > 1 and not hasattr(self.model, "predict_batch"):
            raise ValueError(
                f"{name}: max_batch_size {self.max_batch} needs a model that serves "
                f"batches (predict_batch); {model_cls.__name__} does not"
            )
        self.batch_size = 1
        self.threads: int | None = None
        self.held = self.held_peak = 0  # requests in this replica now, most since the last report
        self._batched.set_max_batch_size(1)
        self._gate = EDFGate(1)  # serve.batch alone batches only what arrives together (edf_gate.py)
        # Processed, Dropped, NetworkTime events (messages.py) to the meter, once a second;
        # started now to learn the drop rate from the start, not from the first request
        self.reporter = ReplicaReporter(meter, name, self._apply_answer, self._report_fields)
        self.reporter.start()

    def reconfigure(self, config: dict) -> None:
        """``{"batch_size": b, "threads": t, "variant": name}`` (any may be left out): the
        batch size in force (clipped to 1..max_batch_size), the model's threads, and for a
        task with variants the variant to serve (loaded beside the one in force, which
        answers until it is ready: serving/variant_model.py). Ray cannot resize a running
        replica's CPUs, so threads within the CPUs it reserved are the vertical scaling a
        replica has (Sponge's cores, autoscaler/policies/sponge.py)."""
        config = config or {}
        unknown = sorted(set(config) - {"batch_size", "threads", "variant"})
        if unknown:
            raise ValueError(
                f"{self.name}: unknown user_config keys {unknown}; expected batch_size, threads and variant"
            )
        b, t, v = config.get("batch_size"), config.get("threads"), config.get("variant")
        if b is not None:
            if not (isinstance(b, int) and b >= 1):
                raise ValueError(f"{self.name}: batch_size must be an integer >= 1 (got {b!r})")
            self.batch_size = min(b, self.max_batch)
            self._batched.set_max_batch_size(self.batch_size)
            self._gate.batch_size = self.batch_size
        if t is not None and t != self.threads:
            if not hasattr(self.model, "set_threads"):
                raise ValueError(f"{self.name}: this model has no thread count to set")
            self.model.set_threads(t)
            self.threads = t
        if v is not None:
            if not hasattr(self.model, "switch"):
                raise ValueError(f"{self.name}: this model has no variants")
            self.model.switch(str(v))

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def _batched(self, payloads: list[bytes]) -> list:
        if asyncio.iscoroutinefunction(self.model.predict_batch):
            return await self.model.predict_batch(payloads)
        return await asyncio.to_thread(self.model.predict_batch, payloads)

    @api.post(
        "/predict",
        summary="Run the model on one request",
        description='Body: JPEG/PNG bytes, or JSON {"image": base64}. 503 when the '
        "autoscaler drops the request or the queue is full.",
    )
    async def predict(self, request: Request):
        if not self.reporter.admit():  # a shutdown drains this model (drain.py)
            self._event(Dropped(time.time(), "shutting_down"))
            return shutting_down(self.name)
        self.held += 1  # what the proxies' routers put here: PIPELINE at most (docs/multinode.md)
        self.held_peak = max(self.held_peak, self.held)
        try:
            return await self._predict(request)
        finally:
            self.held -= 1
            self.reporter.release()

    async def _predict(self, request: Request):
        self.reporter.start()
        arrived, net_s = time.time(), 0.0
        net = request.headers.get(NETWORK_HEADER)
        if net is not None:  # the client's network time: Sponge's budgets start below the SLO
            try:
                net_s = float(net) / 1e3
                if not 0 <= net_s <= 3600:
                    raise ValueError
            except ValueError:
                self._event(Dropped(time.time(), "bad_request"))
                return JSONResponse(
                    {
                        "error": f"{NETWORK_HEADER} must be milliseconds between 0 and 3600000 (got {net[:40]!r})",
                        "reason": "bad_request",
                        "model": self.name,
                    },
                    status_code=400,
                )
            if self.max_batch > 1:
                self._event(NetworkTime(time.time(), net_s))
        if self.drop_rate > 0 and random.random() < self.drop_rate:
            self._event(Dropped(time.time(), "drop_rate"))
            return drop_rate_refusal(self.name, self.drop_rate)
        payload = await read_payload(request, self.name, self.max_body_bytes, self.body_timeout_s, self.uploads)
        if isinstance(payload, JSONResponse):
            self._event(Dropped(time.time(), refusal_reason(payload)))
            return payload
        if self.max_batch > 1:  # EDF: the deadline is when it left its client
            async with self._gate.slot(arrived - net_s):
                result = answer(await self._batched(payload), self.name)
        else:
            result = await run_model(self.model, self.name, payload)
        if isinstance(result, JSONResponse):
            self._event(Dropped(time.time(), refusal_reason(result)))
            return result
        proc = result.get("processing_ms") if isinstance(result, dict) else None
        if proc is not None:  # a batch's time comes with its size (the planner divides it out)
            self._event(
                Processed(time.time(), proc / 1e3)
                if self.max_batch <= 1
                else Processed(time.time(), proc / 1e3, int(result.get("batch", 1)))
            )
        return result

    @api.get("/metrics", summary="What the meter gathered for this model (JSON)")
    async def metrics_json(self):
        # a person looking must not reset the autoscaler's in-flight average
        return await self.meter.metrics.remote(reset_mean=False)

    def _event(self, ev: Event) -> None:
        self.reporter.event(ev)

    def _report_fields(self) -> dict:
        batching = self.max_batch > 1
        peak, self.held_peak = self.held_peak, self.held
        device = getattr(self.model, "device", None)
        return {
            "held_peak": peak,
            "batch_size": self.batch_size if batching else None,
            "threads": self.threads if batching else None,
            "variant": self.model.current if hasattr(self.model, "switch") else None,
            "device": None if device is None else str(device),
        }

    def _apply_answer(self, ans: MeterAnswer) -> None:
        """The drop rate in force, and what the autoscaler set where it set anything and
        this replica has it."""
        self.drop_rate = ans.drop_rate
        keys = (
            (("batch_size",) if self.max_batch > 1 else ())
            + (("threads",) if self.max_batch > 1 and hasattr(self.model, "set_threads") else ())
            + (("variant",) if hasattr(self.model, "switch") else ())
        )
        want = {k: getattr(ans, k) for k in keys if getattr(ans, k) is not None}
        if want:
            self.reconfigure(want)


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=1000)
class Meter(MeterControl):
    """The front's control plane for the direct path: the reports of the proxy's router
    (arrivals, latencies, queue) and of the replicas (processing times, drops) merged into
    one :class:`~faro_serve.serving.stats.MeterStats`."""

    def __init__(self, name: str, percentile: float = 99.0, replica_cpus: float | None = None):
        self._init_control(name, percentile, replica_cpus)
        self._queues: dict[str, tuple[float, RouterReport]] = {}  # router -> (time, its last report)
        self._batching: dict[str, tuple[float, int, int | None]] = {}  # replica -> (time, batch, threads)
        self._batches: deque[tuple[float, int]] = deque(maxlen=MAX_EVENTS)  # (time, batch) per request
        # per batch size, its recent batch times (per request: a batch of b appends b):
        # the points a batch curve measured live is fitted to (autoscaler/policies/service.py)
        self._batch_times: dict[int, deque[tuple[float, float]]] = {}
        self._devices: dict[str, tuple[float, str]] = {}  # replica -> (time, its device)
        self._variants: dict[str, tuple[float, str]] = {}  # replica -> (time, variant in force)
        self._network: deque[tuple[float, float]] = deque(maxlen=MAX_EVENTS)  # (time, network s)
        self.refused = 0  # reports refused (malformed): logged, then the next one is read
        self.held_max: int | None = None  # most requests one replica held at once (its reports)
        self._drains: dict[str, tuple[float, bool, int]] = {}  # replica -> (time, draining, busy)

    def ingest(self, source: str, raw: dict) -> dict:
        """Merge one report (messages.py: a router's or a replica's); the answer is a
        :class:`~faro_serve.serving.messages.MeterAnswer`. A report that breaks its schema is
        refused whole, logged and named in the answer; the meter carries on with the next."""
        try:
            report = decode(raw, RouterReport, ReplicaReport)
        except MessageError as err:
            self.refused += 1
            log.error("meter of %s: refused a report from %s: %s", self.name, source, err)
            return self._answer(str(err))
        now = time.time()
        st = self.stats
        for ev in sorted(report.events, key=lambda e: e.t):
            t = min(ev.t, now)
            match ev:
                case Arrival():
                    st.arrival(now, t)
                    st.started(t)
                case Answered():  # at its own time: the look-back window is the simulator's
                    st.finished(t)
                    st.completed(t, ev.latency_s, None)
                case GaveUp():  # queued, then given up (client gone): no answer to count
                    st.finished(t)
                case Processed():
                    st.processed(now, ev.processing_s)
                    if ev.batch is not None:  # a batching replica: the size of the batch it timed
                        self._batches.append((now, ev.batch))
                        self._batch_times.setdefault(ev.batch, deque(maxlen=BATCH_TIMES_KEPT * ev.batch)).append(
                            (now, ev.processing_s)
                        )
                case Dropped():
                    st.drop(now, ev.reason)
                case NetworkTime():  # a client's network time, as its request declared it
                    self._network.append((now, ev.network_s))
        if isinstance(report, RouterReport):
            self._queues[source] = (now, report)
        else:
            if report.held_peak is not None:
                self.held_max = max(self.held_max or 0, report.held_peak)
            if report.batch_size is not None:
                self._batching[source] = (now, report.batch_size, report.threads)
            if report.variant is not None:
                self._variants[source] = (now, report.variant)
            if report.device is not None:
                self._devices[source] = (now, report.device)
            if report.busy is not None:
                self._drains[source] = (now, bool(report.draining), report.busy)
        return self._answer()

    def _answer(self, refused: str | None = None) -> dict:
        return MeterAnswer(
            drop_rate=self.drop_rate,
            batch_in_force=self._batch_in_force(),
            batch_size=self.batch_size,
            threads=self.threads,
            variant=self.variant,
            refused=refused,
            draining=self.draining_since is not None,
        ).wire()

    def drain_state(self) -> dict:
        """The replicas' last reports (fresh ones): a replica counts as told once a report
        sent after the drain began says it refuses new requests."""
        now, since = time.time(), self.draining_since
        reps = [(t, d, b) for t, d, b in self._drains.values() if now - t < REPORT_STALE_S]
        routers = [q for t, q in self._queues.values() if now - t < REPORT_STALE_S]
        return {
            "model": self.name,
            "draining": since is not None,
            "replicas": len(reps),
            "told": sum(1 for t, d, _ in reps if d and since is not None and t >= since),
            "busy": sum(b for _, _, b in reps),
            "queued": sum(q.waiting + q.dispatched for q in routers),
        }

    def _batch_in_force(self) -> int:
        """The autoscaler's batch size, else the largest the replicas report (their
        user_config), else 1: the proxy's router lets a replica hold two such batches."""
        if self.batch_size is not None:
            return self.batch_size
        now = time.time()
        fresh = [b for t, b, _ in self._batching.values() if now - t < REPORT_STALE_S]
        return max(fresh, default=1)

    def _batch_rows(self, now: float) -> list[list[float]]:
        """Per batch size served in the last :data:`BATCH_TIMES_S`: [size, batches, median
        time s] (a batch's requests each report its time: batches = reports / size)."""
        rows = []
        for b in sorted(self._batch_times):
            q = self._batch_times[b]
            while q and q[0][0] < now - BATCH_TIMES_S:
                q.popleft()
            if q:
                times = sorted(t for _, t in q)
                rows.append([float(b), len(times) / b, times[len(times) // 2]])
        return rows

    def _recent_network(self, now: float) -> float:
        """The network time of the requests that arrived in the last :data:`NETWORK_S`
        (their median), 0 with none: what a queued request most likely spent before it
        came. Ray's router API shows the proxy's queue neither a request's headers nor
        lets it choose which waiting request a freed replica takes, so a queued request's
        own network time is not known there; its neighbours' is (Sponge's bandwidth changes
        over seconds)."""
        while self._network and self._network[0][0] < now - NETWORK_S:
            self._network.popleft()
        if not self._network:
            return 0.0
        vals = sorted(v for _, v in self._network)
        return vals[len(vals) // 2]

    def _queue_state(self) -> dict:
        now = time.time()
        fresh = [q for t, q in self._queues.values() if now - t < REPORT_STALE_S]
        out = {
            "waiting": sum(q.waiting for q in fresh),  # each proxy's router keeps a queue
            "dispatched": sum(q.dispatched for q in fresh),
            "dispatch_capacity": max((q.replicas for q in fresh), default=0),
            "routers": len(fresh),
            "replica_held_max": self.held_max,
        }
        if self._batching:  # a batching model: what Sponge needs (queued waits, batch, threads)
            wall = time.time()
            net = self._recent_network(now)
            out["network_ms"] = round(net * 1e3, 3)
            out["queued_ages_s"] = sorted(max(0.0, wall - t) + net for q in fresh for t in q.waiting_since or ())
            reps = [(b, th) for t, b, th in self._batching.values() if now - t < REPORT_STALE_S]
            out["batch_size"] = max((b for b, _ in reps), default=None)
            out["threads"] = max((th for _, th in reps if th is not None), default=None)
            while self._batches and self._batches[0][0] < now - LOOK_BACK_S:
                self._batches.popleft()
            sizes = [b for _, b in self._batches]
            out["mean_batch"] = sum(sizes) / len(sizes) if sizes else 1.0
            out["batch_times"] = self._batch_rows(now)
        devices = sorted({d for t, d in self._devices.values() if now - t < REPORT_STALE_S})
        if devices:
            out["device"] = ",".join(devices)
        serving = sorted(v for t, v in self._variants.values() if now - t < REPORT_STALE_S)
        if serving:  # a task with variants: the one its replicas serve (all of them, once switched)
            out["variant"] = serving[0] if len(set(serving)) == 1 else ",".join(sorted(set(serving)))
        return out
