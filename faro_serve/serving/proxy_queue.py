"""The model's queue kept in Ray Serve's proxy: the direct data path (paper section 5).

On the direct path the model deployment is the HTTP ingress, so a request makes one hop,
proxy -> replica, as on plain Ray Serve. :class:`ProxyQueueRouter`, a public
``ray.serve.request_router`` extension that Ray runs inside the proxy, keeps the paper's
FIFO queue there. A request goes to an idle replica if there is one; when every replica
is busy, the head of the queue goes to the replica whose running request started first
(with the paper's near-constant processing times, the one that frees first) and waits
there behind that one request: a replica serves one request at a time (its lock), and its
next request is already on it when it finishes, so it does not stay idle for the round
trip to the proxy and back (the *replica hold*, 15 ms on this machine without it). Past
``PIPELINE`` requests per replica the queue stays in the proxy: a routing call that finds
no replica with room waits for a completion instead of sleeping in Ray's retry backoff.
Ray's ``max_queued_requests`` bounds the queue (tail-drop).

With a proxy on every node (``proxy_location: EveryNode``) each proxy runs a router of its
own, with its own queue and its own counts: it does not see what the others sent. The
replica's ``max_ongoing_requests`` (Ray's strict bound: a replica at it refuses, and Ray asks
the router again) keeps :data:`PIPELINE` a hard bound whichever proxies sent the requests;
the queue length every replica answers with tells the router what the others hold there
(:meth:`ProxyQueueRouter.on_new_queue_len_info`), counted for about one service time, so a
refused replica is not asked again at once (docs/multinode.md, "A proxy on every node").

The router also measures what only the proxy sees: when each request arrived (Ray's
``created_at``) and when its answer left, i.e. the end-to-end latency. It reports these
events about once a second to the model's front control plane (``direct.Meter``), where
the replicas report processing times and drops. It reports from a thread of its own: a
handle call made on the router's event loop would wait for that same loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import threading
import time
from collections import deque

import ray
from ray import serve
from ray.serve.request_router import PendingRequest, RunningReplica

from ..measures import QUEUED_STALE_S, REPLICA_POLL_S, REPORT_S
from .messages import Answered, Arrival, Event, GaveUp, MeterAnswer, RouterReport, decode
from .names import METER  # the deployment, in the model's application, that the router reports to
from .routing import InFlightRouter

log = logging.getLogger("faro_serve.serving")
MAX_EVENTS = 100_000  # kept while the meter cannot be reached; past that the oldest go
PIPELINE = 2  # requests on a replica at most: the one it serves and the next one
# (a batching model's replica: two batches of the size in force, up to its max_ongoing_requests)
MAX_WAITING_REPORTED = 1000  # arrival times of waiting requests sent per report (batching models)


class ProxyQueueRouter(InFlightRouter):
    """At most :data:`PIPELINE` requests on a replica (counted as :class:`InFlightRouter`
    counts), idle replicas first; the others queued FIFO in the proxy."""

    def initialize_state(self, meter: str = METER, concurrency: int = 1, **kwargs):
        """``meter``: the deployment of the model's application to report to (a user's
        deployment under Faro has one of its own, ``user.py``); ``concurrency``: requests a
        replica serves at once (its ``max_ongoing_requests`` is one more: the next held)."""
        super().initialize_state(**kwargs)
        self._meter = meter
        self._concurrency = max(1, int(concurrency))
        self._arrived: dict[str, list] = {}  # request id -> [arrival time, last asked], until answered
        self._waiters: list[asyncio.Future] = []  # routing calls waiting for a free replica
        self.events: deque[Event] = deque(maxlen=MAX_EVENTS)  # Arrival, Answered, GaveUp (messages.py)
        self._reporter: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sent_at: dict[str, float] = {}  # request id -> when it was given its replica
        self._batch = 1  # the batch size in force (the meter's answer): PIPELINE batches a replica
        self._batch_model = False  # its replicas take more than PIPELINE: report queued arrivals
        # other proxies' requests on a replica, as its last queue length showed them:
        # replica id -> (count, monotonic time it stops counting)
        self._others: dict = {}
        self._service_s = 0.05  # a request's time on a replica (sent -> completed), smoothed
        self._told: dict = {}  # replica id -> (its last queue length, ours there then)
        self._accepted: set[str] = set()  # request ids a replica accepted (timed to completion)
        self._strict = False  # replicas answer each send with their queue length (Ray's strict bound)

    # -- routing -------------------------------------------------------------------------
    def update_replicas(self, replicas: list[RunningReplica]):
        super().update_replicas(replicas)
        self._sent_at = {r: t for r, t in self._sent_at.items() if r in self._given}
        self._accepted &= set(self._given)
        alive = {r.replica_id for r in replicas}
        self._others = {rid: v for rid, v in self._others.items() if rid in alive}
        self._told = {rid: v for rid, v in self._told.items() if rid in alive}
        self._wake(all_=True)  # new replicas: every waiting call looks again

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        self._start_reporting()
        if pending_request is None or pending_request.future.done():
            return [candidate_replicas]  # nothing to count: Ray moves on
        self._release_cancelled()
        req = pending_request.metadata.internal_request_id
        self._forget(req)  # asked again: the last choice was refused or not taken
        if req in self._arrived:
            self._arrived[req][1] = time.monotonic()
        else:
            self._arrived[req] = [pending_request.created_at, time.monotonic()]
            self._event(Arrival(pending_request.created_at))
        best = self.pick(candidate_replicas)
        if best is None:  # wait for a completion here, or for others' requests to be done
            until = min((t for _, t in self._others.values()), default=None)
            await self._wait_for_a_free_replica(
                REPLICA_POLL_S if until is None else min(REPLICA_POLL_S, max(0.002, until - time.monotonic()))
            )
            return []  # Ray asks again at once, with the replicas as they are now
        self._give(best, pending_request)
        self._sent_at[req] = time.monotonic()
        return [[best]]

    def pick(self, candidates: list[RunningReplica]) -> RunningReplica | None:
        """A replica with a free slot (the least loaded, at random among equals), else the
        one with room whose oldest request was sent first, i.e. is expected to finish
        first; None when all are full."""
        k = self._concurrency
        load = self._loads(candidates)
        free = [r for r in candidates if load[r.replica_id] < k]
        if free:
            least = min(load[r.replica_id] for r in free)
            return random.choice([r for r in free if load[r.replica_id] == least])
        bound = PIPELINE * self._batch if k == 1 else k + 1
        room = [r for r in candidates if load[r.replica_id] < min(bound, r.max_ongoing_requests)]
        if not room:
            return None
        oldest: dict = {}
        for req, (rid, _) in self._given.items():
            t = self._sent_at.get(req, 0.0)
            oldest[rid] = min(t, oldest.get(rid, t))
        return min(room, key=lambda r: oldest.get(r.replica_id, 0.0))

    def _loads(self, candidates: list[RunningReplica]) -> dict:
        """Requests on each replica: this router's, plus what other proxies' routers hold
        there as long as the replica's last queue length still counts."""
        now = time.monotonic()
        out = {}
        for r in candidates:
            n = self._load.get(r.replica_id, 0)
            other = self._others.get(r.replica_id)
            if other is not None:
                if other[1] > now:
                    n += other[0]
                else:
                    del self._others[r.replica_id]
            out[r.replica_id] = n
        return out

    def on_new_queue_len_info(self, replica_id, num_ongoing_requests: int):
        """Every send under Ray's strict bound comes back with the replica's queue length:
        what it holds beyond this router's requests, other proxies sent. At its bound it
        most likely refused this one (ours there then count it): taken as a refusal until
        :meth:`on_request_routed` says it was accepted (Ray calls the two back to back)."""
        super().on_new_queue_len_info(replica_id, num_ongoing_requests)
        self._strict = True  # Ray's strict bound is on: acceptance comes as on_request_routed
        n, ours = int(num_ongoing_requests), self._load.get(replica_id, 0)
        self._told[replica_id] = (n, ours)
        rep = self.curr_replicas.get(replica_id)
        if rep is not None and n >= rep.max_ongoing_requests:
            self._count_others(replica_id, max(1, n - (ours - 1)))

    def on_request_routed(self, pending_request, replica_id, result):
        """Accepted: the replica's count includes this request, as ours there does."""
        super().on_request_routed(pending_request, replica_id, result)
        self._accepted.add(pending_request.metadata.internal_request_id)
        told = self._told.pop(replica_id, None)
        if told is not None:
            self._count_others(replica_id, told[0] - told[1])

    def _count_others(self, replica_id, n: int) -> None:
        if n > 0:  # they finish within about a service time: count them that long
            self._others[replica_id] = (n, time.monotonic() + self._service_s)
        else:
            self._others.pop(replica_id, None)

    def _forget(self, req: str) -> None:
        super()._forget(req)
        self._sent_at.pop(req, None)

    async def _wait_for_a_free_replica(self, timeout_s: float = REPLICA_POLL_S) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait([fut], timeout=timeout_s)
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)

    def _wake(self, all_: bool = False) -> None:
        while self._waiters:
            fut = self._waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                if not all_:
                    return

    def on_request_completed(self, replica_id, internal_request_id):
        sent = self._sent_at.get(internal_request_id)
        if self._strict and internal_request_id not in self._accepted:
            # refused (another proxy filled the replica): Ray asks again for this request,
            # which still waits here; uncount it from that replica, nothing was answered
            given = self._given.get(internal_request_id)
            if given is not None and given[0] == replica_id:
                self._forget(internal_request_id)
            return
        if not self._completed(replica_id, internal_request_id):  # a refused earlier attempt
            return
        if internal_request_id in self._accepted:
            self._accepted.discard(internal_request_id)
            if sent is not None:
                self._service_s += 0.1 * (min(time.monotonic() - sent, 10.0) - self._service_s)
        arrived = self._arrived.pop(internal_request_id, None)
        if arrived is not None:
            now = time.time()
            self._event(Answered(now, now - arrived[0]))
        self._wake()

    def prune(self, stale_s: float = QUEUED_STALE_S) -> None:
        """Forget queued requests Ray stopped asking about: a waiting request is asked
        about at least every 0.1 s, so one silent for ``stale_s`` was cancelled by its
        client or failed with its replica, and must not count as waiting."""
        cutoff = time.monotonic() - stale_s
        for req in [r for r, (_, asked) in self._arrived.items() if asked < cutoff and r not in self._given]:
            del self._arrived[req]
            self._event(GaveUp(time.time()))  # the meter stops counting it in flight

    # -- reporting -----------------------------------------------------------------------
    def _event(self, ev: Event) -> None:
        self.events.append(ev)  # a deque: safe against the reporting thread's popleft

    def report(self) -> RouterReport:
        """What the router sends the meter: the events since the last report and its queue."""
        events = tuple(self.events.popleft() for _ in range(len(self.events)))
        serving = sum(min(n, self._concurrency) for n in self._load.values())  # requests in service
        return RouterReport(
            events=events,
            waiting=max(0, len(self._arrived) - serving),
            dispatched=serving,
            replicas=len(self.curr_replicas),
            # a batching model, Sponge's budgets: when each queued request arrived
            waiting_since=(tuple(self._queued_arrivals()[:MAX_WAITING_REPORTED]) if self._batch_model else None),
        )

    def _queued_arrivals(self) -> list[float]:
        """Arrival times of the requests not yet in service, oldest first: those waiting
        here, and those a replica holds behind the batch it serves (per replica, all but
        the ``batch`` sent to it first, which it is taken to be serving)."""
        arrived = dict(self._arrived)
        out = [t for r, (t, _) in arrived.items() if r not in self._given]
        held: dict = {}
        for req, (rid, _) in list(self._given.items()):
            held.setdefault(rid, []).append(req)
        for reqs in held.values():
            reqs.sort(key=lambda r: self._sent_at.get(r, 0.0))
            out += [arrived[r][0] for r in reqs[self._batch :] if r in arrived]
        return sorted(out)

    def _start_reporting(self) -> None:
        if self._reporter is None:
            self._loop = asyncio.get_running_loop()
            self._reporter = threading.Thread(
                target=self._report_loop, daemon=True, name=f"faro-report-{self.app_name}"
            )
            self._reporter.start()

    def _report_loop(self) -> None:
        # unique across proxies: each proxy's router reports its own queue
        meter, source, warned, refused = None, f"router-{socket.gethostname()}-{os.getpid()}-{id(self):x}", False, None
        while True:
            time.sleep(REPORT_S)
            if not ray.is_initialized():  # a driver that called the model and shut Ray down:
                return  # a handle call now would start a new Ray behind its back
            self._loop.call_soon_threadsafe(self.prune)  # on the router's loop, not here
            batch = self.report()
            try:
                if meter is None:
                    meter = serve.get_deployment_handle(self._meter, app_name=self.app_name)
                ans = decode(meter.ingest.remote(source, batch.wire()).result(timeout_s=10), MeterAnswer)
                if ans.refused != refused and ans.refused:  # a bug or another version: say it once
                    log.error("the meter of %s refused this router's report: %s", self.app_name, ans.refused)
                refused = ans.refused
                self._batch = max(1, ans.batch_in_force)
                self._batch_model = any(r.max_ongoing_requests > PIPELINE for r in list(self.curr_replicas.values()))
                warned = False
            except Exception as err:  # the meter restarts: keep the events for the next try
                self.events.extendleft(reversed(batch.events))
                meter = None
                if not warned:
                    log.warning("cannot report to the meter of %s: %s", self.app_name, err)
                    warned = True
